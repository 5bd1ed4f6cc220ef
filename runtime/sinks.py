"""Sinks: :class:`Collect` writes JSON-lines part files (for verification), :class:`Null`
discards.

Collect
    Sink task ``i`` writes JSON-lines files named ``part-{i}...jsonl`` into directory
    ``path``, one JSON document per line (tuples become lists; dict keys become strings).
    The directory is created if missing; files are never erased by a new writer, so use a
    fresh directory per run. :func:`read_parts` reads what is visible, in order.

    ``mode="all"`` writes every record, buffered. ``mode="last"`` keeps only the latest
    record per ``key(record)`` in memory and writes them (in order of each key's first
    appearance) at the end of the stream. ``key`` must be a picklable module-level
    callable returning a hashable value.

    Without checkpoints, task ``i`` appends to ``part-{i}.jsonl`` as records come.
    With checkpoints, its output is exactly once and read-committed, like Flink's file
    sink (two-phase commit, :class:`~runtime.io.SinkWriter`):

    - records go to a hidden in-progress file ``_pending/part-{i}.{token}.inprogress``;
    - at a checkpoint's barrier ``c`` (or the barrier of a reconfiguration that moves or
      removes the task, with, ``mode="last"``, its latest records) it is fsync'd and
      renamed ``_pending/part-{i}-{c}.jsonl``;
    - when checkpoint ``c`` completes, every pending file of the directory with a
      barrier id up to ``c`` is renamed to ``part-{i}-{c}.jsonl`` beside the others
      (a rename: atomic, and idempotent between the writers that race to do it);
    - at the end of the stream, the writer's last records go straight to
      ``part-{i}-{c}-end.{token}.jsonl`` (``c`` its last checkpoint) and every pending file is
      made visible: the input is over;
    - recovered from checkpoint ``c``, a writer makes visible what was pending up to
      ``c`` and deletes the files of its own index (and of indexes past the restored
      parallelism: tasks that did not exist at ``c``) that came after ``c``, pending or
      not: the sources replay those records. So a reader never sees a record twice,
      nor one a recovery undid, except in one case: the final records of a task whose
      input ended are visible at once, and a recovery of the rest of the job, before
      it finishes, takes them back and writes them again.

Errors: invalid parameters raise :class:`ValueError` naming the field; a failure to
create, write, sync, rename or close a part file raises :class:`OSError` naming the
file; a record that JSON cannot encode raises :class:`TypeError` naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import secrets
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from .durable import fsync_dir
from .io import Sink, SinkWriter

__all__ = ["Collect", "CollectWriter", "Null", "NullWriter", "read_parts"]

logger = logging.getLogger(__name__)

_BUFFER_BYTES = 1 << 16
"""Write buffer of a part file; "all" mode writes reach the disk in blocks of this size."""

_PENDING_DIR = "_pending"
_IN_PROGRESS = ".inprogress"
_VISIBLE_NAME = re.compile(r"part-(\d+)(?:-(\d+)(-end\.[0-9a-f]+)?)?\.jsonl")
_PENDING_NAME = re.compile(r"part-(\d+)-(\d+)()\.jsonl")
_IN_PROGRESS_NAME = re.compile(r"part-(\d+)\.[0-9a-f]+\.inprogress")
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(frozen=True)
class Collect(Sink):
    """Write records to ``path/part-{index}.jsonl``; see the module docstring."""

    path: str
    mode: Literal["all", "last"] = "all"
    key: Callable[[Any], Hashable] | None = None

    exactly_once = True  # with checkpoints: two-phase, read-committed (module docstring)

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
        return CollectWriter(Path(self.path), index, parallelism, self.mode, self.key)


class CollectWriter(SinkWriter):
    """Writes task ``index``'s part files into ``directory`` (module docstring); the
    directory is created on construction, files when records come."""

    def __init__(
        self,
        directory: Path,
        index: int,
        parallelism: int,
        mode: str = "all",
        key: Callable[[Any], Hashable] | None = None,
    ) -> None:
        self._dir = directory
        self._pending = directory / _PENDING_DIR
        self._index = index
        self._parallelism = parallelism
        self._key = key
        self._latest: dict[Hashable, Any] | None = {} if mode == "last" else None
        self._transactional = False
        self._token = secrets.token_hex(6)  # names this writer's files apart from others'
        self._path = directory / f"part-{index}.jsonl"  # the file being written
        self._file: TextIO | None = None
        self._closed = False
        self._last = 0  # the barrier id of its last prepare (or of the restored checkpoint)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._error("cannot create the directory of", exc) from exc

    def _error(self, what: str, exc: OSError, path: Path | None = None) -> OSError:
        return OSError(exc.errno, f"{what} collect part {path or self._path}: {exc.strerror}")

    # -- writing -----------------------------------------------------------------------

    def transactional(self) -> None:
        self._transactional = True
        self._path = self._pending / f"part-{self._index}.{self._token}{_IN_PROGRESS}"
        try:
            self._pending.mkdir(exist_ok=True)
        except OSError as exc:
            raise self._error("cannot create the directory of", exc) from exc

    def _open(self) -> TextIO:
        if self._file is None:
            try:
                self._file = open(self._path, "a", encoding="utf-8", buffering=_BUFFER_BYTES)  # noqa: SIM115
            except OSError as exc:
                raise self._error("cannot open", exc) from exc
        return self._file

    def _append(self, values: Iterable[Any]) -> None:
        try:
            text = "".join([_encode(v) + "\n" for v in values])
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cannot write a record to {self._path} as JSON: {exc}") from exc
        if not text:
            return
        file = self._open()
        try:
            file.write(text)
        except OSError as exc:
            raise self._error("cannot write", exc) from exc

    def write(self, values: list) -> None:
        if self._latest is None:
            self._append(values)
            return
        latest, key = self._latest, self._key
        for value in values:
            latest[key(value)] = value  # type: ignore[misc]

    def _seal(self, target: Path) -> None:
        """Sync and close the file being written and rename it ``target`` (nothing if
        nothing was written since the last seal)."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.flush()
            os.fsync(file.fileno())
            file.close()
            os.rename(self._path, target)
            fsync_dir(target.parent)
        except OSError as exc:
            raise self._error("cannot sync", exc) from exc
        finally:
            if not file.closed:
                file.close()

    # -- the two phases ----------------------------------------------------------------

    def prepare(self, checkpoint_id: int) -> dict[str, Any] | None:
        """The records since the last prepare, sync'd and renamed pending for
        ``checkpoint_id`` (and, ``mode="last"``, the latest records)."""
        if not self._transactional:
            return None
        self._seal(self._pending / _name(self._index, checkpoint_id))
        self._last = checkpoint_id
        state: dict[str, Any] = {"checkpoint": checkpoint_id}
        if self._latest is not None:
            state["latest"] = pickle.dumps(self._latest, protocol=5)
        return state

    def hand_over(self, barrier_id: int, moving: bool = False) -> None:
        """Leaving at reconfiguration barrier ``barrier_id``: its records (and, ``mode=
        "last"``, its latest ones) sync'd and renamed pending for the first checkpoint
        after the change, which any writer of the directory commits (nothing for a
        successor to adopt); without checkpoints, closed."""
        if not self._transactional:
            self.close()
            return
        if self._closed:
            return
        try:
            if self._latest is not None:
                self._append(self._latest.values())
            self._seal(self._pending / _name(self._index, barrier_id))
        finally:
            self._closed = True

    def commit(self, checkpoint_id: int) -> None:
        """Every pending file of the directory prepared at ``checkpoint_id`` or before,
        renamed visible."""
        self._publish(lambda index, barrier: barrier <= checkpoint_id)

    def _publish(self, which: Callable[[int, int], bool]) -> None:
        published = False
        for name, index, barrier, _end in _files(self._pending, _PENDING_NAME):
            if which(index, barrier):
                try:
                    os.rename(self._pending / name, self._dir / name)
                    published = True
                except FileNotFoundError:  # another writer of the sink renamed it first
                    continue
                except OSError as exc:
                    raise self._error("cannot commit", exc, self._pending / name) from exc
        if published:
            fsync_dir(self._dir)

    def restore(self, state: dict[str, Any]) -> None:
        """Recovered from the checkpoint ``state`` was prepared at: what was pending up
        to it made visible; this index's files after it (and those of indexes past the
        parallelism) deleted, pending, in progress or visible."""
        if not self._transactional:
            return
        checkpoint = int(state["checkpoint"])
        self.commit(checkpoint)

        def after(index: int, barrier: int, end: bool) -> bool:
            mine = index == self._index or index >= self._parallelism
            return mine and (barrier > checkpoint or (barrier == checkpoint and end))

        try:
            for name, index, barrier, end in _files(self._pending, _PENDING_NAME):
                if after(index, barrier, end):
                    os.unlink(self._pending / name)
            for name, index, barrier, end in _files(self._dir, _VISIBLE_NAME):
                if after(index, barrier, end):
                    os.unlink(self._dir / name)
            for name in os.listdir(self._pending):
                match = _IN_PROGRESS_NAME.fullmatch(name)
                if match and (int(match[1]) == self._index or int(match[1]) >= self._parallelism):
                    os.unlink(self._pending / name)
        except OSError as exc:
            raise self._error("cannot restore", exc) from exc
        self._last = checkpoint
        if self._latest is not None and "latest" in state:
            self._latest = pickle.loads(state["latest"])

    # -- ending ------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._latest is not None:
                self._append(self._latest.values())
            if self._transactional:
                # Named after the files of its index before it (a task that moved here
                # left one pending): read in the order it was written.
                last = max(
                    [self._last]
                    + [b for _, i, b, _ in _files(self._pending, _PENDING_NAME) if i == self._index]
                    + [b for _, i, b, _ in _files(self._dir, _VISIBLE_NAME) if i == self._index]
                )
                self._seal(self._dir / _name(self._index, last, end=self._token))
                self._publish(lambda index, barrier: True)
            elif self._file is not None:
                self._file.close()
        except OSError as exc:
            raise self._error("cannot close", exc) from exc
        finally:
            if self._file is not None and not self._file.closed:
                self._file.close()

    def abort(self) -> None:
        """Stopped before its end: close the file being written, writing no final
        results; with checkpoints, what it holds stays in progress (invisible) until a
        recovery deletes it. The file is closed here and now, not when the writer is
        collected, so that nothing buffered lands after a recovery's restore."""
        if self._closed:
            return
        self._closed = True
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError as exc:
            raise self._error("cannot close", exc) from exc


