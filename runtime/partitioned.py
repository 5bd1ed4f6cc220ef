"""The reader of a source task that owns partitions of a :class:`~runtime.io.PartitionedSource`.

A :class:`PartitionSetReader` holds one reader per partition the task owns and polls them
in turn, starting each poll at the partition after the one the previous poll started at,
so that a busy partition cannot starve the others. Its position is a dict partition ->
that partition's position (exhausted partitions keep their last one, so that a
checkpoint taken after a partition ended does not replay it); :meth:`give` and
:meth:`take` move one partition out of and into the set during a live reconfiguration.
With a :class:`~runtime.eventtime.SourceClock`, each partition's records are stamped with
their event time and the clock watches each partition apart (its watermark).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import StreamRuntimeError
from .eventtime import SourceClock
from .io import PartitionedSource, SourceReader

__all__ = ["IDLE_POLL_S", "PartitionSetReader", "SourceStalled"]

IDLE_POLL_S = 0.1  # an unbounded task with nothing to read looks again after this long


class SourceStalled(StreamRuntimeError, RuntimeError):
    """A partition's reader stayed stalled past its source's ``stall_timeout_s``."""


class PartitionSetReader(SourceReader):
    """Reads ``partitions`` of ``source`` (each seeked to its entry in ``positions``, if
    any); rates count from ``start_time``."""

    def __init__(
        self,
        source: PartitionedSource,
        partitions: Iterable[str],
        start_time: float,
        positions: Mapping[str, Any] | None = None,
        clock: SourceClock | None = None,
    ) -> None:
        self._source = source
        self.clock = clock  # event time: each partition's records stamped and watched
        self._start = start_time
        self._readers: dict[str, SourceReader] = {}
        self._ended: dict[str, Any] = {}  # exhausted partition -> its last position
        self._stalled_since: dict[str, float] = {}  # partition -> when its reader stalled
        self._over = False  # told that no partition will come (see end())
        self._turn = 0
        try:
            for p in partitions:
                self.take(p, (positions or {}).get(p))
        except BaseException:
            self.close()
            raise

    @property
    def partitions(self) -> list[str]:
        """The partitions it owns, exhausted ones included, sorted."""
        return sorted([*self._readers, *self._ended])

    def take(self, partition: str, position: Any = None) -> None:
        """Own ``partition`` from now on, from ``position`` (None: where a new reader of
        it starts)."""
        if partition in self._readers or partition in self._ended:
            raise ValueError(f"partition {partition!r} is read here already")
        reader = self._source.open_partition(partition, self._start)
        if position is not None:
            try:
                reader.seek(position)
            except BaseException:
                reader.close()
                raise
        self._readers[partition] = reader
        if self.clock is not None:
            self.clock.add(partition, time.time())

    def give(self, partition: str) -> Any:
        """Stop reading ``partition``; its position, for the task that reads it next."""
        if self.clock is not None:
            self.clock.remove(partition)
        if partition in self._ended:
            return self._ended.pop(partition)
        reader = self._readers.pop(partition)
        try:
            return reader.position()
        finally:
            reader.close()

    def end(self) -> None:
        """Nothing more will be given to it: once it reads no partition, it is done (a
        bounded source's task left without partitions idles until told this)."""
        self._over = True

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        names = list(self._readers)
        if not names:
            # Bounded: done once the partitions it read have ended, or when told (it
            # had none, or gave them away: other tasks still read the source's).
            done = self._source.bounded and (bool(self._ended) or self._over)
            return None if done else ([], [])
        values: list = []
        stamps: list[float] = []
        start = self._turn % len(names)
        self._turn += 1
        for name in names[start:] + names[:start]:
            room = max_records - len(values)
            if room <= 0:
                break
            polled = self._readers[name].poll(now, room)
            if polled is None:
                reader = self._readers.pop(name)
                self._ended[name] = reader.position()
                reader.close()
                if self.clock is not None:
                    self.clock.end(name)
                continue
            if self.clock is not None and polled[0]:
                times = self.clock.spec.stamps(polled[0])
                self.clock.observe(name, times, now)
                polled = polled[0], times
            values += polled[0]
            stamps += polled[1]
        self._check_stalls(names)
        if not values and not self._readers and self._source.bounded and self._ended:
            return None
        return values, stamps

    def _check_stalls(self, names: list[str]) -> None:
        """Fail (:class:`SourceStalled`) once a partition's reader has stayed stalled for
        the source's ``stall_timeout_s``."""
        limit = getattr(self._source, "stall_timeout_s", None)
        clock = time.monotonic()
        for name in names:
            reader = self._readers.get(name)
            why = None if reader is None else reader.stalled
            if why is None:
                self._stalled_since.pop(name, None)
                continue
            since = self._stalled_since.setdefault(name, clock)
            if limit is not None and clock - since > limit:
                raise SourceStalled(
                    f"partition {name!r} could not be read for {clock - since:.0f}s "
                    f"(stall_timeout_s={limit:g}): {why}"
                )

    def next_due(self, now: float) -> float:
        if not self._readers:
            return now + IDLE_POLL_S
        return min(r.next_due(now) for r in self._readers.values())

    def position(self) -> dict[str, Any]:
        return {**self._ended, **{p: r.position() for p, r in self._readers.items()}}

    def seek(self, position: Any) -> None:
        """Seek each partition named in ``position`` (a dict partition -> position) that
        it owns; others are not its to read."""
        if not isinstance(position, Mapping):
            raise ValueError(
                f"the position of a partitioned source is a dict partition -> position, "
                f"got {position!r}"
            )
        for partition, pos in position.items():
            if partition in self._ended:
                self.take_back(partition)
            if partition in self._readers:
                self._readers[partition].seek(pos)

    def take_back(self, partition: str) -> None:
        """An exhausted partition is read again (a seek rewinds it)."""
        self._ended.pop(partition)
        self._readers[partition] = self._source.open_partition(partition, self._start)

    def committed(self, position: Any) -> None:
        """Each partition read here is told its entry of ``position`` was checkpointed."""
        for partition, pos in dict(position or {}).items():
            reader = self._readers.get(partition)
            if reader is not None:
                reader.committed(pos)

    def health(self) -> dict[str, dict[str, Any]]:
        """Per partition read here: its ``lag`` (records behind the head, None: unknown)
        and why it is ``stalled`` (None: it reads)."""
        return {p: {"lag": r.lag(), "stalled": r.stalled} for p, r in sorted(self._readers.items())}

    def close(self) -> None:
        readers, self._readers = list(self._readers.values()), {}
        for r in readers:
            r.close()
