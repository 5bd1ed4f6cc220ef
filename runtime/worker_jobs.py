"""What a worker does at the coordinator's requests about its jobs: deploy one, prepare and
update a change (a prepare may make this worker join a job), import a job's code ahead,
list a job's source partitions.

Each request is a function of the worker (:class:`Worker`: what
:class:`~runtime.worker.WorkerProcess` provides) and the message, called by the worker's
control loop in the order the messages came; those that wait (a copy ahead, an update, a
listing) answer from the background. A failure is answered to the coordinator
(``DeployFailed``, ``PrepareFailed``, ``UpdateFailed``, an error in ``PartitionsListed``)
with the worker's id, and never ends the worker. The change itself is carried out by
:mod:`runtime.reconfigure`.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from typing import Protocol

from . import codeload, copyahead, messages, reconfigure
from .dataserver import DataServer
from .jobruntime import JobRuntime, WorkerServices

__all__ = [
    "LIST_TIMEOUT_S",
    "Worker",
    "deploy",
    "drop_job",
    "enter_attempt",
    "list_partitions",
    "prepare",
    "update",
    "warm",
]

logger = logging.getLogger(__name__)

LIST_TIMEOUT_S = 20.0  # a source lists its partitions (a broker's metadata) within this


class Worker(WorkerServices, Protocol):
    """What the requests need of the worker: its services to jobs, the jobs it runs (by
    id) and its data server."""

    jobs: dict[str, JobRuntime]
    data: DataServer


async def deploy(worker: Worker, msg: messages.Deploy) -> None:
    """Deploy deployment ``msg.attempt`` of job ``msg.job_id`` here, in place of what ran
    here of the job before; answer ``Deployed`` (its tasks, what they restored) or
    ``DeployFailed``."""
    job_id = msg.job_id
    try:
        enter_attempt(worker, job_id, msg.attempt)
        codeload.install_many(msg.code)  # before the graph is unpickled
        await drop_job(worker, job_id)  # left from when tasks of the job were here
        job = JobRuntime(
            worker,
            job_id,
            msg.graph,
            msg.layout,
            msg.workers,
            msg.config,
            msg.restore,
            msg.checkpoints,
            msg.attempt,
        )
        worker.jobs[job_id] = job
        await job.deploy()
    except Exception as exc:
        logger.debug("deploy of %s failed", job_id, exc_info=True)
        await drop_job(worker, job_id)
        error = f"worker {worker.worker_id}: {type(exc).__name__}: {exc}"
        worker.send(messages.DeployFailed(job_id, msg.attempt, error))
        return
    tasks = tuple(sorted(job.tasks))
    worker.send(messages.Deployed(job_id, msg.attempt, tasks, dict(job.restored)))


def enter_attempt(worker: Worker, job_id: str, attempt: int) -> None:
    """The coordinator runs deployment ``attempt`` of job ``job_id`` from now on (a
    deploy, or a prepare that makes this worker join the job): what runs here of an
    earlier deployment stops sending at once (its data links are dropped with what
    they hold unsent; the caller then drops it), and the data server fences that
    deployment's connections off (:meth:`DataServer.fence`)."""
    job = worker.jobs.get(job_id)
    if job is not None and job.attempt < attempt:
        for link in [*job.links.values(), *job.state_links.values()]:
            link.abort()
    worker.data.fence(job_id, attempt)


async def drop_job(worker: Worker, job_id: str) -> None:
    """Forget job ``job_id`` here, stopping what its runtime still runs or holds open."""
    job = worker.jobs.pop(job_id, None)
    if job is not None:
        await job.stop()


