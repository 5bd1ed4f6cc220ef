"""A DS2-style autoscaler: the parallelism of every operator in one step, from rates per
busy second, refined by the M/M/k model for latency.

DS2 (Kalavri et al., "Three steps is all you need: fast, accurate, automatic scaling
decisions for distributed streaming dataflows", OSDI 2018) sizes a dataflow from what its
operators do per second of *useful* time, not per second of the clock: an operator
waiting for input or for output credit says nothing of its capacity, so a saturated
operator and the backpressured ones upstream of it are not mistaken for slow ones. Each
period (``interval_s``):

1. *True rates.* An operator's true processing rate per task is the records it takes in
   per busy second (:meth:`MetricsWindow.service_rate`: total input over total busy time
   of its measured tasks); its selectivity, records out per record in, is its true output
   rate over its true processing rate (out/in: both are per the same busy seconds).
2. *Required rates* (:func:`required_inputs`), in topological order over the
   abstraction's operators and their inputs: a source must deliver what it delivered in
   the window (:func:`source_output`), plus what it fell behind by (its lag's growth since
   the last period, per second: records that arrived and could not be delivered), plus
   its lag (a partitioned source's partitions', a throttled generator's backlog) drained
   within ``backlog_drain_s``; every
   other operator must take in what its upstream operators must deliver (their required
   input times their selectivity) plus its own queued records drained within
   ``backlog_drain_s``.
3. *One step* (:func:`one_step`): each *stage* (an operator with the operators forward
   edges tie to it, which scale together: ``Abstraction.forward_group``) needs, for each
   member whose rate was measured, ``ceil(required rate / (true rate per task x
   target_utilization))`` tasks, and gets the largest; all stages are sized at once, not
   one task at a time.
4. *Latency* (:func:`sized`): the stages are then M/M/k queues (as in
   :mod:`.latency_autoscaler`, whose :class:`~.latency_autoscaler.Stage` is used): while
   the modelled latency exceeds ``target_latency_ms`` (default ``max_latency_ms / ln
   100``: the mean of an exponential sojourn whose p99 is the limit), a task is added
   where it cuts the most, up to ``max_tasks`` and the members' key groups.

The model takes the load as spread evenly over a stage's tasks; a keyed operator's key
groups are therefore assigned by their measured load in the same plan
(:func:`scale_plan`, ``MetricsWindow.key_group_loads``), not only evened out by count:
with skewed keys (the stock exchange's popular stocks) an even count left the hot groups'
load on one task, which then needed a second scale-out.

When it acts, DS2 sets every stage at once, to its *one-step size* (at
``target_utilization``, refined for ``target_latency_ms``) on overload and to its *size
with headroom* (at ``target_utilization x scale_in_headroom``, refined for
``scale_in_headroom`` x the latency target) when scaling in, up or down, in one plan:

- *Scale out* once the job was overloaded in ``overload_periods`` periods in a row
  (default 1: the first period that shows it) and some stage's one-step size exceeds its
  tasks. Overloaded means any of: the p99 latency at the sinks over ``max_latency_ms``;
  tasks upstream of a stage backpressured for at least ``backpressure_threshold`` of the
  window; a stage's queued records or a source's lag grown by more than :data:`GROWTH` of
  what came in over the period; a stage modelled busier than ``scale_out_utilization`` at
  its current tasks. An overload the model does not trace to any stage changes nothing.
- *Scale in* once some stage would have been busy at most ``scale_in_utilization`` with
  one task fewer, and its size with headroom was below its tasks, in ``scale_in_periods``
  periods in a row with no overload (such a stage gets the largest of its sizes over the
  streak). The check is on one task fewer and the size is at the headroom's utilization,
  which is higher: that gap is the hysteresis. Where a scale-in stops depends on where it
  starts: a load that one task takes busy 0.55 scales 3 tasks in to 1 (2 would be busy
  0.28), but leaves 2 as they are (1 would be busy 0.55); either size is stable.
- *Cool-down*: nothing for ``cooldown_s`` after any change of the job's parallelism (this
  controller's, seen in ``on_result``, or anyone's, seen in the view), on top of the
  host's safety cooldown; the overload and scale-in streaks start again after it. After a
  *scale-out* (a change that only added tasks), a further scale-out needs only wait until
  the new configuration is measured: ``scale_out_cooldown_s`` (3 s), and at least until
  the metrics window holds no report from before the change (the window's span plus
  :data:`REPORT_S`, the second a report covers: 3 s with the host's 2 s window).
  Earlier, the window would mix the old
  configuration's rates into the new one's. Until ``cooldown_s`` is over such a decision
  only adds tasks (a stage the model would shrink keeps its tasks), and scale-in waits:
  a scale-out is never followed by a scale-in, nor a scale-in by anything, sooner than
  ``cooldown_s``. A rate measured at one parallelism that does not hold at the next (a
  machine with fewer cores than tasks) thus costs one short cool-down, not a long one.

The bands are wider than noise: a stage sized to be busy at most 0.7 (scale-out) or 0.63
(0.7 x 0.9, scale-in) of the time scales out again only above 0.9, and in again only when
one task fewer would be busy at most 0.5, so a steady load varying by +-10% never makes a
second decision: each threshold is more than 1.1 / 0.9 (1.22) away from the sizes (0.63 /
0.5 = 1.26; 0.7 / 0.5 = 1.4; 0.9 / 0.7 = 1.29), and this is why a decision sizes every
stage, not only the one that triggered it. A scale-in leaves the stage's tasks at most
0.63 busy, so the load has to grow by 43% before it scales out again.

State between periods lives in the instance (the host keeps it alive). Sources are never
scaled (they cannot be rescaled live), nor stages with a broadcast
input (each task gets every record: more tasks do not relieve it), nor, in a period,
stages some task of which did not report in the window. A member too idle to measure
(busy below :data:`~controllers.metrics.MIN_BUSY`) needs one task. New tasks go to
``workers`` (empty: the least loaded; ``["new"]``: fresh ones); a stage whose new tasks
find no free slot is left as it is (logged).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.abstraction import Abstraction, Plan, WorkerOverCapacity

from ..base import Controller
from ..config import check
from ..metrics import MetricsWindow
from ..plans import PlanBuilder
from ..queueing import P99_OVER_MEAN
from ..view import Outcome, View
from .latency_autoscaler import Stage

__all__ = [
    "Ds2Autoscaler",
    "Ds2AutoscalerConfig",
    "one_step",
    "required_inputs",
    "scalable_groups",
    "scale_plan",
    "sized",
    "source_output",
    "stages",
]

logger = logging.getLogger(__name__)

GROWTH = 0.05  # a queue or lag growing by more than this share of the period's input is
# overload, not the ebb and flow of batches
MIN_CUT_MS = 0.1  # a task that cuts the modelled latency by less than this is not added
REPORT_S = 1.0  # a task's metrics report covers the second before it
# (runtime.worker.METRICS_INTERVAL_S): a window starting this long after a change holds
# nothing of the configuration before it
EPSILON = 1e-9  # rates that divide exactly need no extra task for rounding errors


@dataclass(frozen=True)
class Ds2AutoscalerConfig:
    interval_s: float = 1.0  # each second: a view's window is 2 s (the host's shortest),
    # so consecutive views overlap, which only makes an overload seen sooner
    max_latency_ms: float = 500.0  # limit on the p99 latency at the sinks (overload)
    target_latency_ms: float | None = None  # model's mean target; None: max / ln(100)
    target_utilization: float = 0.7  # one step sizes stages to be busy this fraction
    scale_out_utilization: float = 0.9  # overload: a stage modelled busier than this
    backpressure_threshold: float = 0.1  # overload: upstream blocked this fraction
    overload_periods: int = 1  # overloaded periods in a row before scaling out
    scale_in_utilization: float = 0.5  # over-provisioned: one task fewer as busy as this
    scale_in_periods: int = 10  # periods in a row over-provisioned to scale in
    scale_in_headroom: float = 0.9  # scale in to target_utilization (and latency) x this
    cooldown_s: float = 10.0  # no decision this long after a change of parallelism
    scale_out_cooldown_s: float = 3.0  # but a scale-out may follow a scale-out after this
    backlog_drain_s: float = 10.0  # queued records and source lag drained within this
    operators: tuple[str, ...] = ()  # operators to scale; empty: every rescalable one
    max_tasks: int = 32  # per operator
    workers: tuple[str, ...] = ()  # where new tasks go; empty: least loaded; ["new"]: fresh
    mode: Literal["pause", "fluid"] = "pause"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        check(self.max_latency_ms > 0, "max_latency_ms", "must be > 0", self.max_latency_ms)
        check(
            self.target_latency_ms is None or self.target_latency_ms > 0,
            "target_latency_ms",
            "must be > 0 (or null)",
            self.target_latency_ms,
        )
        for name in ("target_utilization", "scale_in_headroom", "backpressure_threshold"):
            value = getattr(self, name)
            check(0 < value <= 1, name, "must be in (0, 1]", value)
        check(
            self.target_utilization <= self.scale_out_utilization <= 1,
            "scale_out_utilization",
            f"must be in [target_utilization ({self.target_utilization:g}), 1]",
            self.scale_out_utilization,
        )
        most = self.target_utilization * self.scale_in_headroom
        check(
            0 < self.scale_in_utilization <= most,
            "scale_in_utilization",
            f"must be in (0, target_utilization x scale_in_headroom ({most:g})]",
            self.scale_in_utilization,
        )
        for name in ("overload_periods", "scale_in_periods", "max_tasks"):
            check(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in ("cooldown_s", "scale_out_cooldown_s"):
            check(getattr(self, name) >= 0, name, "must be >= 0", getattr(self, name))
        check(self.backlog_drain_s > 0, "backlog_drain_s", "must be > 0", self.backlog_drain_s)
        check_batch_size(self.batch_size, self.mode)

    @property
    def model_target_ms(self) -> float:
        return self.target_latency_ms or self.max_latency_ms / P99_OVER_MEAN


def check_batch_size(batch_size: int | None, mode: str) -> None:
    """A plan's ``batch_size`` (key groups per fluid step) needs fluid mode."""
    check(
        batch_size is None or (batch_size >= 1 and mode == "fluid"),
        "batch_size",
        "must be >= 1 and needs mode 'fluid'",
        batch_size,
    )


