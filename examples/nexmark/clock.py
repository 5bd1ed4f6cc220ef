"""A Nexmark stream whose event time starts when its job starts (for latency benchmarks)."""

from __future__ import annotations

import dataclasses

from .source import Nexmark, NexmarkReader

__all__ = ["StartedNexmark"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StartedNexmark(Nexmark):
    """:class:`Nexmark` whose event 0 happens at the job's start: its partitions are read
    with ``base_time_ms`` set to the job's clock origin (the ``start_time`` every task
    opens its partitions with, kept through reconfigurations and recoveries) instead of
    the fixed one. With ``event_rate`` equal to ``rate`` an event's ``date_time`` is then
    when it is due at the source (within ``1 / rate`` and a millisecond, never after), so
    event time follows the wall clock and the sinks' latency of an event-time job, counted
    from the records' event time, is their real delay.

    The events are those of :class:`Nexmark` with the same fields but their times;
    :meth:`events_of` (opened at time 0) gives them at ``base_time_ms``, as the
    references read them."""

    def open_partition(self, partition: str, start_time: float) -> NexmarkReader:
        if start_time <= 0:
            return super().open_partition(partition, start_time)
        started = dataclasses.replace(self, base_time_ms=int(start_time * 1000))
        return Nexmark.open_partition(started, partition, start_time)
