"""DSC-Heron's traffic-aware placement: co-locate the tasks that talk most.

DSC-Heron classifies the channels between tasks by their traffic, using the mean ``m``
and the mean absolute deviation ``d`` of the channels' rates: *high* above
``m + deviation*d``, *low* below ``m - deviation*d``, *medium* between. It then clusters
the tasks joined by high-traffic channels and places each cluster on one worker, under a
capacity bound ``alpha``; then the medium channels; the rest is spread evenly.

Each period (:func:`place`):

1. Rates: ``bytes_per_s`` (or ``records_per_s``) of each channel between two tasks of the
   job (``MetricsWindow.channel_rates``), classified by :func:`classify`.
2. Clusters: tasks start alone; high channels then medium channels, busiest first, merge
   the clusters at their ends while the merged cluster fits the bound: at most
   ``alpha x slots`` tasks and at most ``alpha x cpus`` of measured busy time (a worker
   is one event loop: co-located tasks share it) on some worker.
3. Placement: clusters of two or more tasks, most internal traffic first, go whole to the
   worker with room (under the same bound) that hosts most of their tasks now, else the
   one with most room; a cluster that fits nowhere is split back into single tasks.
   Single tasks stay where they are while their worker holds no more than an even share
   of the job's tasks, else go to the worker with fewest tasks (never past its slots).
4. Only a placement that cuts the traffic crossing workers by at least ``min_gain`` of all
   traffic becomes a plan, of ``assignResource`` moves for the tasks that change worker.

Only workers with status ``alive`` take tasks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from controlplane.abstraction import Abstraction, AssignResource, Plan, Worker

from ..base import Controller
from ..config import check
from ..plans import PlanBuilder
from ..view import View

__all__ = [
    "Classes",
    "DscPlacement",
    "DscPlacementConfig",
    "classify",
    "clusters",
    "cross_traffic",
    "place",
]

logger = logging.getLogger(__name__)

Channel = tuple[str, str]


@dataclass(frozen=True)
class DscPlacementConfig:
    interval_s: float = 30.0
    alpha: float = 0.8  # a cluster takes at most this fraction of a worker's slots and CPUs
    deviation: float = 1.0  # classes at mean +- deviation x mean absolute deviation
    min_gain: float = 0.1  # re-place only when cross-worker traffic drops by this x total
    metric: Literal["bytes_per_s", "records_per_s"] = "bytes_per_s"
    mode: Literal["pause", "fluid"] = "pause"

    def __post_init__(self) -> None:
        check(0 < self.alpha <= 1, "alpha", "must be in (0, 1]", self.alpha)
        check(self.deviation >= 0, "deviation", "must be >= 0", self.deviation)
        check(0 <= self.min_gain <= 1, "min_gain", "must be in [0, 1]", self.min_gain)


@dataclass(frozen=True)
class Classes:
    """Channels by traffic class, each list busiest first, with the statistics used."""

    high: tuple[Channel, ...]
    medium: tuple[Channel, ...]
    low: tuple[Channel, ...]
    mean: float
    mad: float


def classify(rates: Mapping[Channel, float], deviation: float = 1.0) -> Classes:
    """DSC-Heron's classes of ``rates`` (channel -> traffic): high above ``mean + deviation
    x MAD``, low below ``mean - deviation x MAD``, medium otherwise (MAD: the mean absolute
    deviation from the mean)."""
    if not rates:
        return Classes((), (), (), 0.0, 0.0)
    values = list(rates.values())
    mean = sum(values) / len(values)
    mad = sum(abs(v - mean) for v in values) / len(values)
    busiest = sorted(rates, key=lambda c: (-rates[c], c))
    hi, lo = mean + deviation * mad, mean - deviation * mad
    return Classes(
        tuple(c for c in busiest if rates[c] > hi),
        tuple(c for c in busiest if lo <= rates[c] <= hi),
        tuple(c for c in busiest if rates[c] < lo),
        mean,
        mad,
    )


def cross_traffic(placement: Mapping[str, str], rates: Mapping[Channel, float]) -> float:
    """Traffic over channels whose two tasks are on different workers."""
    return sum(r for (s, t), r in rates.items() if placement.get(s) != placement.get(t))


class _Bins:
    """Workers being filled: tasks and busy time taken so far, against each bound."""

    def __init__(self, workers: Sequence[Worker], alpha: float) -> None:
        self.workers = [w.id for w in workers]
        self.slots = {w.id: w.slots for w in workers}
        self.cap = {w.id: max(1, math.floor(alpha * w.slots)) for w in workers}
        self.cpu = {w.id: alpha * w.cpus for w in workers}
        self.count = dict.fromkeys(self.workers, 0)
        self.busy = dict.fromkeys(self.workers, 0.0)

    def fits(self, w: str, n: int, busy: float) -> bool:
        """Whether ``n`` tasks with ``busy`` time fit ``w`` under the alpha bound."""
        return self.count[w] + n <= self.cap[w] and (
            busy <= 0 or self.busy[w] + busy <= self.cpu[w]
        )

    def fits_anywhere(self, n: int, busy: float) -> bool:
        return any(n <= self.cap[w] and (busy <= 0 or busy <= self.cpu[w]) for w in self.workers)

    def put(self, w: str, n: int, busy: float) -> None:
        self.count[w] += n
        self.busy[w] += busy


def clusters(
    tasks: Sequence[str],
    rates: Mapping[Channel, float],
    busy: Mapping[str, float],
    fits: Callable[[int, float], bool],
    deviation: float = 1.0,
) -> list[list[str]]:
    """Step 2: ``tasks`` grouped by union-find along high, then medium channels (busiest
    first) while ``fits(tasks, busy time)`` of the merged group (some worker could take it
    under the bound). Every task is in exactly one group; groups keep the order of
    ``tasks``."""
    root = {t: t for t in tasks}
    members = {t: [t] for t in tasks}

    def find(t: str) -> str:
        while root[t] != t:
            t = root[t]
        return t

    classes = classify({c: r for c, r in rates.items() if c[0] in root and c[1] in root}, deviation)
    for s, t in (*classes.high, *classes.medium):
        rs, rt = find(s), find(t)
        if rs == rt:
            continue
        merged = members[rs] + members[rt]
        if fits(len(merged), sum(busy.get(x, 0.0) for x in merged)):
            root[rt] = rs
            members[rs] = merged
            del members[rt]
    order = {t: i for i, t in enumerate(tasks)}
    return [sorted(ms, key=order.__getitem__) for ms in members.values()]


def place(
    a: Abstraction,
    rates: Mapping[Channel, float],
    busy: Mapping[str, float],
    cfg: DscPlacementConfig,
) -> dict[str, str]:
    """Task -> worker for every task of ``a`` (steps 2 and 3 of the module docstring);
    ``busy`` is each task's measured busy fraction (missing: 0)."""
    tasks = [t.id for op in a.operators for t in op.tasks]
    now = {t: a.task(t).worker for t in tasks}
    workers = [w for w in a.workers if w.status == "alive"]
    if not workers:
        return now
    bins = _Bins(workers, cfg.alpha)
    groups = clusters(tasks, rates, busy, bins.fits_anywhere, cfg.deviation)
    order = {t: i for i, t in enumerate(tasks)}

    def internal(ms: list[str]) -> float:
        inside = set(ms)
        return sum(r for (s, t), r in rates.items() if s in inside and t in inside)

    # Step 3: clusters first (most internal traffic first), then single tasks.
    result: dict[str, str] = {}
    singles = [ms[0] for ms in groups if len(ms) == 1]
    for ms in sorted(
        (g for g in groups if len(g) > 1), key=lambda ms: (-internal(ms), order[ms[0]])
    ):
        load = sum(busy.get(t, 0.0) for t in ms)
        fits = [w for w in bins.workers if bins.fits(w, len(ms), load)]
        if not fits:
            singles.extend(ms)
            continue
        home = max(fits, key=lambda w: (sum(now[t] == w for t in ms), bins.cap[w] - bins.count[w]))
        bins.put(home, len(ms), load)
        result.update(dict.fromkeys(ms, home))
    share = math.ceil(len(tasks) / len(bins.workers))
    for t in sorted(singles, key=order.__getitem__):
        w = now[t]
        if w not in bins.count or bins.count[w] >= min(share, bins.slots[w]):
            w = min(bins.workers, key=lambda x: (bins.count[x] >= bins.slots[x], bins.count[x]))
        bins.put(w, 1, busy.get(t, 0.0))
        result[t] = w
    return result


class DscPlacement(Controller):
    """Re-places tasks to keep high-traffic channels inside workers (module docstring)."""

    config_class = DscPlacementConfig
    config: DscPlacementConfig

    def decide(self, view: View) -> Plan | None:
        cfg = self.config
        a = view.abstraction
        rates = {
            c: r
            for c, r in view.metrics.channel_rates(cfg.metric).items()
            if a.has_task(c[0]) and a.has_task(c[1]) and r > 0
        }
        total = sum(rates.values())
        if total <= 0:
            return None
        busy = {t.task: t.busy for t in view.metrics.tasks}
        now = {t.id: t.worker for op in a.operators for t in op.tasks}
        target = place(a, rates, busy, cfg)
        gain = cross_traffic(now, rates) - cross_traffic(target, rates)
        if gain < cfg.min_gain * total or gain <= 0:
            return None
        logger.info("re-placing: cross-worker traffic down by %.0f of %.0f", gain, total)
        builder = PlanBuilder(a)
        builder.add(
            [AssignResource(a.task(t).operator, t, target[t]) for t in now if target[t] != now[t]]
        )
        return builder.build(cfg.mode)
