"""What the PostgreSQL sink and source share: connections made from a libpq DSN (the
settings in :mod:`connectors.postgres`), and the catalog lookups that check a table.

A DSN that is not a libpq connection string is a :class:`ValueError` that does not echo
it (it may hold a password); :func:`server_of` names a server in messages as
``host:port/dbname``. :func:`_connect` makes an autocommit connection (transactions are
explicit), failing after :data:`CONNECT_TIMEOUT_S` unless the DSN sets its own
``connect_timeout``; it and the lookups raise psycopg's errors, which the callers turn
into the package's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

__all__ = ["server_of"]

CONNECT_TIMEOUT_S = 2  # an unreachable server fails a connection (and blocks its task) this
# long at most, unless the DSN sets its own connect_timeout (whole seconds, libpq's minimum)


def _settings(owner: str, dsn: str) -> dict[str, Any]:
    """The DSN's settings; ValueError (not echoing the DSN: it may hold a password)."""
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ValueError(
            f"{owner}.dsn is not a libpq connection string: write 'host=... port=... "
            f"dbname=... user=...' or 'postgresql://user@host:port/dbname'"
        ) from None


def server_of(dsn: str) -> str:
    """``host:port/dbname`` of ``dsn``, for messages (no password, no other setting)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(an invalid DSN)"
    host = params.get("host") or params.get("hostaddr") or "the local socket"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or params.get('user') or ''}"


def _connect(dsn: str) -> psycopg.Connection:
    """An autocommit connection (transactions are explicit); raises psycopg's errors."""
    if "connect_timeout" in conninfo_to_dict(dsn):
        return psycopg.connect(dsn, autocommit=True)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)


def _identifier(table: str) -> sql.Identifier:
    """``table`` or ``schema.table`` quoted."""
    return sql.Identifier(*table.split("."))


def _columns_of(conn: psycopg.Connection, table: str) -> dict[str, tuple[bool, bool]] | None:
    """Column -> (NOT NULL, has a default or is generated) of ``table``; None if no such
    table."""
    rows = conn.execute(
        "SELECT attname, attnotnull, atthasdef OR attidentity <> '' OR attgenerated <> ''"
        " FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        (_identifier(table).as_string(conn),),
    ).fetchall()
    return {name: (not_null, default) for name, not_null, default in rows} or None


def _unique_on(conn: psycopg.Connection, table: str, columns: Sequence[str]) -> bool:
    """Whether ``table`` has a unique index (or primary key) on exactly ``columns``."""
    found = conn.execute(
        "SELECT 1 FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique"
        " AND i.indpred IS NULL AND i.indexprs IS NULL"
        " AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a"
        "      WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) = %s::text[]",
        (_identifier(table).as_string(conn), sorted(columns)),
    ).fetchone()
    return found is not None


def _no_table(owner: str, table: str, server: str, fix: str) -> ValueError:
    return ValueError(f"{owner}: table {table!r} does not exist in {server}: {fix}")
