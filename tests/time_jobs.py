"""Event-time jobs for the window, timer and watermark tests, with their references
computed in this process (module level, so workers can import them).

:class:`Events` is a seeded, partitioned, replayable stream of ``(key, time_ms, value)``:
event ``n`` happens at ``BASE_MS + n * step_ms`` less a seeded delay below
``disorder_ms`` (so the stream is out of order by less than that), partition ``i`` of
``P`` holds the events ``i, i + P, ...``, paced at ``rate`` events/s in all.
"""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.eventtime import EventTime
from runtime.io import PartitionedSource, SourceReader
from runtime.sinks import Collect, read_parts
from runtime.timers import KeyedProcessFunction
from runtime.windows import Count, Session, Sliding, Sum, Tumbling

BASE_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Events(PartitionedSource):
    events: int = 10_000
    rate: float | None = None
    keys: int = 20
    step_ms: int = 10
    disorder_ms: int = 300
    seed: int = 1
    partitions_count: int = 4
    held: str | None = None  # while this file exists, an exhausted partition waits (empty)
    quiet_from: int | None = None  # the last partition has no event from this one on
    behind_s: float = 0.0  # the last partition's events come this much later (wall clock)

    def has(self, n: int) -> bool:
        """Whether event ``n`` is in the stream."""
        quiet = (
            self.quiet_from is not None and n % self.partitions_count == self.partitions_count - 1
        )
        return n < self.events and not (quiet and n >= self.quiet_from)

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return True

    def event(self, n: int) -> tuple[str, int, int]:
        rng = random.Random(self.seed * 1_000_003 + n)
        key = f"k{rng.randrange(self.keys):02d}"
        delay = rng.randrange(self.disorder_ms) if self.disorder_ms else 0
        return key, BASE_MS + n * self.step_ms - delay, rng.randrange(100)

    def partitions(self) -> list[str]:
        return [f"p{i}" for i in range(self.partitions_count)]

    def open_partition(self, partition: str, start_time: float) -> EventsReader:
        return EventsReader(self, int(partition[1:]), start_time)

    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        raise NotImplementedError("Events is read by partition")

    def all(self) -> list[tuple[str, int, int]]:
        return [self.event(n) for n in range(self.events) if self.has(n)]


class EventsReader(SourceReader):
    def __init__(self, source: Events, partition: int, start_time: float) -> None:
        self.source = source
        self.step = source.partitions_count
        self.next = partition
        self.start = start_time

    def due(self, n: int) -> float:
        rate = self.source.rate
        last = n % self.step == self.step - 1
        return (self.start if not rate else self.start + n / rate) + (
            self.source.behind_s if last else 0.0
        )

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if not self.source.has(self.next):
            held = self.source.held
            return ([], []) if held is not None and os.path.exists(held) else None
        values, stamps = [], []
        while self.source.has(self.next) and len(values) < max_records:
            due = self.due(self.next)
            if due > now:
                break
            values.append(self.source.event(self.next))
            stamps.append(due)
            self.next += self.step
        return values, stamps

    def next_due(self, now: float) -> float:
        if not self.source.has(self.next):
            return now + 0.05  # held: looks again for the file soon
        return self.due(self.next)

    def position(self) -> int:
        return self.next

    def seek(self, position: Any) -> None:
        self.next = int(position)


def event_ms(event: tuple) -> int:
    return event[1]


def key_of(event: tuple) -> str:
    return event[0]


def value_of(event: tuple) -> int:
    return event[2]


def window_key(result: Any) -> Any:
    return result[0]


SOURCE_KINDS = {
    "tumbling": Tumbling(1.0),
    "sliding": Sliding(2.0, 0.5),
    "session": Session(0.25),
}


def source_of(params: dict[str, Any]) -> Events:
    return Events(
        events=int(params.get("events", 10_000)),
        rate=params.get("rate"),
        keys=int(params.get("keys", 20)),
        step_ms=int(params.get("step_ms", 10)),
        disorder_ms=int(params.get("disorder_ms", 300)),
        partitions_count=int(params.get("partitions", 4)),
        held=params.get("held"),
        quiet_from=params.get("quiet_from"),
        behind_s=float(params.get("behind_s", 0.0)),
    )


def event_time(params: dict[str, Any]) -> EventTime:
    return EventTime(
        event_ms,
        max_out_of_orderness_s=params.get("disorder_ms", 300) / 1000,
        idle_timeout_s=params.get("idle_timeout_s"),
        per_second=1000,
    )


def windowed_job(params: dict[str, Any]) -> Dataflow:
    """events -> window (params["window"]: tumbling 1 s count, sliding 2 s / 0.5 s sum of
    values, session 0.25 s count) per key -> out."""
    flow = Dataflow("windowed")
    events = flow.source(
        "events",
        source_of(params),
        parallelism=int(params.get("source_parallelism", 2)),
        event_time=event_time(params),
    )
    kind = params.get("window", "tumbling")
    aggregate = Sum(value_of) if kind == "sliding" else Count()
    windows = events.key_by(key_of).window(
        "window",
        SOURCE_KINDS[kind],
        aggregate=aggregate,
        time=params.get("time", "event"),
        parallelism=int(params.get("parallelism", 2)),
    )
    windows.sink("out", Collect(params["output"]))
    return flow


