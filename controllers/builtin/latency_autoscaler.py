"""A latency-aware autoscaler: eSault's overload and underload detection, Elasticutor's
queueing model for how many tasks each operator needs.

Detection (eSault), one observation per period:

- *overload*: the end-to-end p99 latency at the sinks (the probe) exceeded
  ``max_latency_ms`` in more than ``overload_factor`` of the last ``overload_window``
  periods (periods with no latency measured do not count);
- *underload*: the job's input rate (records/s out of its sources) stayed below
  ``low_watermark`` times its peak over the last ``peak_window`` periods for
  ``underload_window`` periods in a row, with no overload and no probe over the limit.

Sizing (Elasticutor): each *stage*, an operator together with the operators linked to it
by forward edges (they scale together), is a chain of M/M/k queues: a member receiving
``lam`` records/s (input rate plus its queued records drained over ``backlog_drain_s``)
whose tasks serve ``mu`` records per busy second each (``MetricsWindow.service_rate``)
adds :func:`~controllers.queueing.sojourn_s` ``(lam, mu, k)`` to a record's latency. The
model aims at a mean latency of ``target_latency_ms`` (default ``max_latency_ms / ln 100``:
the mean of an exponential sojourn whose p99 is the limit).

- On overload, tasks are added one at a time where they cut the model's latency most,
  until it is under the target, and at least one (the probe saw overload, whatever the
  model says), up to ``max_tasks`` and the operators' key groups.
- On underload, tasks are removed one at a time where they add the least latency, while
  the model stays under ``scale_in_headroom`` x the target and no task's utilization
  goes above ``max_utilization``.

Hysteresis: the two detectors use different signals and windows; scale-in keeps headroom
below the target; and whenever the job's parallelism changes (our plan applied, or anyone
else's) the overload window and the underload streak start again, so the next decision
is made on measurements of the new configuration. The input-rate history (for the peak)
is kept. This state lives in the instance (the host keeps it alive between periods).
Only operators whose stage holds no source are scaled (sources cannot be rescaled live);
a stage whose new tasks find no worker with a free slot is left as it is (logged; give
``workers: ["new"]`` to ask the backend for fresh ones).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.abstraction import Abstraction, Plan, WorkerOverCapacity

from ..base import Controller
from ..config import check
from ..metrics import MetricsWindow
from ..plans import PlanBuilder
from ..queueing import P99_OVER_MEAN, sojourn_s
from ..view import View

__all__ = ["LatencyAutoscaler", "LatencyAutoscalerConfig", "Stage", "stages"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LatencyAutoscalerConfig:
    interval_s: float = 10.0
    max_latency_ms: float = 500.0  # eSault's probe limit on the p99 latency
    overload_window: int = 5  # periods
    overload_factor: float = 0.5  # overload: more than this fraction of the window over
    underload_window: int = 6  # periods in a row below the watermark
    low_watermark: float = 0.5  # x the recent peak input rate
    peak_window: int = 30  # periods over which the peak input rate is taken
    target_latency_ms: float | None = None  # model's mean target; None: max / ln(100)
    scale_in_headroom: float = 0.8  # scale in only while the model stays under this x target
    max_utilization: float = 0.8  # scale in never leaves tasks busier than this
    backlog_drain_s: float = 30.0  # queued records count as input drained within this
    operators: tuple[str, ...] = ()  # operators to scale; empty: every rescalable one
    max_tasks: int = 32  # per operator
    workers: tuple[str, ...] = ()  # where new tasks go; empty: least loaded; ["new"]: fresh
    mode: Literal["pause", "fluid"] = "pause"
    batch_size: int | None = None

    def __post_init__(self) -> None:
        check(self.max_latency_ms > 0, "max_latency_ms", "must be > 0", self.max_latency_ms)
        for name in ("overload_window", "underload_window", "peak_window", "max_tasks"):
            check(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in ("overload_factor", "low_watermark"):
            value = getattr(self, name)
            check(0 <= value < 1, name, "must be in [0, 1)", value)
        for name in ("scale_in_headroom", "max_utilization"):
            value = getattr(self, name)
            check(0 < value <= 1, name, "must be in (0, 1]", value)
        check(
            self.target_latency_ms is None or self.target_latency_ms > 0,
            "target_latency_ms",
            "must be > 0 (or null)",
            self.target_latency_ms,
        )
        check(self.backlog_drain_s > 0, "backlog_drain_s", "must be > 0", self.backlog_drain_s)
        check(
            self.batch_size is None or (self.batch_size >= 1 and self.mode == "fluid"),
            "batch_size",
            "must be >= 1 and needs mode 'fluid'",
            self.batch_size,
        )

    @property
    def model_target_ms(self) -> float:
        return self.target_latency_ms or self.max_latency_ms / P99_OVER_MEAN


@dataclass(frozen=True, eq=False)  # compared by identity: a key of the sizing dicts
class Stage:
    """Operators scaled together (a forward group), with each member's ``(lam, mu)`` in
    records/s (``mu`` None: not busy enough to measure), its current tasks and its cap."""

    operators: tuple[str, ...]
    rates: Mapping[str, tuple[float, float | None]]
    tasks: int
    cap: int

    @property
    def modelled(self) -> bool:
        return any(mu is not None for _, mu in self.rates.values())

    def latency_ms(self, k: int) -> float:
        """Expected milliseconds a record spends in the stage with ``k`` tasks per member."""
        return 1000.0 * sum(sojourn_s(lam, mu, k) for lam, mu in self.rates.values() if mu)

    def utilization(self, k: int) -> float:
        return max((lam / (k * mu) for lam, mu in self.rates.values() if mu), default=0.0)


def stages(a: Abstraction, metrics: MetricsWindow, cfg: LatencyAutoscalerConfig) -> list[Stage]:
    """The rescalable stages of ``a`` (in topological order) that ``cfg.operators`` selects."""
    seen: set[tuple[str, ...]] = set()
    result = []
    for op in a.operators:
        group = a.forward_group(op.name)
        if group in seen:
            continue
        seen.add(group)
        members = [a.operator(name) for name in group]
        if any(m.kind == "source" for m in members):
            continue
        if cfg.operators and not set(group) & set(cfg.operators):
            continue
        cap = min([cfg.max_tasks] + [m.max_parallelism or cfg.max_tasks for m in members])
        rates = {
            name: (
                metrics.input_rate(name) + metrics.queue_length(name) / cfg.backlog_drain_s,
                metrics.service_rate(name),
            )
            for name in group
        }
        result.append(Stage(group, rates, op.parallelism, cap))
    return result


def _total(chosen: Mapping[Stage, int]) -> float:
    return sum(s.latency_ms(k) for s, k in chosen.items())


def scale_out(chain: list[Stage], target_ms: float) -> dict[Stage, int]:
    """Tasks per stage after adding one at a time where it cuts the model's latency most
    (ties and unbounded stages: the busiest first), until under ``target_ms``; at least
    one is added if any stage can grow."""
    k = {s: s.tasks for s in chain if s.modelled}
    added = 0
    while added == 0 or _total(k) > target_ms:
        growable = [s for s in k if k[s] < s.cap]
        if not growable:
            break

        def gain(s: Stage) -> tuple[float, float]:
            now = s.latency_ms(k[s])
            cut = math.inf if math.isinf(now) else now - s.latency_ms(k[s] + 1)
            return cut, s.utilization(k[s])

        best = max(growable, key=gain)
        k[best] += 1
        added += 1
    return k


def scale_in(chain: list[Stage], limit_ms: float, max_utilization: float) -> dict[Stage, int]:
    """Tasks per stage after removing one at a time where it adds the least latency,
    while the model stays under ``limit_ms`` and utilization under ``max_utilization``."""
    k = {s: s.tasks for s in chain if s.modelled}
    while True:
        total = _total(k)
        options = []
        for s in k:
            if k[s] <= 1 or s.utilization(k[s] - 1) > max_utilization:
                continue
            after = total - s.latency_ms(k[s]) + s.latency_ms(k[s] - 1)
            if after <= limit_ms:
                options.append((after, s))
        if not options:
            return k
        _, best = min(options, key=lambda pair: pair[0])
        k[best] -= 1


class LatencyAutoscaler(Controller):
    """Scales operators out and in to keep p99 latency under a limit (module docstring)."""

    config_class = LatencyAutoscalerConfig
    config: LatencyAutoscalerConfig

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self._probes: deque[bool] = deque(maxlen=cfg.overload_window)
        self._rates: deque[float] = deque(maxlen=cfg.peak_window)
        self._low_streak = 0
        self._shape: tuple[tuple[str, int], ...] | None = None

    def observe(self, view: View) -> Literal["overload", "underload"] | None:
        """Record this period's probe and input rate; what the detectors now say."""
        cfg = self.config
        a, m = view.abstraction, view.metrics
        shape = tuple((op.name, op.parallelism) for op in a.operators)
        if shape != self._shape:
            self._shape = shape
            self._probes.clear()
            self._low_streak = 0
        over_now = m.latency.count > 0 and m.latency.p99_ms > cfg.max_latency_ms
        if m.latency.count > 0:
            self._probes.append(over_now)
        rate = sum(m.output_rate(op.name) for op in a.operators if op.kind == "source")
        self._rates.append(rate)
        if sum(self._probes) > cfg.overload_factor * cfg.overload_window:
            self._low_streak = 0
            return "overload"
        peak = max(self._rates)
        if not over_now and peak > 0 and rate < cfg.low_watermark * peak:
            self._low_streak += 1
        else:
            self._low_streak = 0
        return "underload" if self._low_streak >= cfg.underload_window else None

    def decide(self, view: View) -> Plan | None:
        cfg = self.config
        state = self.observe(view)
        if state is None:
            return None
        chain = stages(view.abstraction, view.metrics, cfg)
        if state == "overload":
            sizes = scale_out(chain, cfg.model_target_ms)
        else:
            sizes = scale_in(
                chain, cfg.model_target_ms * cfg.scale_in_headroom, cfg.max_utilization
            )
        builder = PlanBuilder(view.abstraction)
        for stage, n in sizes.items():
            if n == stage.tasks:
                continue
            logger.info("%s: stage %s from %d to %d tasks", state, stage.operators, stage.tasks, n)
            try:
                builder.scale(stage.operators[0], n, workers=cfg.workers or None)
            except WorkerOverCapacity as exc:
                logger.warning("cannot scale %s to %d tasks: %s", stage.operators, n, exc)
        return builder.build(cfg.mode, cfg.batch_size)