def _name(index: int, barrier: int, end: str = "") -> str:
    """A pending or visible file's name; ``end``: the token of a writer's final file."""
    return f"part-{index}-{barrier:012d}{f'-end.{end}' if end else ''}.jsonl"


def _files(directory: Path, pattern: re.Pattern[str]) -> list[tuple[str, int, int, bool]]:
    """(name, index, barrier id, final) of the part files of ``directory`` that
    ``pattern`` matches (none if it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = pattern.fullmatch(name)
        if match and match[2] is not None:
            found.append((name, int(match[1]), int(match[2]), bool(match[3])))
    return found


@dataclass(frozen=True)
class Null(Sink):
    """Discard every record (for throughput runs)."""

    exactly_once = True  # nothing written, so nothing twice

    def open(self, index: int, parallelism: int) -> NullWriter:
        return NullWriter()


class NullWriter(SinkWriter):
    def write(self, values: list) -> None:
        pass


def read_parts(path: str | os.PathLike[str]) -> list:
    """All visible records of the part files in directory ``path``: part by part (by
    index), each part's files in the order they were committed. What is in progress or
    pending (``_pending/``) is not read.

    Raises :class:`FileNotFoundError` if ``path`` is not a directory and
    :class:`ValueError` naming the file and line of a line that is not JSON.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"no collect directory {directory}")
    parts = []
    for file in directory.iterdir():
        match = _VISIBLE_NAME.fullmatch(file.name)
        if match:
            barrier = -1 if match[2] is None else int(match[2])
            parts.append((int(match[1]), barrier, bool(match[3]), file))
    records = []
    for *_, file in sorted(parts):
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
