"""Trisk's load balancer with TAG's time-aware key grouping.

Trisk's load balancer reads, every period, how many records each key group of a keyed
operator received, and when the tasks' loads are imbalanced it reassigns key groups with
as few moves as possible. TAG (time-aware grouping) observes that on heterogeneous
workers equal record counts are not equal work: it measures how fast each task
processes records and gives each task load in proportion to its speed.

Each period, for every keyed operator (``operators``, default all) receiving at least
``min_rate`` records per second:

1. ``loads``: records per second of each key group (``MetricsWindow.key_group_loads``),
   summed per task by the abstraction's current ownership.
2. ``speeds``: each task's records per busy second (``MetricsWindow.processing_speeds``),
   measured on tasks busy at least ``min_busy`` of the window (on an idle task the cost
   per record is mostly per-batch overhead, which falls as batches fill: it says nothing
   of the worker's speed); the others get the mean of the measured ones. With
   ``time_aware`` off, or nothing measured, every speed is 1, which balances records as
   Trisk does.
3. The imbalance is ``(max - mean) / mean`` of ``load / speed`` (the busy time each task
   needs). Over ``threshold`` the operator is rebalanced until at most ``target`` (the
   gap between the two is the hysteresis that keeps noise from moving groups back and
   forth): with equal speeds by the abstraction's
   :func:`~controlplane.abstraction.rebalance` (:func:`greedy_balance`), otherwise by
   :func:`proportional_balance`, the same greedy with each task's load divided by its
   speed. Both move one key group at a time from the most to the least loaded task;
   ``max_moves`` caps the moves of one plan (the greedy then goes on next period).

With ``stateless`` on, non-keyed operators fed by a rebalance edge get weights inversely
proportional to their measured cost per record (TAG for stateless tasks, through
``rebalance``'s weights), under the same threshold. All changes go in one plan.

**Hot keys** (TAG's key splitting). Moving key groups cannot help when one key alone
needs more than a task can give. With ``split_hot_keys`` on, for every combinable
aggregation (``key_by(...).aggregate(...)`` and ``key_by(...).window_aggregate(...)``,
whose hot keys a plan may split), before
balancing: a key that its tasks' Space-Saving sketches report
(``MetricsWindow.hot_keys``) at more than ``split_above`` of its task's capacity (the
task's records per busy second, as above) is split over ``ceil(rate / (split_above x
capacity))`` tasks (at least 2, at most all of them): its owner and the least loaded
others; a split key that needs more ways than it has is split again, wider; one whose
rate fell under ``merge_below`` of a task's capacity is merged back. A period that
splits or merges changes nothing else (the loads it measured are those of the old
routing): the balancing of key groups resumes next period, on the new loads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.abstraction import AssignWorkload, Operator, Plan, PlanError, imbalance

from ..base import Controller
from ..config import check
from ..metrics import MIN_BUSY, MetricsWindow
from ..plans import PlanBuilder
from ..view import View

__all__ = ["LoadBalancer", "LoadBalancerConfig", "proportional_balance", "task_speeds"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadBalancerConfig:
    interval_s: float = 10.0
    threshold: float = 0.2  # rebalance when (max - mean) / mean of task loads exceeds this
    target: float = 0.05  # ... down to this imbalance (hysteresis)
    operators: tuple[str, ...] = ()  # keyed operators to balance; empty: all of them
    time_aware: bool = True  # TAG: load in proportion to each task's measured speed
    stateless: bool = True  # also weight non-keyed tasks behind rebalance edges by speed
    min_rate: float = 1.0  # records/s below which an operator's loads are noise
    min_busy: float = 0.1  # speeds of tasks idler than this are per-batch overhead, not speed
    max_moves: int | None = None  # key groups one plan may move (keep it within the safety
    #                               limit's max_moves_per_hour, or the plan is refused)
    mode: Literal["pause", "fluid"] = "pause"
    batch_size: int | None = None
    split_hot_keys: bool = True  # split keys too hot for one task (combinable aggregations)
    split_above: float = 0.5  # ... above this fraction of a task's capacity, each part under
    merge_below: float = 0.2  # merge a split key back below this fraction (hysteresis)

    def __post_init__(self) -> None:
        check(self.threshold >= 0, "threshold", "must be >= 0", self.threshold)
        check(0 < self.split_above <= 1, "split_above", "must be in (0, 1]", self.split_above)
        check(
            0 <= self.merge_below < self.split_above,
            "merge_below",
            f"must be >= 0 and below split_above ({self.split_above:g})",
            self.merge_below,
        )
        check(
            0 <= self.target <= self.threshold,
            "target",
            f"must be between 0 and threshold ({self.threshold:g})",
            self.target,
        )
        check(self.min_rate >= 0, "min_rate", "must be >= 0", self.min_rate)
        check(0 <= self.min_busy <= 1, "min_busy", "must be in [0, 1]", self.min_busy)
        check(
            self.max_moves is None or self.max_moves >= 1,
            "max_moves",
            "must be >= 1 (or null: no limit)",
            self.max_moves,
        )
        check(
            self.batch_size is None or (self.batch_size >= 1 and self.mode == "fluid"),
            "batch_size",
            "must be >= 1 and needs mode 'fluid'",
            self.batch_size,
        )


def task_speeds(
    metrics: MetricsWindow, tasks: Sequence[str], min_busy: float = MIN_BUSY
) -> dict[str, float]:
    """Records per busy second of each of ``tasks`` (an operator's), measured on tasks busy
    at least ``min_busy``; the others get the mean of the measured ones, and every task gets
    1.0 when none was measured."""
    operators = {t.rpartition("-")[0] for t in tasks}
    measured: dict[str, float] = {}
    for op in operators:
        measured.update(metrics.processing_speeds(op, min_busy))
    known = [measured[t] for t in tasks if t in measured]
    fill = sum(known) / len(known) if known else 1.0
    return {t: measured.get(t, fill) for t in tasks}


def proportional_balance(
    current: Mapping[str, Sequence[int]],
    loads: Mapping[int, float],
    speeds: Mapping[str, float],
    target: float = 0.0,
    max_moves: int | None = None,
) -> dict[str, tuple[int, ...]]:
    """Key groups moved one at a time so that each task's load is proportional to its
    speed: :func:`~controlplane.abstraction.greedy_balance` on ``load / speed``.

    Each step takes the task with the highest ``load / speed`` (``hi``) and the lowest
    (``lo``) and moves the group of ``hi`` that leaves the larger of the two smallest,
    among the moves that leave both below ``hi``'s value now (ties: the lower group). It
    stops when the :func:`imbalance` of ``load / speed`` is at most ``target``, no move
    qualifies or ``max_moves`` steps were made; each step lowers the sorted vector of
    values, so it always stops. Groups missing from ``loads`` weigh 0; ``speeds`` must be
    > 0 for every task.
    """
    order = list(current)
    owned = {t: set(current[t]) for t in order}
    task_load = {t: sum(loads.get(g, 0.0) for g in owned[t]) for t in order}

    def busy(t: str) -> float:
        return task_load[t] / speeds[t]

    steps = sum(len(gs) for gs in owned.values()) * len(order) + 1
    for _ in range(steps if max_moves is None else min(steps, max_moves)):
        if imbalance(busy(t) for t in order) <= target:
            break
        hi = max(order, key=lambda t: (busy(t), -order.index(t)))
        lo = min(order, key=lambda t: (busy(t), order.index(t)))
        top = busy(hi)
        best: tuple[float, int] | None = None
        for g in sorted(owned[hi]):
            load = loads.get(g, 0.0)
            if load <= 0:
                continue
            after = max((task_load[hi] - load) / speeds[hi], (task_load[lo] + load) / speeds[lo])
            if after < top and (best is None or after < best[0]):
                best = (after, g)
        if best is None:
            break
        g = best[1]
        owned[hi].remove(g)
        owned[lo].add(g)
        task_load[hi] -= loads[g]
        task_load[lo] += loads[g]
    return {t: tuple(sorted(owned[t])) for t in order}


class LoadBalancer(Controller):
    """Rebalances skewed keyed operators (module docstring). Stateless between periods."""

    config_class = LoadBalancerConfig
    config: LoadBalancerConfig

    def decide(self, view: View) -> Plan | None:
        cfg = self.config
        builder = PlanBuilder(view.abstraction)
        if cfg.split_hot_keys:
            for op in view.abstraction.operators:
                if op.combinable and (not cfg.operators or op.name in cfg.operators):
                    self._split_hot_keys(builder, op, view.metrics)
            if builder.ops:
                return builder.build(cfg.mode, cfg.batch_size)
        for op in view.abstraction.operators:
            if cfg.operators and op.name not in cfg.operators:
                continue
            if op.keyed:
                self._balance_keyed(builder, op, view.metrics)
            elif cfg.stateless and any(i.partitioning == "rebalance" for i in op.inputs):
                self._balance_weights(builder, op, view.metrics)
        return builder.build(cfg.mode, cfg.batch_size)

    def _balance_keyed(self, builder: PlanBuilder, op: Operator, metrics: MetricsWindow) -> None:
        cfg = self.config
        groups = range(op.max_parallelism or 0)
        loads = {g: v for g, v in metrics.key_group_loads(op.name).items() if g in groups}
        if sum(loads.values()) < max(cfg.min_rate, 1e-9):
            return
        current = {t.id: t.workload.key_groups or () for t in op.tasks}
        speeds = task_speeds(metrics, list(current), cfg.min_busy) if cfg.time_aware else {}
        uniform = not speeds or max(speeds.values()) <= min(speeds.values()) * (1 + 1e-9)
        per_task = {t: sum(loads.get(g, 0.0) for g in gs) for t, gs in current.items()}
        before = imbalance(per_task[t] / speeds.get(t, 1.0) for t in current)
        if before <= cfg.threshold:
            return
        logger.info(
            "operator %r: imbalance %.2f > %.2f, rebalancing", op.name, before, cfg.threshold
        )
        if uniform and cfg.max_moves is None:
            builder.rebalance(op.name, loads, threshold=cfg.target)
            return
        if uniform:
            speeds = dict.fromkeys(current, 1.0)
        after = proportional_balance(current, loads, speeds, cfg.target, cfg.max_moves)
        changed = {t: gs for t, gs in after.items() if gs != current[t]}
        if changed:
            builder.add(AssignWorkload(op.name, changed))

    def _split_hot_keys(self, builder: PlanBuilder, op: Operator, metrics: MetricsWindow) -> None:
        """Split, widen or merge back the hot keys of ``op`` (module docstring)."""
        cfg = self.config
        speeds = task_speeds(metrics, list(op.task_ids), cfg.min_busy)
        rates: dict[Any, float] = {}  # a split key is reported by each of its parts' tasks
        for h in metrics.hot_keys(op.name):
            if not h.key_repr:
                rates[h.key] = rates.get(h.key, 0.0) + h.per_s
        loads = metrics.task_loads(op.name)
        for key, groups in op.splits().items():
            capacity = _capacity(speeds, op, groups)
            if rates.get(key, 0.0) < cfg.merge_below * capacity:
                logger.info("operator %r: merging key %r back", op.name, key)
                builder.split_key(op.name, key, [])
        split = op.splits()
        for key, rate in rates.items():
            owner = op.owner_of_key(key)
            capacity = speeds.get(owner, 0.0)
            if capacity <= 0 or rate <= cfg.split_above * capacity:
                continue
            ways = min(op.parallelism, max(2, math.ceil(rate / (cfg.split_above * capacity))))
            if ways <= len(split.get(key, ())):
                continue
            others = sorted((t for t in op.task_ids if t != owner), key=lambda t: loads.get(t, 0.0))
            logger.info("operator %r: key %r at %.0f/s, split %d ways", op.name, key, rate, ways)
            try:
                builder.split_key(op.name, key, [owner, *others[: ways - 1]])
            except PlanError as exc:  # e.g. a task that owns no key group to hold a part
                logger.warning("operator %r: cannot split key %r: %s", op.name, key, exc)

    def _balance_weights(self, builder: PlanBuilder, op: Operator, metrics: MetricsWindow) -> None:
        cfg = self.config
        if metrics.input_rate(op.name) < max(cfg.min_rate, 1e-9):
            return
        speeds = metrics.processing_speeds(op.name, cfg.min_busy) if cfg.time_aware else {}
        costs = {t: 1.0 / s for t, s in speeds.items() if t in op.task_ids}
        builder.rebalance(op.name, costs, threshold=cfg.threshold)


def _capacity(speeds: Mapping[str, float], op: Operator, groups: Sequence[int]) -> float:
    """Records per busy second of the task owning the first of ``groups`` (a split key's
    home), or of the operator's tasks on average."""
    owners = op.owner_of_groups()
    task = owners.get(groups[0]) if groups else None
    if task in speeds:
        return speeds[task]
    return sum(speeds.values()) / len(speeds) if speeds else 0.0
