"""The PostgreSQL table source: :class:`PostgresTableSource` describes the table and
its split, and a :class:`PostgresTableReader` reads one key range.

A snapshot read of ``table`` split by ranges of its integer, unique ``key`` column:
:meth:`~PostgresTableSource.partitions` reads ``min(key)`` and ``max(key)`` and cuts
``[min, max + 1)`` into ``partitions`` ranges of equal width named
``"<table>[lo,hi)"``. The names carry the ranges, so the split is fixed when the job
is built (rows added beyond ``max`` afterwards are not read; the source does not
look again). Each range's reader pages through it ordered by the key (``WHERE key >=
next AND key < hi ORDER BY key LIMIT page``); its position is the last key it
returned (None: none yet) and a seek resumes after it. Records: dicts column ->
value, or what the ``row`` function makes of such a dict. Each page is read
committed: rows written into a range while it is read may or may not be seen (a
table not written during the job is read exactly once).

Losing the server: a page that fails with a connection error returns an empty batch;
the reader reconnects with exponential backoff (:data:`RETRY_MIN_S` to
:data:`RETRY_MAX_S`) and says why in :attr:`PostgresTableReader.stalled`. Nothing
is lost: it reads again after its last key.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from runtime.io import PartitionedSource, SourceReader

from .common import _columns_of, _connect, _identifier, _no_table, _settings, _unique_on, server_of

__all__ = ["PostgresTableReader", "PostgresTableSource"]

logger = logging.getLogger(__name__)

RETRY_MIN_S = 0.05  # first wait after a failed page; doubles up to RETRY_MAX_S
RETRY_MAX_S = 5.0  # longest wait between two attempts to reach a lost server
PAGE_ROWS = 5_000  # most rows a reader asks for in one query

_RANGE = re.compile(r"\[(-?\d+),(-?\d+)\)")


@dataclass(frozen=True, kw_only=True)
class PostgresTableSource(PartitionedSource):
    """Rows of ``table`` in ``partitions_count`` ranges of its integer unique ``key``
    column; see the module docstring. The split is fixed when the job is built (the
    partitions' names carry their ranges; rows beyond the maximum key then are not read).
    ``columns``: those read (empty: all); ``row``: dict -> record (None: the dict);
    ``page``: most rows per query."""

    dsn: str
    table: str
    key: str
    partitions_count: int = 4
    columns: tuple[str, ...] = ()
    row: Callable[[dict[str, Any]], Any] | None = None
    page: int = PAGE_ROWS

    bounded = True
    discovery_interval_s = None  # the split is fixed when the job is built

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _settings(owner, self.dsn)
        object.__setattr__(self, "columns", tuple(self.columns))
        if not self.table or not self.key:
            raise ValueError(f"{owner} needs a table and its integer key column")
        for field in ("partitions_count", "page"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{owner}.{field} must be an integer >= 1, got {value!r}")
        if self.row is not None and not callable(self.row):
            raise ValueError(f"{owner}.row must be a function dict -> record, got {self.row!r}")

    def partitions(self) -> list[str]:
        """``partitions_count`` ranges of equal width over ``[min(key), max(key) + 1)``
        (fewer if the keys span fewer values; none for an empty table). Raises
        :class:`ConnectionError` naming the server when it cannot be reached and
        :class:`ValueError` for a missing table or a key that is not an integer unique
        column."""
        owner, server = type(self).__name__, server_of(self.dsn)
        try:
            conn = _connect(self.dsn)
        except psycopg.Error as exc:
            raise ConnectionError(f"cannot reach PostgreSQL at {server}: {exc}") from exc
        try:
            found = _columns_of(conn, self.table)
            if found is None:
                raise _no_table(owner, self.table, server, f"create it or fix {owner}.table")
            if self.key not in found:
                raise ValueError(
                    f"{owner}: table {self.table!r} has no column {self.key!r} "
                    f"(it has {', '.join(found)}): fix {owner}.key"
                )
            if not _unique_on(conn, self.table, [self.key]):
                raise ValueError(
                    f"{owner}: table {self.table!r}, column {self.key!r} is not unique (no "
                    f"primary key or unique index on it alone): page by a unique column"
                )
            low, high = conn.execute(
                sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(
                    sql.Identifier(self.key), _identifier(self.table)
                )
            ).fetchone()  # type: ignore[misc]
        except psycopg.OperationalError as exc:
            raise ConnectionError(f"cannot read table {self.table!r} at {server}: {exc}") from exc
        except psycopg.Error as exc:  # no privilege, for one
            raise ValueError(
                f"{owner}: cannot read table {self.table!r} at {server}: {exc}"
            ) from exc
        finally:
            conn.close()
        if low is None:
            return []
        if not isinstance(low, int) or isinstance(low, bool):
            raise ValueError(
                f"{owner}: table {self.table!r}, column {self.key!r} holds "
                f"{type(low).__name__} values: the key must be an integer column"
            )
        width = high + 1 - low
        n = min(self.partitions_count, width)
        bounds = [low + width * i // n for i in range(n + 1)]
        return [f"{self.table}[{lo},{hi})" for lo, hi in itertools.pairwise(bounds)]

    def open_partition(self, partition: str, start_time: float) -> PostgresTableReader:
        table, bracket, rest = partition.rpartition("[")
        match = _RANGE.fullmatch(bracket + rest)
        if table != self.table or match is None:
            raise ValueError(
                f"{type(self).__name__} of table {self.table!r} has no partition "
                f"{partition!r} (partitions are named '{self.table}[lo,hi)')"
            )
        return PostgresTableReader(self, partition, int(match[1]), int(match[2]))


class PostgresTableReader(SourceReader):
    """Reads one key range ``[lo, hi)``; see the module docstring. It reaches the server
    at its first poll (not when opened)."""

    def __init__(self, source: PostgresTableSource, partition: str, lo: int, hi: int) -> None:
        self._source = source
        self._partition = partition
        self._lo, self._hi = lo, hi
        self._last: int | None = None
        self._ended = False  # a page came back short: the range is read
        self._conn: psycopg.Connection | None = None
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic() before which it does not try again
        self.stalled: str | None = None
        """Why it cannot read now (the server lost), None while reads succeed."""
        names = source.columns
        if names and source.key not in names:
            names = (*names, source.key)
        self._query = sql.SQL(
            "SELECT {} FROM {} WHERE {} >= %s AND {} < %s ORDER BY {} LIMIT %s"
        ).format(
            sql.SQL(", ").join(map(sql.Identifier, names)) if names else sql.SQL("*"),
            _identifier(source.table),
            *[sql.Identifier(source.key)] * 3,
        )

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._ended:
            return None
        if time.monotonic() < self._retry_at:
            return [], []
        start = self._lo if self._last is None else self._last + 1
        limit = max(1, min(max_records, self._source.page))
        try:
            if self._conn is None or self._conn.closed:
                self._conn = _connect(self._source.dsn)
            cursor = self._conn.cursor(row_factory=dict_row)
            rows = cursor.execute(self._query, (start, self._hi, limit)).fetchall()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._lost(exc)
            return [], []
        except psycopg.Error as exc:
            raise ValueError(
                f"cannot read partition {self._partition!r} at {server_of(self._source.dsn)}: {exc}"
            ) from exc
        if self.stalled is not None:
            logger.info("%s: read again", self._partition)
        self._failures, self.stalled = 0, None
        self._ended = len(rows) < limit
        if not rows:
            return None
        self._last = rows[-1][self._source.key]
        make = self._source.row
        values = [make(r) for r in rows] if make is not None else rows
        return values, [now] * len(values)

    def _lost(self, exc: Exception) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        delay = min(RETRY_MIN_S * 2**self._failures, RETRY_MAX_S)
        self._failures += 1
        self._retry_at = time.monotonic() + delay
        server = server_of(self._source.dsn)
        if self.stalled is None:
            logger.warning("%s at %s: cannot read (%s); retrying", self._partition, server, exc)
        self.stalled = f"cannot reach PostgreSQL at {server}: {exc}"

    def next_due(self, now: float) -> float:
        wait = self._retry_at - time.monotonic()
        return now + wait if wait > 0 else now

    def position(self) -> int | None:
        """The last key returned (None: none yet)."""
        return self._last

    def seek(self, position: Any) -> None:
        if position is not None and (not isinstance(position, int) or isinstance(position, bool)):
            raise ValueError(
                f"a PostgreSQL table position is the last key read (an integer) "
                f"or None, got {position!r}"
            )
        self._last = position
        self._ended = False

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
