"""The decision rule of the Flink Kubernetes operator's autoscaler, as a policy to compare
with.

Reimplemented from the operator's documentation, release 1.10 (the autoscaler page and
the "Autoscaler Configuration" table of the configuration page):
https://nightlies.apache.org/flink/flink-kubernetes-operator-docs-release-1.10/docs/custom-resource/autoscaler/
and .../docs/operations/configuration/#autoscaler-configuration (the same table as the
repository's ``docs/layouts/shortcodes/generated/auto_scaler_configuration.html`` at that
release); where the documentation leaves a detail out (rounding, the clamping of the scale
factor, the key-group alignment) it follows the operator's ``AutoScalerUtils`` and
``JobVertexScaler``. The defaults of :class:`FlinkAutoscalerConfig` are that release's, kept
literally even where they mean the policy never acts in a short run (that is the
comparison's point); every window is a config field, so a test can shorten it:

=====================================  ====================================  =========
Flink option (``job.autoscaler.*``)    field                                 default
=====================================  ====================================  =========
``metrics.window``                     ``metrics_window_s``                  15 min
``stabilization.interval``             ``stabilization_interval_s``          5 min
``target.utilization``                 ``target_utilization``                0.7
``target.utilization.boundary``        ``target_utilization_boundary``       0.3
``scale-up.max-factor``                ``scale_up_max_factor``               100000.0
``scale-down.max-factor``              ``scale_down_max_factor``             0.6
``catch-up.duration``                  ``catch_up_duration_s``               30 min
``restart.time``                       ``restart_time_s``                    5 min
``scale-down.interval``                ``scale_down_interval_s``             1 h
``backlog-processing.lag-threshold``   ``backlog_lag_threshold_s``           5 min
``vertex.min-parallelism``             ``vertex_min_parallelism``            1
``vertex.max-parallelism``             ``vertex_max_parallelism``            200
=====================================  ====================================  =========

``interval_s`` is the operator's reconcile interval (``kubernetes.operator.reconcile
.interval``, 60 s), at which it collects metrics and decides. Flink's job vertex (a chain
of operators) is a forward group here (``Abstraction.forward_group``, which scales
together); sources are not scaled (they cannot be rescaled live here), and the
busy-time aggregator is Flink's default, MAX. Left out: memory tuning, quotas, excluded
periods, the ineffective-scaling detection (off by default) and the switch to an observed
true processing rate while catching up on lag. The rule, each period:

1. *Stabilization.* After the job (re)starts, which here is when the controller first
   sees it and after every change of its parallelism, no metrics are collected for
   ``stabilization_interval_s``.
2. *Metrics window.* Then one observation per period is kept (each operator's input and
   output rates and its tasks' largest busy fraction; each source's lag), those older
   than ``metrics_window_s`` dropped; nothing is evaluated until the collection has
   covered a whole window (so the first decision comes ``stabilization_interval_s +
   metrics_window_s`` after a start or a rescale, at the earliest).
3. *Rates*, averaged over the window: an operator's true processing rate (TPR) is its
   input rate over its busiest task's busy fraction (infinite with no input: that allows
   scale-down); a source's target data rate is its output rate plus the growth rate of its
   lag, and downstream operators' are their upstream ones' times the upstream output
   ratios (out/in), summed over inputs; the catch-up data rate is each source's current
   lag over ``catch_up_duration_s``, propagated the same way (0 when that is 0: backlog
   scaling off).
4. *Target capacity* (``AutoScalerUtils.getTargetProcessingCapacity``): ``catch-up rate +
   target rate x restart_time / catch_up_duration + target rate / target_utilization``,
   rounded. The scale factor ``target capacity / TPR`` is clamped to ``[1 -
   scale_down_max_factor, 1 + scale_up_max_factor]``; the new parallelism is ``ceil(factor
   x current)`` within ``[min(current, vertex_min_parallelism), max(current,
   vertex_max_parallelism)]`` and the key groups. A group is one Flink vertex: its member
   with the largest scale factor (its bottleneck) gives the factor and its place against
   the bounds of step 5; a group fed by a hash (key-group) edge has its parallelism
   aligned to the key groups (:func:`align`, mode EVENLY_SPREAD). A source's output is
   read as :func:`~.ds2_autoscaler.source_output` does.
5. *Utilization bounds*: an operator is within them when ``scale-up threshold <= TPR <=
   scale-down threshold``, the thresholds being the target capacity at ``target_utilization
   +- target_utilization_boundary`` (up: without the restart term; down: infinite while a
   source is more than ``backlog_lag_threshold_s`` of input behind). If every group whose
   parallelism would change is within them, nothing is done.
6. *Delayed scale-down*: a scale-down is not applied when first recommended; it is
   applied once ``scale_down_interval_s`` has passed since then, at the largest
   parallelism recommended within the last interval. A recommendation of no change or of
   a scale-up forgets the pending scale-down.
7. Every group that changes goes into one plan.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.abstraction import Abstraction, Plan

from ..base import Controller
from ..config import check
from ..metrics import MetricsWindow
from ..view import Outcome, View
from .ds2_autoscaler import (
    check_batch_size,
    group_cap,
    required_inputs,
    scalable_groups,
    scale_plan,
    source_output,
)

__all__ = ["FlinkAutoscaler", "FlinkAutoscalerConfig", "Observation", "align", "evaluate"]

logger = logging.getLogger(__name__)

MINUTE = 60.0


@dataclass(frozen=True)
class FlinkAutoscalerConfig:
    interval_s: float = 60.0  # kubernetes.operator.reconcile.interval
    metrics_window_s: float = 15 * MINUTE
    stabilization_interval_s: float = 5 * MINUTE
    target_utilization: float = 0.7
    target_utilization_boundary: float = 0.3
    scale_up_max_factor: float = 100000.0
    scale_down_max_factor: float = 0.6  # the scale factor is at least 1 - this
    catch_up_duration_s: float = 30 * MINUTE
    restart_time_s: float = 5 * MINUTE
    scale_down_interval_s: float = 60 * MINUTE
    backlog_lag_threshold_s: float = 5 * MINUTE
    vertex_min_parallelism: int = 1
    vertex_max_parallelism: int = 200
    operators: tuple[str, ...] = ()  # operators to scale; empty: every rescalable one
    workers: tuple[str, ...] = ()  # where new tasks go; empty: least loaded; ["new"]: fresh
    mode: Literal["pause", "fluid"] = "pause"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "metrics_window_s",
            "stabilization_interval_s",
            "catch_up_duration_s",
            "restart_time_s",
            "scale_down_interval_s",
            "backlog_lag_threshold_s",
        ):
            check(getattr(self, name) >= 0, name, "must be >= 0 seconds", getattr(self, name))
        check(
            0 < self.target_utilization <= 1,
            "target_utilization",
            "must be in (0, 1]",
            self.target_utilization,
        )
        check(
            self.target_utilization_boundary >= 0,
            "target_utilization_boundary",
            "must be >= 0",
            self.target_utilization_boundary,
        )
        check(
            self.scale_up_max_factor >= 0,
            "scale_up_max_factor",
            "must be >= 0",
            self.scale_up_max_factor,
        )
        check(
            0 <= self.scale_down_max_factor <= 1,
            "scale_down_max_factor",
            "must be in [0, 1]",
            self.scale_down_max_factor,
        )
        check(
            self.vertex_min_parallelism >= 1,
            "vertex_min_parallelism",
            "must be >= 1",
            self.vertex_min_parallelism,
        )
        check(
            self.vertex_max_parallelism >= self.vertex_min_parallelism,
            "vertex_max_parallelism",
            f"must be >= vertex_min_parallelism ({self.vertex_min_parallelism})",
            self.vertex_max_parallelism,
        )
        check_batch_size(self.batch_size, self.mode)

    def capacity(self, target: float, catch_up: float, utilization: float, restart: bool) -> float:
        """Step 4's target capacity for a target data rate and a catch-up data rate (records/s)
        at ``utilization`` (clamped to [0, 1]; infinite at 0), with the restart term or not,
        rounded half up as Java's ``Math.round``."""
        utilization = min(1.0, max(0.0, utilization))
        if utilization == 0:
            return math.inf
        restart_rate = (
            target * self.restart_time_s / self.catch_up_duration_s
            if restart and self.catch_up_duration_s > 0
            else 0.0
        )
        return float(math.floor(catch_up + restart_rate + target / utilization + 0.5))