def window_reference(params: dict[str, Any]) -> list[tuple]:
    """What :func:`windowed_job` emits, computed from the events without the runtime."""
    kind = params.get("window", "tumbling")
    assigner = SOURCE_KINDS[kind]
    per: dict[tuple, int] = defaultdict(int)
    by_key: dict[str, list[float]] = defaultdict(list)
    for key, ms, value in source_of(params).all():
        t = ms / 1000
        if kind == "session":
            by_key[key].append(t)
            continue
        for span in assigner.assign(t):
            per[(key, *span)] += value if kind == "sliding" else 1
    for key, times in by_key.items():
        times.sort()
        start = end = None
        n = 0
        for t in times:
            if start is not None and t < end:
                end = max(end, t + assigner.gap_s)
                n += 1
                continue
            if start is not None:
                per[(key, start, end)] = n
            start, end, n = t, t + assigner.gap_s, 1
        per[(key, start, end)] = n
    return sorted((k, s, e, n) for (k, s, e), n in per.items())


def read_windows(output: str) -> list[tuple]:
    return sorted(tuple(r) for r in read_parts(output))


class PerSecond(KeyedProcessFunction):
    """Per key, the sum of its values per second of event time, emitted as ``(key, end of
    the second, sum)`` when the watermark passes the end of that second: a tumbling
    window made of event-time timers, by hand."""

    def __call__(self, key: str, event: tuple, ctx: Any) -> None:
        end = math.floor(ctx.timestamp) + 1.0
        sums = ctx.get() or {}
        if end not in sums:
            ctx.timers.register_event_time(end)
            sums[end] = 0
        sums[end] += event[2]
        ctx.set(sums)

    def on_timer(self, key: str, time: float, ctx: Any) -> list:
        sums = ctx.get()
        total = sums.pop(time)
        ctx.set(sums) if sums else ctx.clear()
        return [(key, time, total)]


def timers_job(params: dict[str, Any]) -> Dataflow:
    flow = Dataflow("timers")
    events = flow.source("events", source_of(params), parallelism=2, event_time=event_time(params))
    out = events.key_by(key_of).process("per_second", PerSecond(), parallelism=2)
    out.sink("out", Collect(params["output"]))
    return flow


def timers_reference(params: dict[str, Any]) -> list[tuple]:
    """What :func:`timers_job` emits."""
    sums: dict[tuple, int] = defaultdict(int)
    for key, ms, value in source_of(params).all():
        sums[(key, math.floor(ms / 1000) + 1.0)] += value
    return sorted((k, end, total) for (k, end), total in sums.items())


# -- joins -------------------------------------------------------------------------------


INTERVAL = (-0.2, 0.3)  # a right event pairs with a left one from 200 ms before to 300 after


def pair(left: tuple, right: tuple) -> tuple:
    return (left[0], left[1], right[1], left[2] + right[2])


def sides_of(params: dict[str, Any]) -> tuple[Events, Events]:
    left = source_of(params)
    right = Events(
        events=left.events // 2,
        rate=None if left.rate is None else left.rate / 2,
        keys=left.keys,
        step_ms=left.step_ms * 2,
        disorder_ms=left.disorder_ms,
        seed=2,
        partitions_count=2,
        held=left.held,
    )
    return left, right


def join_job(params: dict[str, Any]) -> Dataflow:
    """left, right -> join per key (params["join"]: "interval" within INTERVAL, or
    "window": tumbling 1 s) -> out."""
    from runtime.windows import Tumbling

    flow = Dataflow("joined")
    left_src, right_src = sides_of(params)
    left = flow.source("left", left_src, parallelism=2, event_time=event_time(params))
    right = flow.source("right", right_src, parallelism=1, event_time=event_time(params))
    both = left.key_by(key_of).connect(right.key_by(key_of))
    parallelism = int(params.get("parallelism", 2))
    if params.get("join", "interval") == "interval":
        joined = both.interval_join("join", *INTERVAL, pair, parallelism=parallelism)
    else:
        joined = both.window_join("join", Tumbling(1.0), pair, parallelism=parallelism)
    joined.sink("out", Collect(params["output"]))
    return flow


def join_reference(params: dict[str, Any]) -> list[tuple]:
    from runtime.joins import IntervalJoin
    from runtime.windows import Tumbling

    left_src, right_src = sides_of(params)
    rights: dict[str, list] = defaultdict(list)
    for r in right_src.all():
        rights[r[0]].append(r)
    out = []
    interval = IntervalJoin(*INTERVAL, pair)
    window = Tumbling(1.0)
    for left in left_src.all():
        for right in rights[left[0]]:
            lt, rt = left[1] / 1000, right[1] / 1000
            if params.get("join", "interval") == "interval":
                matched = interval.pairs(lt, rt)
            else:
                matched = window.assign(lt) == window.assign(rt)
            if matched:
                out.append(pair(left, right))
    return sorted(out)


class PerSecondAgain(PerSecond):
    """:class:`PerSecond` as a logic swap brings it (the same results)."""


per_second_again = PerSecondAgain()  # what the swap's ref names
