"""A job's recent metrics as time series, for charts that show history as soon as they
load: ``GET /jobs/{id}/metrics/series?window_s=&step_s=``.

The window is cut into steps of ``step_s`` seconds whose ends are multiples of ``step_s``
(epoch time), so that two reads a few seconds apart give the same points for the steps
they share; the last step ends at or before the view's ``now``, so none is partial. A
report stamped ``t`` counts in the step ``(end - step_s, end]`` holding ``t``.

Per step (:func:`series`, pure):

- each operator's input and output rate and its tasks' mean busy and backpressured
  fractions: a task's counts divided by the seconds its reports in the step cover. A
  report holds what the task did since its previous one (``TaskMetrics.snapshot``) and is
  stamped when its worker sent it, so it covers the time since the task's previous report;
  the first in the view, the time it accounts for (busy + idle + backpressured, as the
  metrics window divides by) but at least the second workers wait between reports. Its
  own accounting alone would not do: a source's time yielding to the other tasks of a
  loaded worker is in none of the three, and its rate would read several times too high;
- the records queued at its tasks (the latest level of each), and at sinks the p99 of
  end-to-end latency;
- each keyed operator's records per second in each key group (a heat map's cells);
- each worker's CPU (mean of its reports) and RSS (the latest).

A step without reports is ``None`` (a gap in a chart), not 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from controlplane.engine import Engine, MetricsView, job_key
from controlplane.errors import InvalidRequest, JobNotRunning
from controlplane.jobs import service as jobs
from runtime.metrics import LatencyHistogram, summarize_latency

__all__ = [
    "MIN_STEP_S",
    "JobSeriesRead",
    "KeyGroupLoad",
    "OperatorSeries",
    "WorkerSeries",
    "job_series",
    "series",
    "steps",
]

MIN_STEP_S = 1.0  # tasks and workers report once a second: a shorter step is mostly gaps
REPORT_S = 1.0  # runtime.worker.METRICS_INTERVAL_S: the least a report covers
COUNTS = ("records_in", "records_out", "busy_s", "backpressure_s")


class OperatorSeries(BaseModel):
    """One operator's lines, one value per step of ``JobSeriesRead.times``."""

    operator: str
    kind: str
    in_per_s: list[float | None]
    out_per_s: list[float | None]
    busy: list[float | None] = Field(description="mean over its tasks that reported, 0 to 1")
    backpressure: list[float | None] = Field(description="mean over its tasks, 0 to 1")
    queued: list[int | None] = Field(description="records waiting at its tasks (latest)")
    p99_ms: list[float | None] | None = Field(
        description="end-to-end latency p99 of the records it took (sinks; None otherwise)"
    )


class KeyGroupLoad(BaseModel):
    """A keyed operator's load per key group: ``records_per_s[i][j]`` is key group
    ``groups[i]`` in step ``j`` (0 when it had no record)."""

    operator: str
    groups: list[int] = Field(description="the key groups that had records in the window")
    records_per_s: list[list[float]]


class WorkerSeries(BaseModel):
    worker: str
    cpu_percent: list[float | None] = Field(description="mean of its reports in the step")
    rss_mb: list[float | None] = Field(description="its latest report in the step")


class JobSeriesRead(BaseModel):
    job_id: int
    window_s: float
    step_s: float
    times: list[float] = Field(
        description="the end of each step, seconds since the epoch, oldest first"
    )
    operators: list[OperatorSeries] = Field(description="in the job graph's order")
    key_groups: list[KeyGroupLoad] = Field(description="one per keyed operator")
    workers: list[WorkerSeries] = Field(description="the workers that hosted its tasks")


def steps(now: float, window_s: float, step_s: float) -> list[float]:
    """The ends of the whole steps of ``step_s`` within the ``window_s`` before ``now``,
    oldest first; :class:`InvalidRequest` for a step under :data:`MIN_STEP_S` or longer
    than the window."""
    if step_s < MIN_STEP_S:
        raise InvalidRequest(f"step_s must be at least {MIN_STEP_S:g} seconds, not {step_s:g}")
    if step_s > window_s:
        raise InvalidRequest(f"step_s ({step_s:g}) must not be longer than window_s ({window_s:g})")
    count = math.floor(window_s / step_s)
    last = math.floor(now / step_s) * step_s
    return [last - (count - 1 - i) * step_s for i in range(count)]


def _step_of(t: float, first_end: float, step_s: float, count: int) -> int | None:
    """The index of the step ``(end - step_s, end]`` holding ``t``, or None outside."""
    i = math.ceil((t - first_end) / step_s - 1e-9)  # t on an end, give or take rounding: its step
    return i if 0 <= i < count else None


def _accounted(snap: Mapping[str, Any]) -> float:
    """The seconds a report accounts for (busy + idle + backpressured), at least
    ``REPORT_S``."""
    seconds = sum(float(snap.get(k, 0) or 0) for k in ("busy_s", "idle_s", "backpressure_s"))
    return max(seconds, REPORT_S)