@dataclass(frozen=True)
class Observation:
    """One period's metrics as step 2 keeps them: per operator that reported ``(in/s,
    out/s, busiest task's busy fraction)``; per source the records it is behind."""

    time: float
    rates: Mapping[str, tuple[float, float, float]]
    lag: Mapping[str, float]

    @classmethod
    def of(cls, a: Abstraction, m: MetricsWindow, now: float) -> Observation:
        """The observation of one view's window (a source's output: :func:`source_output`)."""
        rates = {
            op.name: (
                m.input_rate(op.name),
                source_output(a, m, op.name) if op.kind == "source" else m.output_rate(op.name),
                max((t.busy for t in m.tasks_of(op.name)), default=0.0),
            )
            for op in a.operators
            if m.tasks_of(op.name)
        }
        lag = {
            op.name: float(sum(m.source_lag(op.name).values()))
            for op in a.operators
            if op.kind == "source"
        }
        return cls(now, rates, lag)

    def true_processing_rate(self, operator: str) -> float:
        """Records per second the operator's tasks would take in all busy (infinite with no
        input or no busy time: Flink's allowance for scale-down)."""
        rate, _, busy = self.rates[operator]
        return rate / busy if rate > 0 and busy > 0 else math.inf


def align(p: int, current: int, key_groups: int, lower: int, upper: int) -> int:
    """Flink's EVENLY_SPREAD alignment of a keyed operator's new parallelism ``p`` to its
    ``key_groups`` (as the operator's ``JobVertexScaler.scale`` does): the first divisor of
    the key groups from ``p`` up to ``upper`` (to ``current`` for a scale-down); failing
    that, going down from ``p``, the parallelism where a task's share of key groups grows
    (one above it when it does not divide them), at least ``lower``; ``current`` when that
    would turn a scale-up into a scale-down or the reverse."""
    if p == current:
        return p
    up = p > current
    top = min(key_groups, upper) if up else min(current, key_groups, upper)
    for q in range(p, top + 1):
        if key_groups % q == 0:
            return q
    q = p
    while q > 0:
        if key_groups // q > key_groups // p:
            q += 1 if key_groups % q else 0
            break
        q -= 1
    q = max(q, lower)
    if (up and q <= current) or (not up and q >= current):
        return current
    return q


