"""Recovery: a job that fails goes on from its last complete checkpoint.

A worker hosting the job's tasks dies (its control connection closes or its heartbeat
stops), a task fails, a data link breaks, or a reconfiguration's update cannot complete:
if the job takes checkpoints, has a complete one and its restart policy allows another
attempt, the coordinator recovers it instead of failing it (:func:`failed` decides,
:func:`recover` carries it out):

1. **Halt.** The job is ``recovering``: a reconfiguration under way ends (failed), the
   checkpoint in flight is abandoned and none starts until the job runs again; every
   worker still connected stops the job's tasks, and the coordinator waits for their
   last word (what they send after it is of the new run only).
2. **Place.** The layout the last complete checkpoint was taken in, each task of a worker
   that is gone placed on, in this order: a spare worker (alive, and hosting none of the
   job's tasks); a new worker asked of the backend; the surviving worker hosting the
   fewest of the job's tasks.
3. **Restore.** Deploy that layout, as the job's next attempt (its workers refuse data
   connections of earlier ones: :mod:`runtime.dataserver`): each keyed task reads its
   key groups' chains from the checkpoint store (:mod:`runtime.checkpoints.taking`),
   each source seeks to its position, each sink takes back what it wrote after the
   checkpoint; then start, with the job's clock origin. Records the sources emitted after the checkpoint are emitted
   again and their effects on state and sinks were rolled back: exactly once.
4. **Record.** A new abstraction version: the checkpoint's version with the new
   placement, with origin ``recovery`` and the reason naming what failed: the loss of a
   worker first when one was heard by the end of the halt (a survivor's broken data link
   to it is often heard before: :meth:`.Failures.reason`); the job runs.

An attempt that fails (a worker lost meanwhile, a deploy that fails) is a failure too.
The restart policy allows ``max_failures`` recoveries within ``window_s`` (after
``delay_s`` each); past that, or without a complete checkpoint, the job fails with every
cause listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from controlplane.statuses import JobStatus
from controlplane.statuses import ReconfigurationStatus as Status
from runtime.layout import Layout
from runtime.messages import Restore

from .errors import ReconfigurationError
from .layouts import refresh_workers
from .report import RunReport, elapsed_ms
from .workers import remap_workers, start_workers

if TYPE_CHECKING:
    from controlplane.abstraction import Abstraction

    from .model import RunningJob, WorkerInfo
    from .ports import JobHost

__all__ = ["RECOVERY", "failed", "recover", "recovered", "refusal", "restore_of", "tell_recovered"]

logger = logging.getLogger(__name__)

RECOVERY = "recovery"  # the origin of the versions recoveries make
STOP_TIMEOUT_S = 5.0  # workers still connected stop the job's tasks within this


def refusal(job: RunningJob) -> str | None:
    """Why ``job`` cannot recover now (None: it can)."""
    if job.checkpointer is None:
        return "the job takes no checkpoints, so it cannot recover"
    if job.checkpointer.latest is None:
        return "the job has no complete checkpoint to recover from yet"
    return None


def failed(host: JobHost, job: RunningJob, error: str, *, lost: bool = False) -> None:
    """``job`` failed with ``error``: it recovers (:func:`recover`) if it can, else it ends
    failed and is stopped everywhere (what :meth:`.ports.JobHost.fail` does); ``lost``:
    ``error`` is the loss of a worker. A failure while the job recovers is of its tasks
    before the recovery (they are being stopped): the recovery goes on, and its reason
    tells it (a worker's loss first: :meth:`.Failures.reason`)."""
    if job.done:
        return
    rec = job.failures
    if job.status == JobStatus.RECOVERING:
        logger.info("job %s (recovering): %s", job.id, error)
        rec.hear(error, lost=lost)
        return
    rec.add(asyncio.get_running_loop().time(), error, lost=lost)
    why = refusal(job) if job.status != JobStatus.STARTING else "it never started"
    if why is None:
        if job.active is not None:  # a reconfiguration under way ends with the error
            job.active.fail(error)
        job.status = JobStatus.RECOVERING
        logger.warning("job %s recovers: %s", job.id, error)
        _tell_recovering(host, job, error)
        rec.running = asyncio.ensure_future(recover(host, job))
        return
    if job.checkpointer is not None:
        error = f"{error} (not recovered: {why})"
    if job.end(JobStatus.FAILED, error):
        logger.warning("job %s failed: %s", job.id, error)
        host.stop_everywhere(job)


def _tell_recovering(host: JobHost, job: RunningJob, cause: str) -> None:
    """Tell the coordinator's recovering listener (the control plane records it)."""
    listener = getattr(host, "on_recovering", None)
    if listener is None:
        return
    try:
        listener(job.id, cause)
    except Exception:
        logger.exception("job %s: the recovering listener failed", job.id)


async def recover(host: JobHost, job: RunningJob) -> None:
    """Recover ``job`` after the failure its ``failures`` were last told of
    (:meth:`.Failures.add`; module docstring); fails it, with every cause listed, when
    the restart policy allows no more."""
    rec = job.failures
    loop = asyncio.get_running_loop()
    while True:
        if not rec.allows(loop.time()):
            why = (
                f"failed {len(rec.causes)} times, more than the restart policy allows "
                f"({rec.policy.max_failures} within {rec.policy.window_s:g}s): {rec.listed()}"
            )
            await _give_up(host, job, why)
            return
        if rec.policy.delay_s:
            await asyncio.sleep(rec.policy.delay_s)
        try:
            await _attempt(host, job)
            return
        except ReconfigurationError as exc:
            cause = f"recovery failed: {exc}"
            rec.add(loop.time(), cause)
            logger.warning("job %s: %s", job.id, cause)
        if job.done:
            return
        if refusal(job) is not None:
            await _give_up(host, job, f"{refusal(job)}: {rec.listed()}")
            return


async def _give_up(host: JobHost, job: RunningJob, why: str) -> None:
    if job.end(JobStatus.FAILED, why):
        logger.warning("job %s failed: %s", job.id, why)
        host.stop_everywhere(job)


async def _attempt(host: JobHost, job: RunningJob) -> None:
    checkpointer = job.checkpointer
    assert checkpointer is not None and checkpointer.latest is not None
    t0 = time.perf_counter()
    # Step 1. Halt.
    async with job.slot.lock:  # the reconfiguration under way (failed) lets go of it
        if job.done:
            return
        await _halt(host, job)
        t1 = time.perf_counter()
        cause = job.failures.reason()  # what was heard by now: a worker's loss first
        # Step 2. Place.
        manifest, layout, abstraction = checkpointer.latest
        checkpointer.suspend(f"the job is recovering: {cause}")
        lost = [w for w in layout.workers_used() if not host.connected(w)]
        mapping = await _replacements(host, job, layout, lost)
        new = layout.replace(
            placement={t: mapping[w].id if w in mapping else w for t, w in layout.placement.items()}
        )
        t2 = time.perf_counter()
        # Step 3. Restore and start.
        job.finished_tasks.clear()
        job.failed_tasks.clear()
        job.restored = {}
        error = await host.deploy(job, new, restore_of(job, new, manifest))
        if error:
            raise ReconfigurationError(f"the deploy from checkpoint failed: {error}")
        job.layout = new
        job.metrics.track_tasks({t: t.rpartition("-")[0] for t in new.placement})
        # Step 4. Record the version and run.
        version = _recovered_version(host, job, abstraction, mapping)
        job.abstraction = version
        job.versions.append(version)
        job.status = JobStatus.RUNNING
        host.start_deployed(job)
        t3 = time.perf_counter()
        report = recovered(
            job,
            version,
            {
                "reason": cause,
                "checkpoint_id": manifest["checkpoint_id"],
                "lost_workers": lost,
                "placed_on": {w: info.id for w, info in mapping.items()},
                "restored": dict(sorted(job.restored.items())),
            },
            (t0, t1, t2, t3),
        )
        checkpointer.resume()
        tell_recovered(host, job, report, version)
        logger.warning(
            "job %s recovered from checkpoint %s in %.0f ms (%s)",
            job.id,
            manifest["checkpoint_id"],
            report.timings_ms["total"],
            cause,
        )


async def _halt(host: JobHost, job: RunningJob) -> None:
    """Step 1: stop the job's tasks on every worker still connected and wait for their
    last word (bounded: a worker that does not answer is as good as lost)."""
    loop = asyncio.get_running_loop()
    workers = [w for w in host.workers if host.connected(w)]
    job.stop_replies = {w: loop.create_future() for w in workers}
    host.stop_everywhere(job)
    if job.stop_replies:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*job.stop_replies.values()), STOP_TIMEOUT_S)
    job.stop_replies = {}


