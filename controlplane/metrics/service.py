"""A job's metrics: the recent window summarized per task, per operator and per channel
(:func:`summarize`, pure), read for a job (:func:`job_metrics`), and the Prometheus
exposition of the whole control plane (:func:`prometheus_text`).

Worker snapshots are deltas of about one second each (``runtime.metrics.TaskMetrics``):
counts over the window are summed and divided by the window; queue lengths and state sizes
are levels, so the latest snapshot of each task counts. A keyed task's hot keys are summed
per key over its snapshots (estimates and errors alike), and its heaviest
``HOT_KEYS_REPORTED`` are kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.db import utcnow
from controlplane.engine import Engine, MetricsView, job_key
from controlplane.errors import JobNotRunning
from controlplane.jobs import service as jobs
from controlplane.jobs.models import JOB_STATUSES, TERMINAL_JOB_STATUSES, JobRecord
from controlplane.reconfigurations.models import RECONFIGURATION_STATUSES, ReconfigurationRecord
from runtime.metrics import HOT_KEYS_REPORTED, LatencyHistogram, covered, summarize_latency

from . import checkpoints
from .schemas import (
    ChannelMetrics,
    HotKeyRate,
    JobMetricsRead,
    LatencyRead,
    OperatorMetrics,
    PartitionHealth,
    TaskMetrics,
    WorkerUsage,
)

__all__ = ["PROMETHEUS_WINDOW_S", "job_metrics", "prometheus_text", "summarize"]

PROMETHEUS_WINDOW_S = 10.0  # rates and latency exported to Prometheus cover this window


class HotKeySums:
    """A task's hot keys summed over the window's snapshots: per key (and whether it is
    shown as its repr), its records, its error and its key group."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[bool, Hashable]] = Counter()
        self.errors: Counter[tuple[bool, Hashable]] = Counter()
        self.groups: dict[tuple[bool, Hashable], int] = {}

    def add(self, reported: Iterable[Mapping[str, Any]]) -> None:
        for h in reported:
            key = (bool(h.get("repr")), _hashable(h["key"]))
            self.counts[key] += int(h["count"])
            self.errors[key] += int(h["error"])
            self.groups[key] = int(h["group"])

    def rates(self, records: float, seconds: float) -> list[HotKeyRate]:
        """The heaviest keys per second of ``seconds``, with their share of ``records``."""
        return [
            HotKeyRate(
                key=_json(key),
                key_repr=shown,
                group=self.groups[shown, key],
                per_s=n / seconds,
                error_per_s=self.errors[shown, key] / seconds,
                share=min(n / records, 1.0) if records > 0 else 0.0,
            )
            for (shown, key), n in self.counts.most_common(HOT_KEYS_REPORTED)
        ]


