"""The contracts of sources and sinks.

A :class:`Source` or :class:`Sink` is a small, frozen, picklable description (it is shipped
to workers inside the job graph). Each task of a source operator calls
:meth:`Source.open` once with its index and the operator's parallelism and pulls batches
from the returned :class:`SourceReader`; each sink task writes to its own
:class:`SinkWriter`.

Sources are replayable and deterministic: for a given description (seed included) the
multiset of records produced by all readers together is the same whatever the
parallelism, and :meth:`SourceReader.position` / :meth:`SourceReader.seek` let a reader be
rewound to a recorded position (checkpoints, fault tolerance).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

__all__ = ["Sink", "SinkWriter", "Source", "SourceReader"]


class SourceReader(ABC):
    """One source task's share of a source. Called from one asyncio task only."""

    @abstractmethod
    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        """Records due by wall-clock ``now`` (at most ``max_records``) and their timestamps.

        Returns ``(values, timestamps)``, where a timestamp is the time the record was due
        by the source's rate schedule (or ``now`` for an unthrottled source), so that
        latency counts time spent queued in an overloaded source. An empty batch means
        nothing is due yet (call :meth:`next_due`). ``None`` means the reader is exhausted
        and will never produce again.
        """

    def next_due(self, now: float) -> float:
        """Wall-clock time at which the next record is due (``now`` if one is due now)."""
        return now

    def position(self) -> Any:
        """A msgpack-able replay position: seeking to it replays what follows it."""
        raise NotImplementedError(f"{type(self).__name__} cannot report a replay position")

    def seek(self, position: Any) -> None:
        """Rewind or advance to a position returned by :meth:`position`."""
        raise NotImplementedError(f"{type(self).__name__} cannot seek")

    def close(self) -> None:
        """Release files or sockets. Called once, also after a failure."""


class Source(ABC):
    """A picklable description of a replayable source."""

    bounded: bool = True

    @abstractmethod
    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        """The reader of task ``index`` of ``parallelism``; rates count from ``start_time``."""


class SinkWriter(ABC):
    """One sink task's writer. Called from one asyncio task only.

    Exactly-once output through failures: at each checkpoint the runtime asks the writer
    for :meth:`snapshot` (what it has made durable so far, e.g. a file's length), and a
    writer recovered from that checkpoint gets it back through :meth:`restore` before any
    write, to take back what it wrote after it (e.g. truncate the file). A writer that
    keeps the defaults is at-least-once: records after the checkpoint are written again.
    """

    @abstractmethod
    def write(self, values: list) -> None:
        """Take a batch of records, in arrival order."""

    def snapshot(self) -> Any:
        """Make what was written so far durable and say what it is (msgpack-able), at a
        checkpoint barrier (on the task's loop: keep it short). None: nothing to restore."""
        return None

    def restore(self, state: Any) -> None:
        """Go back to ``state`` (from :meth:`snapshot`), before any :meth:`write`: what was
        written after it is taken back."""

    def close(self) -> None:
        """End of stream: write final results and release resources. Called once."""

    def abort(self) -> None:
        """The task stops before its end (stopped, failed, or halted for a recovery):
        release resources now, writing no final results; what was written since the last
        :meth:`snapshot` may be taken back by a :meth:`restore` that follows. Called at
        most once, possibly after :meth:`close` (then it does nothing)."""


class Sink(ABC):
    """A picklable description of a sink."""

    @abstractmethod
    def open(self, index: int, parallelism: int) -> SinkWriter:
        """The writer of task ``index`` of ``parallelism``."""
