"""Event-time jobs for the split windowed aggregation's tests (module level, so workers
can import them), with their reference computed in this process.

:class:`HotEvents` is :class:`tests.time_jobs.Events` with one hot key, ``"hot"``,
taking ``hot_share`` of the events (seeded per event, so the stream is the same whatever
reads it).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.sinks import Collect
from runtime.windows import Count, Sliding, Sum, Tumbling
from tests.time_jobs import Events, event_time, key_of, value_of

HOT = "hot"
ASSIGNERS = {"tumbling": Tumbling(1.0), "sliding": Sliding(2.0, 0.5)}


@dataclass(frozen=True)
class HotEvents(Events):
    hot_share: float = 0.5

    def event(self, n: int) -> tuple[str, int, int]:
        key, ms, value = super().event(n)
        if random.Random(self.seed * 7_919 + n).random() < self.hot_share:
            key = HOT
        return key, ms, value


def source_of(params: dict[str, Any]) -> HotEvents:
    return HotEvents(
        events=int(params.get("events", 10_000)),
        rate=params.get("rate"),
        disorder_ms=int(params.get("disorder_ms", 300)),
        held=params.get("held"),
        hot_share=float(params.get("hot_share", 0.5)),
    )


def split_window_job(params: dict[str, Any]) -> Dataflow:
    """events (4 partitions, 2 tasks) -> per key, tumbling 1 s count or sliding 2 s / 0.5 s
    sum of values (params["window"]): ``window_aggregate`` over ``parallelism`` tasks and
    its merge over 2, or ``window`` with params["plain"] -> out."""
    flow = Dataflow("split_windows")
    events = flow.source("events", source_of(params), parallelism=2, event_time=event_time(params))
    kind = params.get("window", "tumbling")
    aggregate = Sum(value_of) if kind == "sliding" else Count()
    keyed = events.key_by(key_of)
    parallelism = int(params.get("parallelism", 2))
    if params.get("plain"):
        out = keyed.window("window", ASSIGNERS[kind], aggregate=aggregate, parallelism=parallelism)
    else:
        out = keyed.window_aggregate(
            "window", ASSIGNERS[kind], aggregate, parallelism=parallelism, merge_parallelism=2
        )
    out.sink("out", Collect(params["output"]))
    return flow


def reference(params: dict[str, Any]) -> list[tuple]:
    """What :func:`split_window_job` emits: ``(key, start, end, value)`` per window."""
    kind = params.get("window", "tumbling")
    per: dict[tuple, int] = defaultdict(int)
    for key, ms, value in source_of(params).all():
        for span in ASSIGNERS[kind].assign(ms / 1000):
            per[(key, *span)] += value if kind == "sliding" else 1
    return sorted((k, s, e, n) for (k, s, e), n in per.items())