def evaluate(
    a: Abstraction, window: Sequence[Observation], cfg: FlinkAutoscalerConfig
) -> dict[tuple[str, ...], tuple[int, bool]]:
    """Steps 3 to 5 over the observations of one window (oldest first): for each rescalable
    group of ``a``, its recommended parallelism and whether it is outside its utilization
    bounds. Metrics are averaged over the observations in which the operator reported; a
    group with a member that never did is left out (Flink: no rate, no decision)."""

    def mean(name: str, value: Callable[[Observation], float]) -> float:
        values = [value(o) for o in window if name in o.rates]
        return statistics.fmean(values) if values else math.nan

    sources = [op.name for op in a.operators if op.kind == "source"]
    growth = {s: 0.0 for s in sources}
    span = window[-1].time - window[0].time
    if span > 0:
        growth = {s: (window[-1].lag[s] - window[0].lag[s]) / span for s in sources}
    ins = {op.name: mean(op.name, lambda o, n=op.name: o.rates[n][0]) for op in a.operators}
    out = {op.name: mean(op.name, lambda o, n=op.name: o.rates[n][1]) for op in a.operators}
    target_out = {s: max(0.0, out[s] + growth[s]) for s in sources if not math.isnan(out[s])}
    ratio = {name: out[name] / rate for name, rate in ins.items() if rate > 0}
    target = required_inputs(a, target_out, ratio)
    lag = window[-1].lag
    catch = cfg.catch_up_duration_s
    catch_up = required_inputs(a, {s: lag[s] / catch if catch else 0.0 for s in sources}, ratio)
    backlogged = any(
        rate > 0 and lag[s] / rate > cfg.backlog_lag_threshold_s for s, rate in target_out.items()
    )
    result = {}
    for group in scalable_groups(a, cfg.operators):
        tprs = {name: mean(name, lambda o, n=name: o.true_processing_rate(n)) for name in group}
        if any(math.isnan(tpr) for tpr in tprs.values()):
            continue
        # The bottleneck: the member with the largest scale factor.
        factor, outside = max(
            _member(tpr, target[name], catch_up[name], backlogged, cfg)
            for name, tpr in tprs.items()
        )
        result[group] = (_parallelism(a, group, factor, cfg), outside)
    return result