async def _replacements(
    host: JobHost, job: RunningJob, layout: Layout, lost: list[str]
) -> dict[str, WorkerInfo]:
    """Step 2: a worker in place of each of ``lost`` (module docstring)."""
    if not lost:
        return {}
    used = set(layout.workers_used())
    spares = [w for w in host.alive_workers() if w.id not in used and not _busy(host, job, w.id)]
    mapping: dict[str, WorkerInfo] = {}
    for w in lost:
        if spares:
            mapping[w] = spares.pop(0)
    wanted = [w for w in lost if w not in mapping]
    if wanted:
        with contextlib.suppress(ReconfigurationError):
            fresh = await start_workers(host, len(wanted), "a recovery needs a worker")
            mapping.update(zip(wanted, fresh, strict=False))
    survivors = [w for w in host.alive_workers() if w.id in used and w.id not in lost]
    for w in [w for w in lost if w not in mapping]:
        if not survivors:
            raise ReconfigurationError(
                f"no worker can take the tasks of lost worker {w}: none is spare, the "
                "backend started none and none of the job's workers survived"
            )
        load = {s.id: sum(1 for p in layout.placement.values() if p == s.id) for s in survivors}
        for m in mapping.values():
            if m.id in load:
                load[m.id] += sum(1 for p in layout.placement.values() if mapping.get(p) is m)
        mapping[w] = min(survivors, key=lambda s: (load[s.id], s.id))
    return mapping