# -- the model (pure functions) ---------------------------------------------------------------


def required_inputs(
    a: Abstraction,
    source_out: Mapping[str, float],
    selectivity: Mapping[str, float],
    extra: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Records per second each non-source operator of ``a`` must take in for its sources
    to deliver ``source_out`` (records/s each, 0 when absent): in topological order, the
    sum over its inputs of what the upstream operator emits (a source its ``source_out``,
    others their required input times their ``selectivity``, 1.0 when absent), plus
    ``extra`` (records/s of its own, such as a backlog to drain)."""
    emits: dict[str, float] = {}
    need: dict[str, float] = {}
    for op in a.operators:
        if op.kind == "source":
            emits[op.name] = source_out.get(op.name, 0.0)
            continue
        need[op.name] = sum(emits[i.upstream] for i in op.inputs) + (extra or {}).get(op.name, 0.0)
        emits[op.name] = need[op.name] * selectivity.get(op.name, 1.0)
    return need


def source_output(a: Abstraction, m: MetricsWindow, source: str) -> float:
    """Records per second ``source`` delivered over the window: from the traffic matrix
    (records per second of the window on its tasks' channels, per reading operator, the
    most of them; broadcast readers left out), or, when no channel of it was measured, its
    tasks' output rate (per second of the time they accounted for)."""
    tasks = set(a.operator(source).task_ids)
    readers = {op.name for op, i in a.downstream(source) if i.partitioning != "broadcast"}
    sent: dict[str, float] = {}
    for c in m.traffic:
        reader = c.target.rpartition("-")[0]
        if c.source in tasks and reader in readers:
            sent[reader] = sent.get(reader, 0.0) + c.records_per_s
    return max(sent.values()) if sent else m.output_rate(source)


def scalable_groups(a: Abstraction, operators: Sequence[str] = ()) -> list[tuple[str, ...]]:
    """The forward groups of ``a`` an autoscaler may rescale, in topological order: none
    holding a source (sources cannot be rescaled live) or an operator with a broadcast
    input (each task gets every record: more tasks do not relieve it); with ``operators``,
    only the groups holding one of them."""
    groups: list[tuple[str, ...]] = []
    for op in a.operators:
        group = a.forward_group(op.name)
        members = [a.operator(name) for name in group]
        if (
            group in groups
            or any(m.kind == "source" for m in members)
            or any(i.partitioning == "broadcast" for m in members for i in m.inputs)
            or (operators and not set(group) & set(operators))
        ):
            continue
        groups.append(group)
    return groups


def group_cap(a: Abstraction, group: Sequence[str], max_tasks: int) -> int:
    """The most tasks a group may have: ``max_tasks``, and the key groups of its keyed
    members."""
    return min([max_tasks] + [a.operator(n).max_parallelism or max_tasks for n in group])


def stages(
    a: Abstraction,
    m: MetricsWindow,
    cfg: Ds2AutoscalerConfig,
    falling_behind: Mapping[str, float] | None = None,
) -> list[Stage]:
    """The stages to size this period (steps 1 and 2 of the module docstring), in
    topological order: each member's required input rate and true processing rate per
    task. ``falling_behind`` is, per source, how fast its lag grew since the last period
    (records/s): what arrived that it could not deliver, part of the rate to sustain.
    Groups some current task of which did not report in the window are left out."""
    selectivity = {
        op.name: m.output_rate(op.name) / rate
        for op in a.operators
        if (rate := m.input_rate(op.name)) > 0
    }
    drain = cfg.backlog_drain_s
    behind = falling_behind or {}
    source_out = {
        op.name: source_output(a, m, op.name)
        + behind.get(op.name, 0.0)
        + sum(m.source_lag(op.name).values()) / drain
        for op in a.operators
        if op.kind == "source"
    }
    backlog = {op.name: m.queue_length(op.name) / drain for op in a.operators}
    need = required_inputs(a, source_out, selectivity, backlog)
    result = []
    for group in scalable_groups(a, cfg.operators):
        if any(m.task(t) is None for name in group for t in a.operator(name).task_ids):
            continue
        rates = {name: (need[name], m.service_rate(name)) for name in group}
        tasks = a.operator(group[0]).parallelism
        result.append(Stage(group, rates, tasks, group_cap(a, group, cfg.max_tasks)))
    return result


def one_step(stage: Stage, utilization: float) -> int:
    """DS2's tasks for ``stage``: the most any measured member needs to serve its required
    rate busy ``utilization`` of the time (``ceil(lam / (mu x utilization))``), at least 1
    and at most the stage's cap."""
    need = [
        math.ceil(min(lam / (mu * utilization), stage.cap) - EPSILON)
        for lam, mu in stage.rates.values()
        if mu
    ]
    return min(max([1, *need]), stage.cap)


def sized(chain: Sequence[Stage], utilization: float, target_ms: float) -> dict[Stage, int]:
    """Tasks per stage: :func:`one_step` at ``utilization``, then one more task at a time
    where it cuts the modelled latency (summed over the chain) the most, while that is over
    ``target_ms``, some stage is under its cap and the best cut is worth it
    (:data:`MIN_CUT_MS`)."""
    k = {s: one_step(s, utilization) for s in chain}

    def cut(s: Stage) -> float:
        now = s.latency_ms(k[s])
        return math.inf if math.isinf(now) else now - s.latency_ms(k[s] + 1)

    while sum(s.latency_ms(n) for s, n in k.items()) > target_ms:
        growable = [s for s in k if k[s] < s.cap]
        best = max(growable, key=lambda s: (cut(s), s.utilization(k[s])), default=None)
        if best is None or cut(best) < MIN_CUT_MS:
            break
        k[best] += 1
    return k


# -- the controller --------------------------------------------------------------------------


class Ds2Autoscaler(Controller):
    """Scales every stage to its DS2 size in one step on overload, in with hysteresis
    (module docstring)."""

    config_class = Ds2AutoscalerConfig
    config: Ds2AutoscalerConfig

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._shape: tuple[tuple[str, int], ...] | None = None
        self._last_now: float | None = None  # the previous view's clock
        self._changed_at: float | None = None  # the last change of parallelism
        self._scaled_out = False  # whether it only added tasks
        self._overloaded = 0  # overloaded periods in a row
        self._shrink: dict[tuple[str, ...], list[int]] = {}  # scale-in sizes in a row
        self._levels: dict[str, tuple[float, float]] = {}  # queue or lag: (time, records)

    def on_result(self, outcome: Outcome) -> None:
        if outcome.applied:
            # What it changed shows in the next view (_note_changes); a plan that changed
            # no parallelism (failed, dry run) keeps the long cool-down.
            self._changed_at, self._scaled_out = outcome.time, False

    def decide(self, view: View) -> Plan | None:
        cfg = self.config
        self._note_changes(view)
        chain = stages(view.abstraction, view.metrics, cfg, self._falling_behind(view))
        symptoms = self.symptoms(view, chain)
        cooling = self.cooling(view)
        if cooling == "all":
            self._overloaded = 0
            self._shrink.clear()
            return None
        self._overloaded = self._overloaded + 1 if symptoms else 0
        if symptoms:
            self._shrink.clear()
            if self._overloaded < cfg.overload_periods:
                return None
            out = sized(chain, cfg.target_utilization, cfg.model_target_ms)
            if cooling == "scale_in":
                out = {s: max(n, s.tasks) for s, n in out.items()}
            if all(n <= s.tasks for s, n in out.items()):
                logger.info("overload the model does not trace to a stage: %s", symptoms)
                return None
            return self._plan(view, out, f"overload ({'; '.join(symptoms)})")
        if cooling == "scale_in":
            self._shrink.clear()
            return None
        headroom = cfg.scale_in_headroom
        smaller = sized(chain, cfg.target_utilization * headroom, cfg.model_target_ms * headroom)
        ready = False
        self._shrink = {s.operators: self._shrink.get(s.operators, []) for s in chain}
        for s in chain:
            fewer = s.tasks > 1 and s.utilization(s.tasks - 1) <= cfg.scale_in_utilization
            streak = self._shrink[s.operators]
            if fewer and smaller[s] < s.tasks:
                streak.append(smaller[s])
                ready = ready or len(streak) >= cfg.scale_in_periods
            else:
                streak.clear()
        if not ready:
            return None
        sizes = {s: max(self._shrink[s.operators], default=smaller[s]) for s in chain}
        return self._plan(view, sizes, "underload")

    def cooling(self, view: View) -> Literal["all", "scale_in"] | None:
        """What the cool-down holds back at ``view`` (module docstring): ``"all"``
        decisions, only ``"scale_in"`` (after a scale-out, once the new configuration is
        measured: a decision may then only add tasks), or nothing (None)."""
        if self._changed_at is None:
            return None
        cfg, age = self.config, view.now - self._changed_at
        if age >= cfg.cooldown_s:
            return None
        measured = max(cfg.scale_out_cooldown_s, view.metrics.window_s + REPORT_S)
        return "scale_in" if self._scaled_out and age >= measured else "all"

    def _note_changes(self, view: View) -> None:
        """A change of the job's parallelism since the previous view starts the cool-down
        (from the outcome's time when it was this controller's plan, else now), notes
        whether it only added tasks, and clears what was measured of the previous
        configuration."""
        shape = tuple((op.name, op.parallelism) for op in view.abstraction.operators)
        if self._shape is not None and shape != self._shape:
            since_result = (
                self._changed_at is not None
                and self._last_now is not None
                and self._changed_at >= self._last_now
            )
            if not since_result:
                self._changed_at = view.now
            self._scaled_out = all(
                new >= old for (_, new), (_, old) in zip(shape, self._shape, strict=True)
            )
            self._levels.clear()
        self._shape, self._last_now = shape, view.now

    def symptoms(self, view: View, chain: Sequence[Stage]) -> list[str]:
        """What shows this period that the job is overloaded (module docstring), each in a
        few words; records the queue and lag levels for the next period."""
        cfg, a, m = self.config, view.abstraction, view.metrics
        found = []
        if m.latency.count > 0 and m.latency.p99_ms > cfg.max_latency_ms:
            found.append(f"p99 {m.latency.p99_ms:.0f} ms over {cfg.max_latency_ms:g} ms")
        for s in chain:
            members = set(s.operators)
            feeding = {u.name for n in s.operators for u, _ in a.upstream(n)} - members
            blocked = max((t.backpressure for u in feeding for t in m.tasks_of(u)), default=0.0)
            if blocked >= cfg.backpressure_threshold:
                found.append(f"{'/'.join(sorted(feeding))} backpressured {blocked:.0%}")
            queued = sum(m.queue_length(n) for n in s.operators)
            inflow = sum(m.input_rate(n) for n in s.operators)
            if self._grew(f"queue:{s.operators}", queued, inflow, view.now):
                found.append(f"queue of {'/'.join(s.operators)} growing ({queued} records)")
            if s.utilization(s.tasks) > cfg.scale_out_utilization:
                found.append(f"{'/'.join(s.operators)} at {s.utilization(s.tasks):.0%}")
        for op in a.operators:
            if op.kind == "source":
                lag = sum(m.source_lag(op.name).values())
                if self._grew(f"lag:{op.name}", lag, m.output_rate(op.name), view.now):
                    found.append(f"lag of {op.name} growing ({lag} records)")
        return found

    def _falling_behind(self, view: View) -> dict[str, float]:
        """Per source, records/s its lag grew since the previous period (0 if it shrank or
        was not measured): the part of its input rate it could not deliver."""
        found = {}
        for op in view.abstraction.operators:
            before = self._levels.get(f"lag:{op.name}")
            if op.kind != "source" or before is None or view.now <= before[0]:
                continue
            lag = sum(view.metrics.source_lag(op.name).values())
            found[op.name] = max(0.0, (lag - before[1]) / (view.now - before[0]))
        return found

    def _grew(self, key: str, level: float, rate: float, now: float) -> bool:
        """Whether ``level`` grew since the previous period by more than :data:`GROWTH` of
        what came in meanwhile at ``rate`` records/s; records it for the next period."""
        before = self._levels.get(key)
        self._levels[key] = (now, level)
        if before is None:
            return False
        then, previous = before
        return level - previous > max(0.0, GROWTH * rate * (now - then))

    def _plan(self, view: View, sizes: Mapping[Stage, int], why: str) -> Plan | None:
        cfg = self.config
        groups = {stage.operators: n for stage, n in sizes.items()}
        loads = {name: view.metrics.key_group_loads(name) for group in groups for name in group}
        return scale_plan(
            view.abstraction, groups, why, cfg.workers, cfg.mode, cfg.batch_size, loads=loads
        )


def scale_plan(
    a: Abstraction,
    sizes: Mapping[tuple[str, ...], int],
    why: str,
    workers: Sequence[str] = (),
    mode: Literal["pause", "fluid"] = "pause",
    batch_size: int | None = None,
    log: logging.Logger = logger,
    loads: Mapping[str, Mapping[int, float]] | None = None,
) -> Plan | None:
    """One plan scaling each forward group of ``a`` (named by its operators) to its size,
    new tasks on ``workers`` (empty: the least loaded); a group whose new tasks find no
    worker with a free slot is left as it is (logged). A keyed operator of a group with
    measured ``loads`` (operator -> key group -> records/s) then has its key groups
    balanced by load, not only by count: with skewed keys an even count puts the hot
    groups' load on one task, which the model sized as if the load were even. None when
    nothing changes."""
    builder = PlanBuilder(a)
    for group, n in sizes.items():
        current = a.operator(group[0]).parallelism
        if n == current:
            continue
        log.info("%s: %s from %d to %d tasks", why, "/".join(group), current, n)
        try:
            builder.scale(group[0], n, workers=list(workers) or None)
        except WorkerOverCapacity as exc:
            log.warning("cannot scale %s to %d tasks: %s", "/".join(group), n, exc)
            continue
        for name in group:
            measured = (loads or {}).get(name)
            if measured and sum(measured.values()) > 0 and a.operator(name).keyed:
                builder.rebalance(name, measured)
    return builder.build(mode, batch_size)