def _hashable(key: Any) -> Hashable:
    """A reported key as a dict key: arrays (tuples once JSON had them) as tuples."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def _json(key: Any) -> Any:
    return [_json(k) for k in key] if isinstance(key, tuple) else key


def summarize(job_id: int, view: MetricsView) -> JobMetricsRead:
    """The window of ``view`` per task, operator and channel, with latency and workers."""
    w = view.window_s
    sums: dict[str, Counter[str]] = {}
    queued: dict[str, dict[str, int]] = {}
    state_keys: dict[str, int] = {}
    state_bytes: dict[str, int | None] = {}  # None: the task's state does not pickle
    state_groups: dict[str, dict[int, int]] = {}
    partitions: dict[str, dict[str, PartitionHealth]] = {}
    lags: dict[str, int] = {}  # a source task that is not partitioned: its latest lag
    groups: dict[str, Counter[int]] = {}
    hot_keys: dict[str, HotKeySums] = {}
    event_time: dict[str, dict] = {}  # task -> its latest event-time report
    late: Counter[str] = Counter()
    traffic: dict[tuple[str, str], Counter[str]] = {}
    latency = LatencyHistogram()
    for _t, task, snap in view.samples:  # oldest first: the last queue level wins
        agg = sums.setdefault(task, Counter())
        for k in ("span_s", "records_in", "records_out", "busy_s", "backpressure_s", "idle_s"):
            agg[k] += float(snap.get(k, 0) or 0)
        queued[task] = {str(u): int(n) for u, n in dict(snap.get("queued") or {}).items()}
        if snap.get("state"):
            size = snap["state"].get("bytes")
            state_keys[task] = int(snap["state"]["keys"])
            state_bytes[task] = None if size is None else int(size)
            shares = dict(snap["state"].get("groups") or {})
            state_groups[task] = {int(g): int(n) for g, n in sorted(shares.items())}
        if snap.get("lag") is not None:
            lags[task] = int(snap["lag"])
        if snap.get("partitions") is not None:
            partitions[task] = {
                str(p): PartitionHealth(lag=h.get("lag"), stalled=h.get("stalled"))
                for p, h in dict(snap["partitions"]).items()
            }
        if snap.get("event_time"):
            event_time[task] = dict(snap["event_time"])
            late[task] += int(event_time[task].get("late") or 0)
        for g, n in dict(snap.get("key_groups") or {}).items():
            groups.setdefault(task, Counter())[int(g)] += int(n)
        if snap.get("hot_keys") is not None:
            hot_keys.setdefault(task, HotKeySums()).add(snap["hot_keys"])
        for target, ch in dict(snap.get("channels") or {}).items():
            cell = traffic.setdefault((task, str(target)), Counter())
            cell["records"] += int(ch.get("records", 0))
            cell["bytes"] += int(ch.get("bytes", 0))
        if snap.get("latency"):
            latency.merge(LatencyHistogram.from_dict(snap["latency"]))

    tasks = [
        TaskMetrics(
            task=task,
            operator=view.operator_of.get(task, "?"),
            worker=view.placement.get(task),
            in_per_s=agg["records_in"] / covered(agg, w),
            out_per_s=agg["records_out"] / covered(agg, w),
            busy=min(agg["busy_s"] / covered(agg, w), 1.0),
            backpressure=min(agg["backpressure_s"] / covered(agg, w), 1.0),
            queued=queued.get(task, {}),
            key_groups=dict(sorted(groups.get(task, Counter()).items())),
            hot_keys=hot_keys[task].rates(agg["records_in"], covered(agg, w))
            if task in hot_keys
            else [],
            state_keys=state_keys.get(task),
            state_bytes=state_bytes.get(task),
            state_key_groups=state_groups.get(task),
            partitions=partitions.get(task),
            lag=lags.get(task),
            watermark=event_time.get(task, {}).get("watermark"),
            watermark_lag_s=event_time.get(task, {}).get("lag_s"),
            late_records=late[task],
        )
        for task, agg in sorted(sums.items())
    ]
    by_op: dict[str, list[TaskMetrics]] = {}
    for t in tasks:
        by_op.setdefault(t.operator, []).append(t)
    operators = [
        OperatorMetrics(
            operator=op,
            kind=view.kinds.get(op, "?"),
            tasks=len(ts),
            in_per_s=sum(t.in_per_s for t in ts),
            out_per_s=sum(t.out_per_s for t in ts),
            busy=sum(t.busy for t in ts) / len(ts),
            backpressure=sum(t.backpressure for t in ts) / len(ts),
            queued=sum(sum(t.queued.values()) for t in ts),
            state_bytes=None
            if all(t.state_bytes is None for t in ts)
            else sum(t.state_bytes or 0 for t in ts),
            watermark=min((t.watermark for t in ts if t.watermark is not None), default=None),
            watermark_lag_s=max(
                (t.watermark_lag_s for t in ts if t.watermark_lag_s is not None), default=None
            ),
            late_records=sum(t.late_records for t in ts),
        )
        for op, ts in by_op.items()
    ]
    hosting = set(view.placement.values())
    return JobMetricsRead(
        job_id=job_id,
        window_s=w,
        samples=len(view.samples),
        tasks=tasks,
        operators=operators,
        traffic=[
            ChannelMetrics(
                source=s, target=t, records_per_s=c["records"] / w, bytes_per_s=c["bytes"] / w
            )
            for (s, t), c in sorted(traffic.items())
        ],
        latency=LatencyRead(**summarize_latency(latency)),
        workers=[
            WorkerUsage(
                worker=wid, cpu_percent=u.get("cpu_percent", 0.0), rss_mb=u.get("rss_mb", 0.0)
            )
            for wid, u in sorted(view.workers.items())
            if wid in hosting
        ],
    )


def job_metrics(
    *, session: Session, engine: Engine, job_id: int, window_s: float
) -> JobMetricsRead:
    """The job's last ``window_s`` seconds; :class:`NotFound` for an unknown job,
    :class:`JobNotRunning` for one this control plane has not deployed (it restarted)."""
    jobs.get_row(session=session, job_id=job_id)
    view = engine.metrics([job_key(job_id)], window_s).get(job_key(job_id))
    if view is None:
        raise JobNotRunning(
            f"job {job_id} is not deployed on this control plane (it restarted since): "
            "there are no metrics to read"
        )
    return summarize(job_id, view)


def prometheus_text(*, session: Session, engine: Engine) -> bytes:
    """The Prometheus exposition: jobs (``recovering`` among them) and reconfigurations by
    status (from the database), records per second and sink latency p99 of each live job
    over ``PROMETHEUS_WINDOW_S``, the size of its keyed state and each source partition's
    lag and whether it is stalled, each event-time operator's watermark lag and late
    records, each keyed task's heaviest key (its share and rate; not the key, which would
    make a label of unbounded values), each live job's checkpoints and recoveries (:mod:`.checkpoints`, from the database), and the number
    of live workers."""
    registry = CollectorRegistry(auto_describe=True)
    jobs_g = Gauge("streampilot_jobs", "Jobs by status", ["status"], registry=registry)
    counts = dict(
        session.execute(select(JobRecord.status, func.count()).group_by(JobRecord.status)).all()
    )
    for status in JOB_STATUSES:
        jobs_g.labels(status).set(counts.get(status, 0))
    recs_g = Gauge(
        "streampilot_reconfigurations", "Reconfigurations by status", ["status"], registry=registry
    )
    counts = dict(
        session.execute(
            select(ReconfigurationRecord.status, func.count()).group_by(
                ReconfigurationRecord.status
            )
        ).all()
    )
    for status in RECONFIGURATION_STATUSES:
        recs_g.labels(status).set(counts.get(status, 0))

    live = list(
        session.scalars(select(JobRecord.id).where(JobRecord.status.not_in(TERMINAL_JOB_STATUSES)))
    )
    views = engine.metrics([job_key(i) for i in live], PROMETHEUS_WINDOW_S)
    rate = Gauge(
        "streampilot_job_records_per_second",
        f"Records per second into the job's sinks over the last {PROMETHEUS_WINDOW_S:g}s",
        ["job"],
        registry=registry,
    )
    p99 = Gauge(
        "streampilot_job_sink_latency_p99_seconds",
        f"Sink latency p99 over the last {PROMETHEUS_WINDOW_S:g}s",
        ["job"],
        registry=registry,
    )
    state = Gauge(
        "streampilot_job_state_bytes",
        "Estimated size of the job's keyed state (pickled, as a move ships it)",
        ["job"],
        registry=registry,
    )
    labels = ["job", "operator", "partition"]
    lag = Gauge(
        "streampilot_source_lag_records",
        "Records between a source partition's position and the head of its input",
        labels,
        registry=registry,
    )
    stalled = Gauge(
        "streampilot_source_stalled",
        "1 while a source partition cannot be read (its reader retries)",
        labels,
        registry=registry,
    )
    watermark_lag = Gauge(
        "streampilot_watermark_lag_seconds",
        "How far an operator's event-time watermark trails the wall clock (its slowest task)",
        ["job", "operator"],
        registry=registry,
    )
    late = Gauge(
        "streampilot_late_records",
        f"Records an operator's windows or joins took as late over the last "
        f"{PROMETHEUS_WINDOW_S:g}s",
        ["job", "operator"],
        registry=registry,
    )
    task_labels = ["job", "operator", "task"]
    hot_share = Gauge(
        "streampilot_hot_key_share",
        f"The share of a keyed task's input its heaviest key took over the last "
        f"{PROMETHEUS_WINDOW_S:g}s (from a sample of each batch; the key itself is in "
        f"GET /jobs/{{id}}/metrics, not a label)",
        task_labels,
        registry=registry,
    )
    hot_rate = Gauge(
        "streampilot_hot_key_records_per_second",
        f"Records per second of a keyed task's heaviest key over the last {PROMETHEUS_WINDOW_S:g}s",
        task_labels,
        registry=registry,
    )
    for job_id in live:
        view = views.get(job_key(job_id))
        if view is None:
            continue
        summary = summarize(job_id, view)
        sinks = [o for o in summary.operators if o.kind == "sink"]
        rate.labels(str(job_id)).set(sum(o.in_per_s for o in sinks))
        p99.labels(str(job_id)).set(summary.latency.p99_ms / 1000.0)
        state.labels(str(job_id)).set(sum(o.state_bytes or 0 for o in summary.operators))
        for o in summary.operators:
            if o.watermark_lag_s is not None:
                watermark_lag.labels(str(job_id), o.operator).set(o.watermark_lag_s)
                late.labels(str(job_id), o.operator).set(o.late_records)
        for task in summary.tasks:
            if task.hot_keys:
                where = (str(job_id), task.operator, task.task)
                hot_share.labels(*where).set(task.hot_keys[0].share)
                hot_rate.labels(*where).set(task.hot_keys[0].per_s)
            for name, health in (task.partitions or {}).items():
                where = (str(job_id), task.operator, name)
                stalled.labels(*where).set(1 if health.stalled else 0)
                if health.lag is not None:
                    lag.labels(*where).set(health.lag)
    registry.register(
        checkpoints.Collected(checkpoints.families(session=session, job_ids=live, now=utcnow()))
    )
    Gauge("streampilot_workers", "Live workers", registry=registry).set(engine.workers())
    return generate_latest(registry)