class _Step:
    """What one step gathered: per task its counts and the seconds they cover (``span_s``),
    its latest queue level, key-group counts and latency histogram."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {}
        self.queued: dict[str, int] = {}
        self.groups: dict[str, Counter[int]] = {}
        self.latency: dict[str, LatencyHistogram] = {}

    def add(self, task: str, snap: Mapping[str, Any], span_s: float) -> None:
        agg = self.counts.setdefault(task, Counter())
        agg["span_s"] += span_s
        for k in COUNTS:
            agg[k] += float(snap.get(k, 0) or 0)
        self.queued[task] = sum(int(n) for n in dict(snap.get("queued") or {}).values())
        for g, n in dict(snap.get("key_groups") or {}).items():
            self.groups.setdefault(task, Counter())[int(g)] += int(n)
        if snap.get("latency"):
            hist = self.latency.setdefault(task, LatencyHistogram())
            hist.merge(LatencyHistogram.from_dict(snap["latency"]))

    def operator(self, tasks: Iterable[str]) -> dict[str, float | None]:
        """The step's values for an operator whose tasks are ``tasks`` (None: no report)."""
        reported = [t for t in tasks if t in self.counts]
        if not reported:
            return dict.fromkeys(("in", "out", "busy", "backpressure", "queued", "p99"))

        def rate(k: str) -> float:
            return sum(self.counts[t][k] / self.counts[t]["span_s"] for t in reported)

        def mean_fraction(k: str) -> float:
            fractions = (min(self.counts[t][k] / self.counts[t]["span_s"], 1.0) for t in reported)
            return sum(fractions) / len(reported)

        latency = LatencyHistogram()
        for t in reported:
            if t in self.latency:
                latency.merge(self.latency[t])
        summary = summarize_latency(latency)
        return {
            "in": rate("records_in"),
            "out": rate("records_out"),
            "busy": mean_fraction("busy_s"),
            "backpressure": mean_fraction("backpressure_s"),
            "queued": sum(self.queued[t] for t in reported),
            "p99": summary["p99_ms"] if summary["count"] else None,
        }

    def group_rates(self, tasks: Iterable[str]) -> Counter[int]:
        """Records per second in each key group of the operator whose tasks are ``tasks``."""
        rates: Counter[int] = Counter()
        for t in tasks:
            if t in self.groups:
                span = self.counts[t]["span_s"]
                for g, n in self.groups[t].items():
                    rates[g] += n / span
        return rates


def series(job_id: int, view: MetricsView, step_s: float) -> JobSeriesRead:
    """The series of ``view`` (its ``window_s`` up to its ``now``) in steps of ``step_s``;
    :class:`InvalidRequest` for a step under :data:`MIN_STEP_S` or over the window."""
    ends = steps(view.now, view.window_s, step_s)
    count = len(ends)
    gathered = [_Step() for _ in ends]
    previous: dict[str, float] = {}  # task -> the time of its previous report
    for t, task, snap in view.samples:
        before = previous.get(task)
        previous[task] = t
        i = _step_of(t, ends[0], step_s, count)
        if i is not None:
            span = float(snap.get("span_s") or 0) or (
                t - before if before is not None and t > before else _accounted(snap)
            )
            gathered[i].add(task, snap, span)

    tasks_of: dict[str, list[str]] = {op: [] for op in view.kinds}
    for task, op in view.operator_of.items():
        tasks_of.setdefault(op, []).append(task)
    operators = []
    key_groups = []
    for op, tasks in tasks_of.items():
        kind = view.kinds.get(op, "?")
        points = [s.operator(tasks) for s in gathered]
        line = {k: [p[k] for p in points] for k in points[0]}  # there is at least one step
        operators.append(
            OperatorSeries(
                operator=op,
                kind=kind,
                in_per_s=_rounded(line["in"], 2),
                out_per_s=_rounded(line["out"], 2),
                busy=_rounded(line["busy"], 4),
                backpressure=_rounded(line["backpressure"], 4),
                queued=[None if q is None else int(q) for q in line["queued"]],
                p99_ms=_rounded(line["p99"], 3) if kind == "sink" else None,
            )
        )
        if kind == "keyed":
            rates = [s.group_rates(tasks) for s in gathered]
            groups = sorted({g for r in rates for g in r})
            key_groups.append(
                KeyGroupLoad(
                    operator=op,
                    groups=groups,
                    records_per_s=[[round(r.get(g, 0.0), 2) for r in rates] for g in groups],
                )
            )
    return JobSeriesRead(
        job_id=job_id,
        window_s=view.window_s,
        step_s=step_s,
        times=ends,
        operators=operators,
        key_groups=key_groups,
        workers=_workers(view.worker_samples, ends, step_s),
    )


def _workers(
    reports: Iterable[tuple[float, str, float, float]], ends: list[float], step_s: float
) -> list[WorkerSeries]:
    cpu: dict[str, list[list[float]]] = {}
    rss: dict[str, list[float | None]] = {}
    for t, worker, cpu_percent, rss_mb in reports:  # oldest first: the last RSS wins
        i = _step_of(t, ends[0], step_s, len(ends))
        if i is None:
            continue
        cpu.setdefault(worker, [[] for _ in ends])[i].append(cpu_percent)
        rss.setdefault(worker, [None] * len(ends))[i] = rss_mb
    return [
        WorkerSeries(
            worker=worker,
            cpu_percent=_rounded([sum(xs) / len(xs) if xs else None for xs in cpu[worker]], 1),
            rss_mb=_rounded(rss[worker], 1),
        )
        for worker in sorted(cpu)
    ]


def _rounded(values: list[float | None], digits: int) -> list[float | None]:
    """Rounded to ``digits`` (a chart shows no more, and the body is a third smaller)."""
    return [None if v is None else round(v, digits) for v in values]


def job_series(
    *, session: Session, engine: Engine, job_id: int, window_s: float, step_s: float
) -> JobSeriesRead:
    """The job's last ``window_s`` seconds in steps of ``step_s``; :class:`NotFound` for an
    unknown job, :class:`JobNotRunning` for one this control plane has not deployed (it
    restarted), :class:`InvalidRequest` for steps :func:`steps` refuses."""
    jobs.get_row(session=session, job_id=job_id)
    view = engine.metrics([job_key(job_id)], window_s).get(job_key(job_id))
    if view is None:
        raise JobNotRunning(
            f"job {job_id} is not deployed on this control plane (it restarted since): "
            "there are no metrics to read"
        )
    return series(job_id, view, step_s)