def _busy(host: JobHost, job: RunningJob, worker: str) -> bool:
    """Whether another running job has tasks on ``worker`` (it is no spare then)."""
    return any(
        other is not job and not other.done and worker in other.layout.workers_used()
        for other in host.jobs.values()
    )


def restore_of(job: RunningJob, layout: Layout, manifest: dict[str, Any]) -> dict[str, Restore]:
    """Step 3: what each task of ``layout`` starts from in checkpoint ``manifest``: its
    key groups' chains and a partitioned source's partitions' positions (whichever
    task's part holds them), another source's position, its sink's prepared state."""
    parts: dict[str, dict[str, Any]] = manifest["tasks"]
    chains: dict[str, dict[int, tuple]] = {}  # operator -> key group -> chain
    positions: dict[str, dict[str, Any]] = {}  # partitioned source -> partition -> position
    partitioned = {op.name for op in job.graph.operators if op.partitions is not None}
    for tid, part in parts.items():
        op = tid.rpartition("-")[0]
        for g, chain in (part.get("groups") or {}).items():
            chains.setdefault(op, {})[int(g)] = tuple(tuple(link) for link in chain)
        if op in partitioned and isinstance(part.get("position"), dict):
            positions.setdefault(op, {}).update(part["position"])
    restore: dict[str, Restore] = {}
    for op in job.graph.operators:
        for tid in layout.tasks_of(op.name):
            part = parts.get(tid, {})
            mine = chains.get(op.name, {})
            groups = {g: mine[g] for g in layout.assignment.get(tid, ()) if g in mine}
            position, sink = part.get("position"), part.get("sink")
            if op.name in partitioned:
                held = positions.get(op.name, {})
                position = {p: held[p] for p in layout.partitions.get(tid, ()) if p in held}
            if groups or position is not None or sink is not None:
                restore[tid] = Restore(position=position, chains=groups, sink=sink)
    return restore


def recovered(
    job: RunningJob,
    version: Abstraction,
    why: dict[str, Any],
    times: tuple[float, float, float, float],
) -> RunReport:
    """The completed report of a recovery (or a resume) that made ``version``, kept with
    the job's reconfigurations: its plan says ``why`` (reason, checkpoint_id,
    lost_workers, placed_on, and what each worker restored), its timings come from the
    ``times`` (perf_counter) at its start and at the end of halt, place and restore."""
    t0, t1, t2, t3 = times
    report = RunReport.new(job.id, set(job.layout.placement))
    report.plan = {"origin": RECOVERY, **why}
    report.status = Status.COMPLETED
    report.version = version.version
    report.timings_ms = {
        "halt": elapsed_ms(t0, t1),
        "place": elapsed_ms(t1, t2),
        "restore": elapsed_ms(t2, t3),
        "total": elapsed_ms(t0, t3),
    }
    report.ended_at = time.time()
    job.reconfigurations.append(report)
    return report


def tell_recovered(host: JobHost, job: RunningJob, report: RunReport, version: Abstraction) -> None:
    """Tell the coordinator's recovery listener (the control plane records it)."""
    listener = getattr(host, "on_recovery", None)
    if listener is None:
        return
    try:
        listener(job.id, report, version.to_dict())
    except Exception:
        logger.exception("job %s: the recovery listener failed", job.id)


def _recovered_version(
    host: JobHost, job: RunningJob, at_checkpoint: Abstraction, mapping: dict[str, WorkerInfo]
) -> Abstraction:
    """Step 4: the checkpoint's version with the tasks of lost workers on their
    replacements, numbered after the job's current version."""
    backend = host.backend.name if host.backend is not None else "local"
    moved = remap_workers(at_checkpoint, mapping, backend) if mapping else at_checkpoint
    moved = moved.replace(version=job.abstraction.version + 1)
    return refresh_workers(moved, host.alive_workers(), backend)
