"""Event-time jobs with late records, for the allowed-lateness tests (module level, so
workers can import them), with their reference computed in this process.

:class:`LateEvents` is a seeded stream of ``(key, time_ms, value)`` in phases, read by one
source task with no out-of-orderness allowed: phase ``i`` is read once the file
``gates/i`` exists, so that a test lets it in after every task's watermark has reached
the end of phase ``i - 1`` (:func:`watermarks`). Each phase after the first starts with
records behind that watermark (some within :data:`LATENESS_S` of their windows' close,
some beyond it, three of the hot key in a row, and one of a key seen nowhere else, which
opens a window that closed already), then goes on in time order.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.eventtime import RESOLUTION_S, EventTime
from runtime.io import Source, SourceReader
from runtime.sinks import Collect, read_parts
from runtime.windows import Count, Sum
from tests.time_jobs import event_ms, key_of, value_of
from tests.window_split_jobs import ASSIGNERS, HOT

LATENESS_S = 1.0
LATE_ONLY = "z"  # a key whose records all come late: each opens a window closed already
KEYS = ("a", "b", "c", HOT)
BASE_MS = 1_000_000
TOPS_MS = (3_500, 6_500, 9_500)  # each phase's last (and highest) time, from BASE_MS


@dataclass(frozen=True)
class LateEvents(Source):
    gates: str
    seed: int = 1

    def phases(self) -> list[list[tuple[str, int, int]]]:
        """The events of each phase, in the order they are read (module docstring)."""
        rng = random.Random(self.seed)
        out = []
        low = BASE_MS
        for top in (BASE_MS + t for t in TOPS_MS):
            behind = []
            if out:  # late: up to 4 s behind the watermark (= low)
                behind = [
                    (rng.choice(KEYS), rng.randrange(low - 4_000, low), rng.randrange(100))
                    for _ in range(12)
                ]
                behind += [(HOT, low - 1_200 + 100 * i, rng.randrange(100)) for i in range(3)]
                behind.append((LATE_ONLY, low - 1_200, rng.randrange(100)))
                behind.append((rng.choice(KEYS), low - 3_800, rng.randrange(100)))  # beyond
                rng.shuffle(behind)
            times = [*sorted(rng.randrange(low, top) for _ in range(40)), top]
            out.append(behind + [(rng.choice(KEYS), ms, rng.randrange(100)) for ms in times])
            low = top
        return out

    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        if parallelism != 1:
            raise ValueError("LateEvents is read by one task (its phases are in order)")
        return LateEventsReader(self)


class LateEventsReader(SourceReader):
    def __init__(self, source: LateEvents) -> None:
        self.gates = source.gates
        self.phases = source.phases()
        self.next = 0  # over the phases' events, one after the other
        self.ends = [sum(map(len, self.phases[: i + 1])) for i in range(len(self.phases))]
        self.events = [e for phase in self.phases for e in phase]

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self.next == len(self.events):
            return None
        phase = next(i for i, end in enumerate(self.ends) if self.next < end)
        if not os.path.exists(os.path.join(self.gates, str(phase))):
            return [], []
        values = self.events[self.next : min(self.ends[phase], self.next + max_records)]
        self.next += len(values)
        return values, [now] * len(values)

    def next_due(self, now: float) -> float:
        return now + 0.05  # the gate of the next phase: looked for again soon

    def position(self) -> int:
        return self.next

    def seek(self, position: Any) -> None:
        self.next = int(position)


def watermarks() -> list[float]:
    """Every task's watermark once phase ``i`` is in (the last phase ends the input)."""
    return [(BASE_MS + t) / 1000 - RESOLUTION_S for t in TOPS_MS[:-1]] + [math.inf]


def lateness_job(params: dict[str, Any]) -> Dataflow:
    """events (one task) -> per key, tumbling 1 s count or sliding 2 s / 0.5 s sum of
    values (params["window"]) with :data:`LATENESS_S` and params["late"]:
    ``window_aggregate`` over ``parallelism`` tasks and its merge over 2, or ``window``
    with params["plain"] -> out."""
    flow = Dataflow("lateness")
    source = LateEvents(params["gates"], int(params.get("seed", 1)))
    events = flow.source(
        "events", source, parallelism=1, event_time=EventTime(event_ms, per_second=1000)
    )
    kind = params.get("window", "tumbling")
    aggregate = Sum(value_of) if kind == "sliding" else Count()
    late = params.get("late", "drop")
    keyed = events.key_by(key_of)
    parallelism = int(params.get("parallelism", 2))
    if params.get("plain"):
        out = keyed.window(
            "window",
            ASSIGNERS[kind],
            aggregate=aggregate,
            allowed_lateness_s=LATENESS_S,
            late=late,
            parallelism=parallelism,
        )
    else:
        out = keyed.window_aggregate(
            "window",
            ASSIGNERS[kind],
            aggregate,
            allowed_lateness_s=LATENESS_S,
            late=late,
            parallelism=parallelism,
            merge_parallelism=2,
        )
    out.sink("out", Collect(params["output"]))
    return flow


def reference(params: dict[str, Any]) -> tuple[list[tuple], list[tuple]]:
    """What :func:`lateness_job` emits, computed from the events without the runtime:
    the windows' results, each time one is emitted (at its close, and at once for each
    record within the lateness that comes after it), and the late records (what
    late="emit" passes on), each sorted. A window closes when the watermark reaches
    its end less :data:`RESOLUTION_S`; its state goes :data:`LATENESS_S` later."""
    kind = params.get("window", "tumbling")
    assigner = ASSIGNERS[kind]
    source = LateEvents(params["gates"], int(params.get("seed", 1)))
    accs: dict[tuple, int] = {}
    results, late = [], []
    watermark = -math.inf
    for phase, rises_to in zip(source.phases(), watermarks(), strict=True):
        for key, ms, value in phase:
            t = ms / 1000
            spans = [
                (s, e) for s, e in assigner.assign(t) if e - RESOLUTION_S + LATENESS_S > watermark
            ]
            if not spans:
                late.append((key, [key, ms, value], t))
            for start, end in spans:
                window = (key, start, end)
                accs[window] = accs.get(window, 0) + (value if kind == "sliding" else 1)
                if end - RESOLUTION_S <= watermark:  # closed already: fired again at once
                    results.append((*window, accs[window]))
        for window, acc in accs.items():
            if watermark < window[2] - RESOLUTION_S <= rises_to:
                results.append((*window, acc))
        watermark = rises_to
    return sorted(results), sorted(late)


def read_output(output: str) -> tuple[list[tuple], list[tuple]]:
    """The windows' results and the late records a job wrote, each sorted."""
    records = [tuple(r) for r in read_parts(output)]
    return sorted(r for r in records if len(r) == 4), sorted(r for r in records if len(r) == 3)


def last_results(results: list[tuple]) -> dict[tuple, Any]:
    """The last result of each (key, start, end), of results sorted by value (the values
    of one window only grow: counts, and sums of values >= 0)."""
    return {(k, s, e): v for k, s, e, v in results}


def difference(got: list[tuple], want: list[tuple]) -> str:
    """What ``got`` has more and fewer of than ``want`` (for an assertion's message)."""
    more, fewer = Counter(got) - Counter(want), Counter(want) - Counter(got)
    return f"more than the reference: {sorted(more.elements())}; fewer: {sorted(fewer.elements())}"
