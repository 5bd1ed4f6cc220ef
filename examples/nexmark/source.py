"""The Nexmark stream as a partitioned source: partition ``i`` of ``P`` reads positions
``i, i + P, i + 2P, ...`` of the generator's stream (see :mod:`.generator`).

A partition's events depend on the description and the partition alone, never on which
task reads it, when, or in how many polls, so a partition moved to another task (its
position travelling with it), a source scaled out or in, or a recovery from a checkpoint
replays exactly what follows the position.

Pacing: with ``rate`` (events per second, all partitions together) the event at position
``k`` is due ``(k + 1) / rate`` seconds after the job's start, so each partition runs at
``rate / P`` and its records' timestamps (for latency) are when they were due; with
``rate=None`` events come as fast as they are polled, stamped with the poll's time. The
events' own ``date_time`` is event time, from the generator, whatever the pacing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from runtime.io import PartitionedSource, SourceReader

from .generator import GeneratorConfig, _check_int

__all__ = ["Nexmark", "NexmarkReader"]

_MANY = 2**62
"""More positions than any stream holds: keeps ``poll(now=inf)`` finite."""


@dataclass(frozen=True, kw_only=True)
class Nexmark(GeneratorConfig, PartitionedSource):
    """The Nexmark events (:class:`GeneratorConfig`'s fields: ``events``, ``seed``,
    ``base_time_ms``, ``out_of_order_group_size``, the standard's knobs) in
    ``partitions_count`` partitions ``p0``..., paced at ``rate`` events per second over
    all partitions (None: as fast as possible)."""

    rate: float | None = None
    partitions_count: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.rate is not None and (
            isinstance(self.rate, bool)
            or not isinstance(self.rate, int | float)
            or not math.isfinite(self.rate)
            or self.rate <= 0
        ):
            raise ValueError(
                f"{owner}.rate must be a number > 0 (events/s over all partitions) or None "
                f"(as fast as possible), got {self.rate!r}"
            )
        _check_int(owner, "partitions_count", self.partitions_count, 1, "number of partitions")

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.events is not None

    def partitions(self) -> list[str]:
        return [f"p{i}" for i in range(self.partitions_count)]

    def open_partition(self, partition: str, start_time: float) -> NexmarkReader:
        names = self.partitions()
        if partition not in names:
            raise ValueError(f"{type(self).__name__} has no partition {partition!r}: {names}")
        return NexmarkReader(self, names.index(partition), start_time)

    def events_of(self, partition: str, start: int = 0) -> list:
        """Every event of bounded ``partition`` from position ``start`` on, read at once
        (for references and tests)."""
        if self.events is None:
            raise ValueError("events_of() needs a bounded stream (events is not None)")
        reader = self.open_partition(partition, 0.0)
        reader.seek(start)
        out: list = []
        while (polled := reader.poll(math.inf, 65_536)) is not None:
            out.extend(polled[0])
        return out


class NexmarkReader(SourceReader):
    """Partition ``index`` of a :class:`Nexmark`: its position is the next position of
    the stream it will emit (one of ``index + m * partitions_count``)."""

    def __init__(self, source: Nexmark, index: int, start_time: float) -> None:
        self._source = source
        self._index = index
        self._step = source.partitions_count
        self._start = start_time
        self._next = index

    def _exhausted(self) -> bool:
        return self._source.events is not None and self._next >= self._source.events

    def _last_due(self, now: float) -> int:
        """The last position due by ``now`` (-1: none yet)."""
        rate = self._source.rate
        return math.floor(min((now - self._start) * rate, _MANY)) - 1  # type: ignore[operator]

    def _owned_up_to(self, last: int) -> int:
        """This partition's positions in ``[next, last]``."""
        if self._source.events is not None:
            last = min(last, self._source.events - 1)
        return max(0, (last - self._next) // self._step + 1)

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._exhausted():
            return None
        source = self._source
        rate = source.rate
        count = self._owned_up_to(_MANY if rate is None else self._last_due(now))
        if rate is not None and count == 0 and now >= self._due(self._next):
            count = 1  # float rounding must not starve a poll at next_due()
        count = min(count, max_records)
        if count <= 0:
            return [], []
        positions = range(self._next, self._next + count * self._step, self._step)
        self._next += count * self._step
        event_at = source.event_at
        values = [event_at(k) for k in positions]
        if rate is None:
            return values, [now] * count
        start = self._start
        return values, [start + (k + 1) / rate for k in positions]

    def _due(self, position: int) -> float:
        return self._start + (position + 1) / self._source.rate  # type: ignore[operator]

    def next_due(self, now: float) -> float:
        if self._exhausted() or self._source.rate is None:
            return now
        return max(now, self._due(self._next))

    def position(self) -> int:
        return self._next

    def seek(self, position: Any) -> None:
        """Go to this partition's first position at or after ``position``."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"Nexmark position must be an int >= 0, got {position!r}")
        self._next = position + (self._index - position) % self._step

    def lag(self) -> int | None:
        """Events due by now and not emitted yet; None when unthrottled (all are due)."""
        if self._source.rate is None:
            return None
        return self._owned_up_to(self._last_due(time.time()))
