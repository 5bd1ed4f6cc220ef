"""Resuming a job after the control plane restarted: a job that ran under an earlier
control plane goes on from its last complete checkpoint, on this one's workers.

The control plane's database knows the job (its graph is rebuilt from its recorded
submission), its policies and its last complete checkpoint (where the manifest is in
the store, and the abstraction version the job ran when it was taken). :func:`resume`:

1. **Place.** The checkpoint's version on the workers registered now: its workers left
   with the old process, so each maps to one of today's, spread as evenly as they go.
2. **Restore.** Deploy it with the checkpoint's state (each keyed task reads its key
   groups' chains from the store, sources seek to their positions, sinks take back what
   they wrote after it) and start it with the job's original clock origin (the
   manifest's ``started_at``): records due while the control plane was down are
   behind, and the job catches up, as after any recovery.
3. **Record.** A new version after the job's last one, with origin ``recovery`` and the
   reason that the control plane restarted; the job takes checkpoints again, their ids
   after the checkpoint's (this coordinator's barrier ids continue past it). The job's
   savepoints in the store (their manifests) are pinned again: retention never removes
   what they refer to.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from controlplane.statuses import JobStatus
from runtime.layout import Layout

from .checkpointer import Restorable
from .errors import CoordinatorError
from .from_savepoint import stored_savepoints
from .layouts import layout_of, refresh_workers
from .recovery import recovered, restore_of, tell_recovered
from .workers import remap_workers

if TYPE_CHECKING:
    from controlplane.abstraction import Abstraction

    from .model import RunningJob, WorkerInfo
    from .ports import JobHost

__all__ = ["RESTARTED", "resume"]

RESTARTED = "the control plane restarted"


async def resume(
    host: JobHost,
    job: RunningJob,
    manifest: dict[str, Any],
    at_checkpoint: Abstraction,
    latest_version: int,
    present: set[int],
) -> None:
    """Run ``job`` (its checkpointer set up, nothing deployed) from checkpoint
    ``manifest``, taken in version ``at_checkpoint``; ``latest_version`` is the job's
    last recorded version, ``present`` the checkpoints whose directories its store holds.
    The job comes back failed, with the cause, if it cannot be deployed; raises
    :class:`CoordinatorError` if no worker is registered."""
    t0 = time.perf_counter()
    alive = sorted(host.alive_workers(), key=lambda w: w.id)
    if not alive:
        raise CoordinatorError("no workers are registered: a job cannot resume")
    old = sorted({t.resources.worker for op in at_checkpoint.operators for t in op.tasks})
    mapping: dict[str, WorkerInfo] = {w: alive[i % len(alive)] for i, w in enumerate(old)}
    backend = host.backend.name if host.backend is not None else "local"
    placed = remap_workers(at_checkpoint, mapping, backend).replace(version=latest_version + 1)
    version = refresh_workers(placed, host.alive_workers(), backend)
    nothing = version.replace(operators=())  # no logic to carry over: refs name it all
    layout = layout_of(version, job.graph, nothing, Layout({}, {}, {}, {}))
    job.layout = layout
    job.metrics.track_tasks({t: t.rpartition("-")[0] for t in layout.placement})
    assert job.checkpointer is not None
    savepoints = await asyncio.to_thread(stored_savepoints, job.checkpointer.store, job.id)
    t1 = time.perf_counter()
    error = await host.deploy(job, layout, restore_of(job, layout, manifest))
    if error:
        await host.fail(job, f"{RESTARTED}; resuming from checkpoint failed: {error}")
        return
    job.abstraction = version
    job.versions.append(version)
    job.started_at = float(manifest.get("started_at") or time.time())
    job.status = JobStatus.RUNNING
    host.start_deployed(job)
    t2 = time.perf_counter()
    checkpointer = job.checkpointer
    assert checkpointer is not None
    checkpointer.adopt(Restorable(manifest, layout, version), present, savepoints)
    checkpointer.start()
    why = {
        "reason": RESTARTED,
        "checkpoint_id": manifest["checkpoint_id"],
        "lost_workers": old,
        "placed_on": {w: info.id for w, info in mapping.items()},
    }
    report = recovered(job, version, why, (t0, t0, t1, t2))  # nothing to halt
    tell_recovered(host, job, report, version)
