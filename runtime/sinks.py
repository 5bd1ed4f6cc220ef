"""Sinks: :class:`Collect` writes JSON-lines part files (for verification), :class:`Null`
discards.

Collect
    Sink task ``i`` writes ``{path}/part-{i}.jsonl``, one JSON document per line (tuples
    become lists; dict keys become strings). The directory is created if missing and part
    files are opened for appending, so a task reopened after a restart or rescale never
    erases what an earlier task wrote: use a fresh directory per run.

    ``mode="all"`` writes every record, buffered, and flushes at :meth:`close`.
    ``mode="last"`` keeps only the latest record per ``key(record)`` in memory and writes
    them (in order of each key's first appearance) at :meth:`close`. ``key`` must be a
    picklable module-level callable returning a hashable value.

    Exactly-once through failures: at a checkpoint a writer flushes and fsyncs its part
    file and reports its length (and, ``mode="last"``, its latest records); recovered
    from that checkpoint it truncates the file back to that length, so that what it wrote
    after the checkpoint, which the sources replay, is not there twice.

:func:`read_parts` reads every part file of a directory back, in part-index order.

Errors: invalid parameters raise :class:`ValueError` naming the field; a failure to
create, write or close a part file raises :class:`OSError` naming the file; a record
that JSON cannot encode raises :class:`TypeError` naming the file.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .io import Sink, SinkWriter

__all__ = ["Collect", "CollectWriter", "Null", "NullWriter", "read_parts"]

logger = logging.getLogger(__name__)

_BUFFER_BYTES = 1 << 16
"""Write buffer of a part file; "all" mode writes reach the disk in blocks of this size."""

_PART = re.compile(r"part-(\d+)\.jsonl")
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True)
class Collect(Sink):
    """Write records to ``path/part-{index}.jsonl``; see the module docstring."""

    path: str
    mode: Literal["all", "last"] = "all"
    key: Callable[[Any], Hashable] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ValueError(f"Collect.path must be a directory path, got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.mode not in ("all", "last"):
            raise ValueError(f"Collect.mode must be 'all' or 'last', got {self.mode!r}")
        if self.mode == "last" and not callable(self.key):
            raise ValueError(
                f"Collect.key must be a callable (record -> key) when mode='last', got {self.key!r}"
            )
        if self.mode == "all" and self.key is not None:
            raise ValueError("Collect.key is only used with mode='last'; drop it or set mode")

    def open(self, index: int, parallelism: int) -> CollectWriter:
        return CollectWriter(Path(self.path) / f"part-{index}.jsonl", self.mode, self.key)


class CollectWriter(SinkWriter):
    """Appends to one part file; opened (and the directory created) on construction."""

    def __init__(self, file: Path, mode: str, key: Callable[[Any], Hashable] | None = None) -> None:
        self._path = file
        self._key = key
        self._latest: dict[Hashable, Any] | None = {} if mode == "last" else None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(file, "a", encoding="utf-8", buffering=_BUFFER_BYTES)  # noqa: SIM115
        except OSError as exc:
            raise self._error("cannot open", exc) from exc

    def _error(self, what: str, exc: OSError) -> OSError:
        return OSError(exc.errno, f"{what} collect part {self._path}: {exc.strerror}")

    def _append(self, values: Iterable[Any]) -> None:
        try:
            text = "".join([_encode(v) + "\n" for v in values])
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cannot write a record to {self._path} as JSON: {exc}") from exc
        try:
            self._file.write(text)
        except OSError as exc:
            raise self._error("cannot write", exc) from exc

    def write(self, values: list) -> None:
        if self._latest is None:
            self._append(values)
            return
        latest, key = self._latest, self._key
        for value in values:
            latest[key(value)] = value  # type: ignore[misc]

    def snapshot(self) -> dict[str, Any]:
        """The part file's length once flushed and fsync'd (and the latest records)."""
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            state: dict[str, Any] = {"bytes": os.fstat(self._file.fileno()).st_size}
        except OSError as exc:
            raise self._error("cannot sync", exc) from exc
        if self._latest is not None:
            state["latest"] = pickle.dumps(self._latest, protocol=5)
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Truncate the part file back to its length at the checkpoint (and take back its
        latest records); raises :class:`OSError` if the file is shorter than that (it was
        changed outside the job)."""
        length = int(state["bytes"])
        try:
            self._file.flush()
            size = os.fstat(self._file.fileno()).st_size
            if size < length:
                raise OSError(
                    errno.EIO,
                    f"is {size} bytes, shorter than the {length} it had at the checkpoint "
                    "(changed outside the job?)",
                )
            os.truncate(self._path, length)
        except OSError as exc:
            raise self._error("cannot restore", exc) from exc
        if self._latest is not None and "latest" in state:
            self._latest = pickle.loads(state["latest"])

    def abort(self) -> None:
        """Stopped before its end: flush what is buffered and close the file, writing no
        final results (``mode="last"``: its latest records stay unwritten). The file is
        closed here and now, not when the writer is collected: a recovery that follows
        truncates it back to its checkpointed length, and nothing buffered may land
        after that."""
        if self._file.closed:
            return
        try:
            self._file.close()
        except OSError as exc:
            raise self._error("cannot close", exc) from exc

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._latest is not None:
                self._append(self._latest.values())
            self._file.close()
        except OSError as exc:
            raise self._error("cannot close", exc) from exc
        finally:
            if not self._file.closed:
                self._file.close()


@dataclass(frozen=True)
class Null(Sink):
    """Discard every record (for throughput runs)."""

    def open(self, index: int, parallelism: int) -> NullWriter:
        return NullWriter()


class NullWriter(SinkWriter):
    def write(self, values: list) -> None:
        pass


def read_parts(path: str | os.PathLike[str]) -> list:
    """All records of the part files in directory ``path``, part by part (by index).

    Raises :class:`FileNotFoundError` if ``path`` is not a directory and
    :class:`ValueError` naming the file and line of a line that is not JSON.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"no collect directory {directory}")
    parts = []
    for file in directory.iterdir():
        match = _PART.fullmatch(file.name)
        if match:
            parts.append((int(match.group(1)), file))
    records = []
    for _, file in sorted(parts):
        with file.open(encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{file}, line {line_no}: not valid JSON ({exc.msg})"
                    ) from None
    return records
