"""What workers tell the coordinator about its jobs, and what becomes of the jobs: the
hooks of :class:`.cluster.Cluster` (a worker registered, lost, or the cause of its loss
known) and every message a worker sends (:func:`took`; see :mod:`runtime.messages`),
which the coordinator forwards here, on its loop, in the order they came.

A task's or a worker's failure fails the job (:func:`.recovery.failed`: it recovers if it
can); deploy answers go to the deploy waiting for them (:mod:`.deployment`), replies of
a reconfiguration to the one under way, checkpoint messages to the job's checkpointer,
partition listings and discoveries to :mod:`.listing` and :mod:`.discovery`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from controlplane.statuses import JobStatus
from runtime import messages

from . import discovery
from .deployment import warm
from .listing import took_reply
from .recovery import failed

if TYPE_CHECKING:
    from .model import RunningJob, WorkerInfo
    from .ports import JobHost

__all__ = ["cause_known", "lost", "lost_message", "registered", "took"]

logger = logging.getLogger(__name__)


def registered(host: JobHost, info: WorkerInfo) -> None:
    """Worker ``info`` registered: it gets the code of every running job ahead."""
    for job in host.jobs.values():
        if job.status == JobStatus.RUNNING:
            warm(host, job, [info.id])


def cause_known(host: JobHost, info: WorkerInfo, earlier: str | None) -> None:
    """The cause of lost worker ``info``'s end is known (it was ``earlier``): the errors
    of the jobs it failed say it."""
    before = lost_message(info, earlier)
    for job in host.jobs.values():
        if job.error == before:
            job.error = lost_message(info, info.error)


def lost(host: JobHost, info: WorkerInfo) -> None:
    """Worker ``info`` is lost: a stop stops waiting for it, a reconfiguration that uses it
    fails, a deploy to it fails at once, and every job it hosts a task of fails (and
    recovers if it can: :func:`.recovery.failed`)."""
    for job in host.jobs.values():  # a stop waiting for this worker's last counts
        fut = job.stop_replies.get(info.id)
        if fut is not None and not fut.done():
            fut.set_result(None)
    for job in host.jobs.values():
        msg = lost_message(info, info.error)
        run = job.active
        if run is not None and info.id in run.workers:  # e.g. a migration's target
            run.fail(msg)
        if job.done:
            continue
        deploying = job.deploying
        if deploying is not None and info.id in deploying.workers:
            # Of the layout being deployed, which job.layout becomes only once it is
            # (a recovery's spare, say): the deploy fails now, and whoever deploys
            # (a submit, a recovery, a resume, a restart) takes it from there.
            deploying.lost(info.id, msg)
            continue
        if info.id in job.layout.workers_used():
            failed(host, job, msg, lost=True)


def took(host: JobHost, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
    """React to ``msg`` from worker ``info`` (decoded: see :mod:`runtime.messages`)."""
    match msg:
        case messages.Metrics():
            _took_metrics(host, info, msg)
            return
        case messages.PartitionsListed():
            took_reply(host, msg)
            return
        case messages.Register() | messages.Heartbeat():
            logger.warning("worker %s: unexpected %s message, dropped", info.id, msg.TYPE)
            return
    job = host.jobs.get(msg.job_id)  # type: ignore[attr-defined]
    if job is None:
        return
    match msg:
        case messages.Deployed() | messages.DeployFailed():
            if msg.attempt != job.attempt:  # the answer to an earlier deploy
                return
            if isinstance(msg, messages.Deployed) and msg.restored:
                job.restored[info.id] = dict(msg.restored)
            if job.deploying is not None:
                error = msg.error if isinstance(msg, messages.DeployFailed) else None
                job.deploying.answered(info.id, error)
        case messages.TaskFinished(task=task, metrics=metrics):
            job.metrics.add(time.time(), task, metrics)
            job.finished_tasks.add(task)
            _end_idle_sources(host, job, task)
            if job.active is not None:
                job.active.task_finished(task)
            if job.checkpointer is not None:
                job.checkpointer.task_finished(task)
            _check_barriers(job, task, None)
            if len(job.finished_tasks) == len(job.layout.placement) and job.end(JobStatus.FINISHED):
                logger.info("job %s finished", job.id)
                host.stop_everywhere(job)
        case messages.TaskFailed(task=task, error=error):
            job.failed_tasks[task] = error
            if job.active is not None:  # a reconfiguration under way ends with its error
                job.active.fail(error)
            failed(host, job, error)
        case messages.WorkerError(error=error):
            failed(host, job, error)
        case messages.Stopped(metrics=metrics):
            for task, snap in metrics.items():
                job.metrics.add(time.time(), task, snap)
            fut = job.stop_replies.get(info.id)
            if fut is not None and not fut.done():
                fut.set_result(None)
        case messages.Snapshot(task=task, metrics=metrics):
            job.metrics.add(time.time(), task, metrics)
            snap = job.snapshot
            if snap is not None:
                snap.add(msg)
        case messages.BarrierAck(task=task, barrier_id=bid):
            _check_barriers(job, task, bid)
        case messages.PartitionsFound():
            discovery.found(host, job, msg)
        case messages.CheckpointCaptured() | messages.CheckpointAck() | messages.CheckpointFailed():
            if job.checkpointer is not None:
                job.checkpointer.on_message(msg)
        case (
            messages.Prepared()
            | messages.PrepareFailed()
            | messages.Paused()
            | messages.Updated()
            | messages.UpdateFailed()
            | messages.StageDone()
            | messages.StageWithdrawn()
        ):
            _reconfiguration_reply(job, info, msg)


def _end_idle_sources(host: JobHost, job: RunningJob, finished: str) -> None:
    """Once every task of a partitioned source that reads a partition has finished
    (a bounded source), its tasks left without partitions are told to end."""
    operator = finished.rpartition("-")[0]
    spec = next((op for op in job.graph.operators if op.name == operator), None)
    if spec is None or spec.partitions is None:
        return
    tasks = job.layout.tasks_of(operator)
    reading = [t for t in tasks if job.layout.partitions.get(t)]
    if any(t not in job.finished_tasks for t in reading):
        return
    for t in tasks:
        if t not in reading and t not in job.finished_tasks:
            host.send(job.layout.placement[t], messages.EndInput(job.id, t))


def _took_metrics(host: JobHost, info: WorkerInfo, msg: messages.Metrics) -> None:
    info.cpu_percent = msg.cpu_percent
    info.rss_mb = msg.rss_mb
    for job in host.jobs.values():
        if info.id in job.layout.workers_used():
            job.metrics.add_worker(info.id, info.cpu_percent, info.rss_mb)
    for job_id, tasks in msg.jobs.items():
        job = host.jobs.get(job_id)
        if job is None:
            continue
        for task, snap in tasks.items():
            job.metrics.add(msg.time, task, snap)


def _reconfiguration_reply(job: RunningJob, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
    """A worker's reply in the reconfiguration under way; one of an earlier (ended)
    reconfiguration is dropped."""
    run = job.active
    if run is None or run.report.id != msg.rid:  # type: ignore[attr-defined]
        return
    if isinstance(msg, messages.Updated) and msg.metrics is not None:
        job.metrics.add(time.time(), msg.task, msg.metrics)
    run.deliver(info.id, msg)


def _check_barriers(job: RunningJob, task: str, bid: int | None) -> None:
    for b, (pending, fut) in job.barrier_waits.items():
        if bid is None or b == bid:
            pending.discard(task)
            if not pending and not fut.done():
                fut.set_result(b)


def lost_message(info: WorkerInfo, cause: str | None) -> str:
    """A job's error when ``info``'s worker, hosting some of its tasks, was lost."""
    cause = cause or "control connection lost"
    return f"worker {info.id} (pid {info.pid} on {info.host}) died: {cause}"
