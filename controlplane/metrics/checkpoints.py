"""The Prometheus families of jobs' checkpoints and recoveries (:func:`families`), read
from the database (the ``checkpoints`` table and the reconfigurations with origin
``recovery``), so that a scrape agrees with what ``GET /jobs/{id}/checkpoints`` and
``GET /jobs/{id}/reconfigurations`` list.

Only jobs that have not ended are exported, each labelled ``job`` with its id: an ended
job's series stop, as its rates and latency do. Every such job has the totals (0 before
its first checkpoint or recovery); the ``last_*`` families once it has a completed
checkpoint (or a recovery). The totals are counters built from the rows at each scrape:
they only grow while the job lives (rows are never deleted; a discarded checkpoint still
counts as completed). Counts and the latest checkpoint come from
:mod:`controlplane.checkpoints.service`, as REST's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.checkpoints import service as checkpoints
from controlplane.coordinator.recovery import RECOVERY
from controlplane.reconfigurations.models import ReconfigurationRecord
from controlplane.statuses import CheckpointStatus

__all__ = ["Collected", "families"]

_COMPLETED = (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)


class Collected:
    """Families computed once for one exposition, for ``CollectorRegistry.register``."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def families(*, session: Session, job_ids: Iterable[int], now: datetime) -> list[Metric]:
    """The checkpoint and recovery families of the jobs ``job_ids`` (those that have not
    ended), their ages measured at ``now`` (timezone-aware)."""
    ids = sorted(job_ids)
    return [*_checkpoint_families(session, ids, now), *_recovery_families(session, ids)]


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["job"])


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=["job"])  # exposed as name_total


def _checkpoint_families(session: Session, ids: list[int], now: datetime) -> list[Metric]:
    age = _gauge(
        "streampilot_checkpoint_last_age_seconds",
        "Seconds since the job's last completed checkpoint started (its barrier): how old "
        "the state a recovery would go back to is",
    )
    last_id = _gauge(
        "streampilot_checkpoint_last_id",
        "Id of the job's last completed checkpoint (as GET /jobs/{id}/checkpoints lists it)",
    )
    duration = _gauge(
        "streampilot_checkpoint_last_duration_seconds",
        "Duration of the job's last completed checkpoint, from its barrier to its manifest",
    )
    written = _gauge(
        "streampilot_checkpoint_last_bytes",
        "Bytes the job's tasks wrote for its last completed checkpoint (only what changed)",
    )
    full = _gauge(
        "streampilot_checkpoint_last_full_bytes",
        "Bytes a restore from the job's last completed checkpoint reads (every key group's "
        "chain of parts)",
    )
    completed = _counter(
        "streampilot_checkpoints_completed",
        "Checkpoints of the job that completed (discarded ones included)",
    )
    abandoned = _counter(
        "streampilot_checkpoints_abandoned",
        "Checkpoints of the job that failed or were abandoned (timed out, a task could not "
        "take its part, the job recovered)",
    )
    for job_id in ids:
        job = [str(job_id)]
        done = checkpoints.count(session=session, job_id=job_id, statuses=_COMPLETED)
        completed.add_metric(job, done)
        failed = [CheckpointStatus.ABANDONED]
        abandoned.add_metric(
            job, checkpoints.count(session=session, job_id=job_id, statuses=failed)
        )
        last = checkpoints.latest_completed(session=session, job_db_id=job_id)
        if last is None:
            continue
        age.add_metric(job, max((now - last.started_at).total_seconds(), 0.0))
        last_id.add_metric(job, last.checkpoint_id)
        duration.add_metric(job, (last.duration_ms or 0.0) / 1000.0)
        written.add_metric(job, last.bytes)
        full.add_metric(job, last.full_bytes)
    return [age, last_id, duration, written, full, completed, abandoned]


def _recovery_families(session: Session, ids: list[int]) -> list[Metric]:
    total = _counter(
        "streampilot_recoveries",
        "Recoveries of the job from a checkpoint (reconfigurations with origin recovery)",
    )
    last = _gauge(
        "streampilot_recovery_last_duration_seconds",
        "Duration of the job's last recovery: halt, place and restore, until it ran again",
    )
    rec = ReconfigurationRecord
    counted = session.execute(
        select(rec.job_id, func.count(), func.max(rec.id))
        .where(rec.origin == RECOVERY, rec.job_id.in_(ids))
        .group_by(rec.job_id)
    ).all()
    newest = [newest_id for _job, _n, newest_id in counted]
    timings = dict(session.execute(select(rec.id, rec.timings_ms).where(rec.id.in_(newest))).all())
    recoveries = {job_id: (n, newest_id) for job_id, n, newest_id in counted}
    for job_id in ids:
        n, newest_id = recoveries.get(job_id, (0, None))
        total.add_metric([str(job_id)], n)
        took = timings[newest_id].get("total") if newest_id is not None else None
        if took is not None:
            last.add_metric([str(job_id)], took / 1000.0)
    return [total, last]