async def prepare(worker: Worker, msg: messages.Prepare) -> None:
    """Prepare a change (:func:`runtime.reconfigure.prepare`), joining the job first when
    none of its tasks runs here yet (``msg.graph`` set); answer ``Prepared`` (once the
    state copied ahead is copied, from the background) or ``PrepareFailed``."""
    job = worker.jobs.get(msg.job_id)
    try:
        codeload.install_many(msg.code)  # before any logic is unpickled
        if msg.graph is not None:  # the coordinator places none of the job's tasks here
            # This worker joins the job: it hosts none of its tasks yet.
            if (
                msg.current_layout is None
                or msg.config is None
                or msg.start_time is None
                or msg.attempt is None
            ):
                raise RuntimeError(
                    f"joining job {msg.job_id}: the prepare lacks its layout, "
                    "config, start time or deployment"
                )
            enter_attempt(worker, msg.job_id, msg.attempt)
            if job is not None:
                # Tasks of the job were here before; what this worker knew of the job
                # when the last one left is stale once the job changed elsewhere.
                if job.tasks and job.attempt == msg.attempt:
                    raise RuntimeError(
                        f"tasks {sorted(job.tasks)[:10]} of job {job.job_id} run here, "
                        "but the coordinator places none here"
                    )
                await drop_job(worker, job.job_id)
            job = JobRuntime(
                worker,
                msg.job_id,
                msg.graph,
                msg.current_layout,
                msg.workers,
                msg.config,
                checkpoints=msg.checkpoints,
                attempt=msg.attempt,
            )
            job.start_time = msg.start_time
            worker.jobs[job.job_id] = job
        if job is None:
            raise RuntimeError(f"job {msg.job_id} does not run here")
        await reconfigure.prepare(
            job,
            msg.rid,
            msg.barrier_id,
            msg.layout,
            set(msg.affected),
            dict(msg.workers),
            fluid=msg.fluid,
            stages=list(msg.stages),
            stage_barriers=list(msg.stage_barriers),
            precopy_min_bytes=msg.precopy_min_bytes,
            precopy_budget_s=msg.precopy_budget_s,
            precopy_pause_s=msg.precopy_pause_s,
        )
    except Exception as exc:
        logger.debug("prepare failed", exc_info=True)
        _prepare_failed(worker, msg, exc)
        return
    copying = copyahead.under_way(job, msg.rid)
    if copying is None:
        worker.send(messages.Prepared(msg.job_id, msg.rid))
        return
    # Replied once the state is copied ahead; the control loop goes on meanwhile (an
    # abort can come).
    worker.background(_prepared_after(worker, copying, msg))


async def _prepared_after(worker: Worker, copying: asyncio.Task, msg: messages.Prepare) -> None:
    try:
        copied = await copying
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        logger.debug("copying state ahead failed", exc_info=True)
        _prepare_failed(worker, msg, exc, "copying state ahead: ")
        return
    worker.send(messages.Prepared(msg.job_id, msg.rid, copied))


def _prepare_failed(
    worker: Worker, msg: messages.Prepare, exc: BaseException, what: str = ""
) -> None:
    error = f"worker {worker.worker_id}: {what}{type(exc).__name__}: {exc}"
    worker.send(messages.PrepareFailed(msg.job_id, msg.rid, error))


async def update(worker: Worker, msg: messages.Update) -> None:
    """Carry out a change's update (:func:`runtime.reconfigure.update`); a failure is
    answered with ``UpdateFailed``."""
    job = worker.jobs.get(msg.job_id)
    try:
        if job is None:
            raise RuntimeError(f"job {msg.job_id} does not run here")
        await reconfigure.update(job, msg.rid)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        logger.debug("update failed", exc_info=True)
        error = f"worker {worker.worker_id}: {type(exc).__name__}: {exc}"
        worker.send(messages.UpdateFailed(msg.job_id, msg.rid, error))


def warm(worker: Worker, msg: messages.Warm) -> None:
    """Import a job's code before any of its tasks comes here (the coordinator sends it
    to the workers a job does not use), so that taking a task later does not wait for
    it. A failure is left to the prepare that needs the code, which reports it."""
    if msg.job_id in worker.jobs:
        return
    try:
        codeload.install_many(msg.code)
        pickle.loads(msg.graph)
    except Exception:
        logger.debug("could not load the code of job %s ahead", msg.job_id, exc_info=True)


async def list_partitions(worker: Worker, msg: messages.ListPartitions) -> None:
    """List the partitions of ``msg.operators`` (off the loop, each within
    :data:`LIST_TIMEOUT_S`) and answer; an error names the source."""
    found: dict[str, tuple[str, ...]] = {}
    name = "?"
    try:
        codeload.install_many(msg.code)
        graph = pickle.loads(msg.graph)
        for name in msg.operators:
            source = graph.operator(name).logic
            names = await asyncio.wait_for(asyncio.to_thread(source.partitions), LIST_TIMEOUT_S)
            found[name] = tuple(str(p) for p in names)
    except TimeoutError:
        error = f"source {name!r} did not list its partitions within {LIST_TIMEOUT_S:g}s"
        worker.send(messages.PartitionsListed(msg.request_id, {}, error))
        return
    except Exception as exc:
        error = f"source {name!r} cannot list its partitions: {type(exc).__name__}: {exc}"
        worker.send(messages.PartitionsListed(msg.request_id, {}, error))
        return
    worker.send(messages.PartitionsListed(msg.request_id, found, None))