def _member(
    tpr: float, target: float, catch_up: float, backlogged: bool, cfg: FlinkAutoscalerConfig
) -> tuple[float, bool]:
    """Steps 4 and 5 for one operator: its scale factor (clamped) and whether its TPR is
    outside its utilization bounds."""
    u, boundary = cfg.target_utilization, cfg.target_utilization_boundary
    factor = cfg.capacity(target, catch_up, u, restart=True) / tpr
    factor = min(max(factor, 1 - cfg.scale_down_max_factor), 1 + cfg.scale_up_max_factor)
    up_threshold = cfg.capacity(target, catch_up, u + boundary, restart=False)
    down_threshold = (
        math.inf if backlogged else cfg.capacity(target, catch_up, u - boundary, restart=True)
    )
    return factor, not up_threshold <= tpr <= down_threshold


def _parallelism(
    a: Abstraction, group: tuple[str, ...], factor: float, cfg: FlinkAutoscalerConfig
) -> int:
    """Step 4's new parallelism of ``group`` for a scale factor: within the vertex bounds
    and the key groups of its keyed members, aligned to them when one is fed by a hash
    (key-group) edge."""
    current = a.operator(group[0]).parallelism
    lower = min(current, cfg.vertex_min_parallelism)
    upper = group_cap(a, group, max(current, cfg.vertex_max_parallelism))
    p = min(max(math.ceil(factor * current), lower), upper)
    for op in (a.operator(name) for name in group):
        if op.max_parallelism and any(i.partitioning == "key_groups" for i in op.inputs):
            return align(p, current, op.max_parallelism, lower, upper)
    return p


class FlinkAutoscaler(Controller):
    """The Flink Kubernetes operator autoscaler's decision rule (module docstring)."""

    config_class = FlinkAutoscalerConfig
    config: FlinkAutoscalerConfig

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._shape: tuple[tuple[str, int], ...] | None = None
        self._started: float | None = None  # the job's (re)start, as this policy sees it
        self._window: list[Observation] = []
        self._scale_downs: dict[tuple[str, ...], list[tuple[float, int]]] = {}

    def on_result(self, outcome: Outcome) -> None:
        if outcome.applied:  # the job restarts with its new parallelism (or would: dry run)
            self._restart(outcome.time)

    def _restart(self, now: float) -> None:
        self._started = now
        self._window.clear()
        self._scale_downs.clear()

    def decide(self, view: View) -> Plan | None:
        cfg, a = self.config, view.abstraction
        shape = tuple((op.name, op.parallelism) for op in a.operators)
        if shape != self._shape:
            self._shape = shape
            self._restart(view.now)
        assert self._started is not None
        # Step 1.
        collecting_since = self._started + cfg.stabilization_interval_s
        if view.now < collecting_since:
            return None
        # Step 2.
        if view.metrics.samples > 0:
            self._window.append(Observation.of(a, view.metrics, view.now))
        self._window = [o for o in self._window if o.time >= view.now - cfg.metrics_window_s]
        if view.now < collecting_since + cfg.metrics_window_s or not self._window:
            return None
        # Steps 3 to 5.
        recommended = evaluate(a, self._window, cfg)
        changes = {}
        for group, (p, outside) in recommended.items():
            current = a.operator(group[0]).parallelism
            # Step 6.
            if p < current:
                p = self._delayed_scale_down(group, p, current, view.now)
            else:
                self._scale_downs.pop(group, None)
            if p != current:
                changes[group] = (p, outside)
        if not changes or not any(outside for _, outside in changes.values()):
            return None
        # Step 7.
        sizes = {group: p for group, (p, _) in changes.items()}
        return scale_plan(a, sizes, "rescale", cfg.workers, cfg.mode, cfg.batch_size, logger)

    def _delayed_scale_down(self, group: tuple[str, ...], p: int, current: int, now: float) -> int:
        """Step 6 for a recommended scale-down of ``group`` from ``current`` to ``p``:
        ``current`` while the interval since the first recommendation runs, then the
        largest recommendation within the last interval."""
        interval = self.config.scale_down_interval_s
        if interval <= 0:
            return p
        pending = self._scale_downs.setdefault(group, [])
        pending.append((now, p))
        if now - pending[0][0] < interval:
            return current
        return max(q for t, q in pending if t >= now - interval)
