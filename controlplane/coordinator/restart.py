"""The stop-and-restart baseline: what Flink and Spark users do today to rescale.

It exists to be compared with live reconfiguration, and it is exact too:

1. **Snapshot.** Inject a savepoint barrier at the sources; sources stop emitting after
   it; every task, once aligned, sends its state (keyed: every key group's bytes; source:
   its replay position; sink: flushes and closes) to the coordinator and stops reading.
   The coordinator writes the savepoint to disk (``SAVEPOINT_DIR``, fsync'd), as Flink
   writes a savepoint to durable storage before a job is cancelled.
2. **Stop.** Stop the job's tasks on every worker.
3. **Redeploy.** Read the savepoint back, deploy the new layout, seeding each keyed task
   with the key groups it now owns and each source with its position; start with the
   job's original clock origin, so records due during the outage carry their lateness
   into the latency figures. The savepoint file is removed once the job runs again.

By default worker processes are reused (no process or JVM start), like resubmitting a
job to a Flink session cluster: the optimistic baseline. With ``new_workers`` the job
is redeployed on new worker processes, one per worker it used (started once its tasks
stopped, each taking the place of one old worker in the layout), and the old ones exit
once it runs again: what redeploying a Spark application or a Flink per-job cluster
does. The job must then be the only one on its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.statuses import JobStatus, WorkerStatus
from controlplane.statuses import ReconfigurationStatus as Status
from runtime.durable import fsync_dir
from runtime.layout import Layout
from runtime.messages import Restore, Savepoint, Snapshot

from .errors import ReconfigurationError
from .report import RunReport, elapsed_ms
from .workers import start_workers

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import JobHost
    from .report import Listener

__all__ = ["SNAPSHOT_TIMEOUT_S", "restart_locked", "restart_with"]

logger = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 60.0  # every task sends its state within this (100 MB through the coordinator)
RETIRE_TIMEOUT_S = 10.0  # old workers of a restart on new ones are gone within this
SAVEPOINT_DIR = Path(tempfile.gettempdir()) / "streampilot-savepoints"


class _Snapshot:
    def __init__(self, tasks: set[str]) -> None:
        self.waiting = set(tasks)
        self.groups: dict[str, dict[int, bytes]] = {}  # operator -> key group -> state
        self.positions: dict[str, Any] = {}  # source task -> position
        self.done = asyncio.Event()

    def add(self, msg: Snapshot) -> None:
        task = msg.task
        op = task.rpartition("-")[0]
        for g, data in msg.groups.items():
            self.groups.setdefault(op, {})[g] = data
        if msg.position is not None:
            self.positions[task] = msg.position
        self.waiting.discard(task)
        if not self.waiting:
            self.done.set()

    def persist(self, path: Path) -> None:
        """Write the savepoint durably (file and directory fsync'd)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump((self.groups, self.positions), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(path.parent)

    def load(self, path: Path) -> None:
        with path.open("rb") as f:
            self.groups, self.positions = pickle.load(f)


async def _retire(coordinator: JobHost, workers: list[str]) -> None:
    """Ask ``workers`` to exit and wait (at most ``RETIRE_TIMEOUT_S``) until they are gone,
    so that the job's next version no longer offers them; one that lingers is only logged."""
    for wid in workers:
        coordinator.shutdown_worker(wid)

    deadline = time.monotonic() + RETIRE_TIMEOUT_S
    while any(coordinator.workers[w].status == WorkerStatus.ALIVE for w in workers):
        if time.monotonic() > deadline:
            logger.warning("old workers %s still connected after a restart", workers)
            return
        await asyncio.sleep(0.02)


async def restart_with(
    coordinator: JobHost, job: RunningJob, new: Layout, new_workers: bool = False
) -> RunReport:
    """Stop ``job`` with a snapshot, redeploy it as ``new`` with that state (on new worker
    processes with ``new_workers``), start it again."""
    async with job.slot.hold():
        return await restart_locked(coordinator, job, new, new_workers=new_workers)


async def restart_locked(
    coordinator: JobHost,
    job: RunningJob,
    new: Layout,
    on_change: Listener | None = None,
    new_workers: bool = False,
) -> RunReport:
    """:func:`restart_with` for a caller that holds ``job.slot.lock`` (``on_change``: see
    :func:`.reconfig.run_locked`). With ``new_workers`` the report's ``worker_map`` says
    which new worker took the place of which old one. Every task is affected: every task
    stops."""
    if job.status != JobStatus.RUNNING:
        raise ReconfigurationError(f"job {job.id} is {job.status}, not running")
    sources = {t for op in job.graph.sources() for t in job.layout.tasks_of(op.name)}
    if sources - new.placement.keys():
        raise ReconfigurationError("the baseline keeps every source task")
    replaced = sorted(set(job.layout.workers_used()) | set(new.workers_used()))
    if new_workers:
        shared = {
            w: other.id
            for other in coordinator.jobs.values()
            if other is not job and not other.done
            for w in other.layout.workers_used()
            if w in replaced
        }
        if shared:
            w, other = next(iter(sorted(shared.items())))
            raise ReconfigurationError(
                f"a restart on new workers stops the job's workers, and worker {w} also runs "
                f"job {other}: restart on the same workers instead"
            )
    rec = RunReport.new(job.id, set(job.layout.placement) | set(new.placement))
    job.reconfigurations.append(rec)
    announce = on_change or (lambda _report: None)
    announce(rec)
    job.status = JobStatus.RECONFIGURING
    t0 = time.perf_counter()
    try:
        # Step 1. Snapshot at a savepoint barrier.
        rec.status = Status.SYNCING
        announce(rec)
        snap = _Snapshot(set(job.layout.placement))
        job.snapshot = snap
        bid = coordinator.next_barrier_id()
        for wid in job.layout.workers_used():
            coordinator.send(wid, Savepoint(job.id, bid))
        try:
            await asyncio.wait_for(snap.done.wait(), SNAPSHOT_TIMEOUT_S)
        except TimeoutError:
            raise ReconfigurationError(
                f"snapshot incomplete after {SNAPSHOT_TIMEOUT_S:.0f}s: {sorted(snap.waiting)[:10]}"
            ) from None
        savepoint = SAVEPOINT_DIR / f"job-{job.id}-savepoint-{bid}.pickle"
        await asyncio.to_thread(snap.persist, savepoint)
        snap.groups, snap.positions = {}, {}
        t1 = time.perf_counter()
        # Step 2. Stop everywhere (workers handle it before the deploy that follows).
        coordinator.stop_everywhere(job)
        if new_workers:  # the new processes take the old ones' places in the layout
            try:
                fresh = await start_workers(coordinator, len(replaced), "a restart on new workers")
            except ReconfigurationError as exc:  # the job's tasks are stopped already
                await coordinator.fail(job, f"restart failed: {exc}")
                raise
            rec.worker_map = {old: info.id for old, info in zip(replaced, fresh, strict=True)}
            new = new.replace(placement={t: rec.worker_map[w] for t, w in new.placement.items()})
        # Step 3. Read the savepoint, redeploy with the state, then start.
        rec.status = Status.UPDATING
        announce(rec)
        await asyncio.to_thread(snap.load, savepoint)
        restore: dict[str, Restore] = {}
        for op in job.graph.operators:
            for tid in new.tasks_of(op.name):
                if not op.keyed and tid not in snap.positions:
                    continue
                groups = snap.groups.get(op.name, {}) if op.keyed else {}
                restore[tid] = Restore(
                    groups={g: groups[g] for g in new.assignment.get(tid, ()) if g in groups},
                    position=snap.positions.get(tid),
                )
        job.finished_tasks.clear()
        error = await coordinator.deploy(job, new, restore)
        if error:
            await coordinator.fail(job, f"restart failed: {error}")
            raise ReconfigurationError(error)
        job.layout = new
        job.metrics.track_tasks({t: t.rpartition("-")[0] for t in new.placement})
        job.status = JobStatus.RUNNING
        coordinator.start_deployed(job)
        t2 = time.perf_counter()
        if rec.worker_map:  # nothing of the job runs on the old workers now: they exit
            await _retire(coordinator, list(rec.worker_map))
        rec.timings_ms = {
            "snapshot": elapsed_ms(t0, t1),
            "redeploy": elapsed_ms(t1, t2),
            "total": elapsed_ms(t0, t2),
        }
        rec.pause_ms = dict.fromkeys(sorted(new.placement), rec.timings_ms["total"])
        with contextlib.suppress(OSError):
            savepoint.unlink()
        rec.status = Status.COMPLETED
        announce(rec)
    except ReconfigurationError as exc:
        rec.status = Status.FAILED
        rec.error = str(exc)
        announce(rec)
        raise
    finally:
        job.snapshot = None
        if job.status == JobStatus.RECONFIGURING:
            job.status = JobStatus.RUNNING
        rec.ended_at = time.time()
        announce(rec)
    return rec
