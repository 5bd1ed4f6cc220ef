"""The worker's part of a live reconfiguration of one job (the coordinator drives the steps).

1. :func:`prepare` (``rid``, ``barrier_id``, the new layout, the affected tasks): create
   the tasks that are new here (idle, not started), register input channels for every
   channel that will exist into a task here (data that arrives early waits in them), load
   new logic, connect to new peers. Nothing running changes; :func:`abort` undoes all of
   it.
2. Sync: when an affected task has aligned the reconfiguration barrier and forwarded it,
   :func:`barrier_aligned` tells it to pause (the worker acks ``paused``); unaffected
   tasks go on, and so do affected tasks that change nothing themselves (downstream of a
   task that moves: they only have to have taken in what its old instance sent before the
   barrier, see :func:`~runtime.layout.sync_only_tasks`).
3. :func:`update`: each affected task here applies its own part and resumes at once:
   routing tables and output channels are rebuilt (channels to unchanged targets are
   kept), input channels added or removed, key groups that leave are exported and shipped
   straight to their new owner's worker (in chunks), key groups that arrive are awaited
   and imported, logic is swapped, removed tasks stop, new tasks start. What a task does
   follows from its role in the change (:func:`task_role`, one handler per :class:`Role`).

Pre-copy (``prepare(..., precopy_min_bytes=...)``, :mod:`runtime.copyahead`): once
prepared, a running keyed task here whose key groups leave for a task on another worker
copies them ahead while it runs; its update then ships only what changed since.

Fluid mode (``prepare(..., fluid=True)``, docs/design.md, section 3) pauses key groups
rather than tasks: a keyed task whose only change is which key groups it owns
(:func:`~runtime.layout.in_place_owners`) acks the barrier without pausing. What it gives
away is shipped while it goes on with the rest, hottest groups first; records of a group
it gains wait for that group's state alone and are processed as it arrives, in the
task's own loop. A new keyed task, or a keyed task's new instance on another worker,
starts at the update the same way, before its state has come. Only upstream tasks (whose
routing swaps), the old instances of tasks that move or stop, and tasks whose logic
changes pause. A fluid change can come in stages (:mod:`runtime.stages`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import pickle
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet

from . import copyahead, shipping
from .change import Change, WorkerReconfigurationError, keyed_processor
from .channels import InputGate
from .jobruntime import JobRuntime
from .layout import Layout, affected_tasks, in_place_owners, sync_only_tasks
from .messages import Paused
from .operators import KeyedProcessor, swap_logic
from .partitioned import PartitionSetReader
from .records import Barrier, BarrierKind
from .stages import aligned as stage_aligned
from .stages import finished as stage_finished
from .stages import report
from .task import BaseTask, SourceTask, StreamTask, TaskStatus

__all__ = [
    "Role",
    "abort",
    "barrier_aligned",
    "prepare",
    "task_role",
    "update",
    "update_received",
]

logger = logging.getLogger(__name__)


async def prepare(
    job: JobRuntime,
    rid: int,
    barrier_id: int,
    layout: Layout,
    affected: set[str],
    peers: dict[str, tuple[str, int]],
    fluid: bool = False,
    stages: list[Layout] | None = None,
    stage_barriers: list[int] | None = None,
    precopy_min_bytes: int | None = None,
    precopy_budget_s: float = 0.0,
    precopy_pause_s: float = 0.0,
) -> None:
    """Step 1: get ready for ``layout`` without changing anything that runs.

    ``stages`` (fluid): the layouts the change goes through, the last being ``layout``;
    the update makes the first, each later one only moves key groups and is started by
    its barrier (``stage_barriers``, one per later stage, see :func:`runtime.stages.start`).
    ``precopy_min_bytes``: start copying ahead the key groups that leave a task here for
    another worker in the update when they come to at least that much state (None:
    never), for at most ``precopy_budget_s`` and until what is left would ship within
    ``precopy_pause_s`` (see :func:`runtime.copyahead.copy_ahead`);
    :func:`runtime.copyahead.under_way` gives the copying. Raises
    :class:`WorkerReconfigurationError` if the change cannot be prepared here."""
    if job.pending is not None and job.pending.updating:
        # The previous update's last task has reported; let its bookkeeping finish.
        await job.pending.finished.wait()
    if job.pending is not None:
        raise WorkerReconfigurationError(f"reconfiguration {job.pending.rid} is still pending here")
    own = affected_tasks(job.graph, job.layout, layout)
    missing = sorted(own - affected)
    if missing:
        raise WorkerReconfigurationError(f"tasks {missing} change but are not in the affected set")
    for tid in affected:
        task = job.tasks.get(tid)
        if task is not None and task.status != TaskStatus.RUNNING:
            raise WorkerReconfigurationError(
                f"task {tid} is {task.status}; only running tasks can change"
            )
    job.peers.update(peers)
    p = Change(rid, barrier_id, layout, set(affected), fluid=fluid)
    if stages and len(stages) > 1:
        if stages[-1] != layout or len(stage_barriers or ()) != len(stages) - 1:
            raise WorkerReconfigurationError(
                "stages must end at the layout, one barrier per later stage"
            )
        p.stages = list(stages)
        p.stage_of = {b: k for k, b in enumerate(stage_barriers or (), start=1)}
        before = [job.layout, *stages[:-1]]
        p.involved = [affected_tasks(job.graph, a, b) for a, b in zip(before, stages, strict=True)]
        for k, tasks in enumerate(p.involved):
            p.last_stage.update(dict.fromkeys(tasks, k))
    p.sync_only = sync_only_tasks(job.graph, job.layout, p.first) & p.affected
    if fluid:
        p.in_place = {
            t
            for t in in_place_owners(job.graph, job.layout, p.first) & p.affected
            if keyed_processor(job.tasks.get(t)) is not None
        }
    try:
        # Input channels for every channel into a task here that does not exist yet.
        for tid in job.local_task_ids(layout):
            for key, u, key_fn in job.input_keys(tid, layout):
                if key not in job.inputs:
                    p.new_inputs[key] = job.register_input(u, tid, key_fn)
        # New tasks here (including tasks moving in), idle until their update.
        for tid in job.local_task_ids(layout):
            if tid in job.tasks:
                continue
            gate = InputGate(on_dry=job.worker.task_ran_dry)
            for key, _u, _k in job.input_keys(tid, layout):
                gate.add(job.inputs[key])
            # Made for the first stage: a task new in a staged change owns no key group
            # it gains in a later stage until that group's state has come.
            p.new_tasks[tid] = await job.make_task(tid, p.first, gate)
        for tid, data in layout.logic.items():
            if layout.placement.get(tid) == job.me and data != job.layout.logic.get(tid):
                pickle.loads(data)  # the new logic must load here
    except BaseException:
        for key in p.new_inputs:
            job.unregister_input(key)
        for task in p.new_tasks.values():
            task.close()
        raise
    job.pending = p
    job.ended_early = None  # the change before has ended everywhere
    if precopy_min_bytes is not None:
        copyahead.start(job, p, precopy_min_bytes, precopy_budget_s, precopy_pause_s)


def barrier_aligned(job: JobRuntime, task: BaseTask, barrier: Barrier) -> bool:
    """Step 2: ``task`` has aligned and forwarded ``barrier``; True if it must pause for
    the pending reconfiguration's update (the worker has acked ``paused`` for it)."""
    p = job.pending
    if barrier.kind is not BarrierKind.RECONFIG or p is None:
        return False
    if barrier.id in p.stage_of:
        stage_aligned(job, p, p.stage_of[barrier.id], task)
        return False
    if barrier.id != p.barrier_id:
        return False
    tid = task.task_id
    if tid not in p.affected:
        return False
    job.worker.send(Paused(job.job_id, p.rid, tid))
    if tid in p.sync_only:  # it has taken in all a moving upstream task sent before
        return False
    if p.stages and tid not in p.involved[0]:  # its part comes in a later stage
        return False
    if tid in p.in_place:  # fluid: only the key groups it gains wait, for their state
        processor = keyed_processor(task)
        processor.await_groups(p.first.assignment[tid])
        processor.give_away(set(job.layout.assignment[tid]) - set(p.first.assignment[tid]))
        return False
    p.paused.add(tid)
    return True


def abort(job: JobRuntime, rid: int) -> None:
    """Undo a prepared reconfiguration; paused tasks resume on the old configuration."""
    p = job.pending
    if p is None or p.rid != rid:
        return
    job.pending = None
    p.precopy_stop = True  # the copying ahead stops after the group it is sending
    for tid, g in p.precopied:
        processor = keyed_processor(job.tasks.get(tid))
        if processor is not None:
            processor.untrack(g)
    p.precopied.clear()
    for tid in p.in_place:
        processor = keyed_processor(job.tasks.get(tid))
        if processor is not None:
            processor.keep_all()
            if processor.cancel_awaiting():
                logger.error("task %s had records of key groups it was to gain", tid)
    job.abort_barrier(p.barrier_id)
    for key in p.new_inputs:
        job.unregister_input(key)
    for task in p.new_tasks.values():
        task.close()
    for tid in p.paused:
        task = job.tasks.get(tid)
        if task is not None:
            task.resume()
    job.worker.state.drop(rid)


def update_received(job: JobRuntime, rid: int) -> None:
    """The update of ``rid`` has arrived and will run: a prepare read after it (the next
    step of a fluid plan, sent as soon as the workers with tasks in this one are done)
    waits for it instead of finding the reconfiguration still pending."""
    if job.pending is not None and job.pending.rid == rid:
        job.pending.updating = True


async def update(job: JobRuntime, rid: int) -> None:
    """Step 3: every affected task here applies its part and resumes independently.
    Raises :class:`WorkerReconfigurationError` naming the tasks whose part failed."""
    p = job.pending
    if p is None or p.rid != rid:
        raise WorkerReconfigurationError(f"update {rid} without a matching prepare")
    p.updating = True
    if p.precopy is not None:  # done by now: the worker replied prepared after it
        p.precopy_stop = True
        await asyncio.wait({p.precopy})
    p.t_update = time.perf_counter()
    old, new = job.layout, p.first
    involved = sorted(
        t
        for t in (p.involved[0] if p.stages else p.affected)
        if old.placement.get(t) == job.me or new.placement.get(t) == job.me
    )
    results = await asyncio.gather(
        *(_update_task(job, p, old, new, tid) for tid in involved), return_exceptions=True
    )
    errors = [
        f"{tid}: {r}"
        for tid, r in zip(involved, results, strict=True)
        if isinstance(r, BaseException)
    ]
    if p.stages and not errors:
        p.done[0] = set(involved)
        stage_finished(job, p, 0)
    else:
        job.layout = p.layout
        job.pending = None
        p.finished.set()
    if errors:
        raise WorkerReconfigurationError("; ".join(errors))
    if not p.stages:
        job.settle()


# -- each task's part of the update -----------------------------------------------------------


class Role(enum.Enum):
    """What an affected task here does in the update."""

    SYNC_ONLY = "sync only"  # it only had to align the barrier: nothing of its own changes
    IN_PLACE = "in place"  # fluid, keyed: gives and gains key groups while it runs
    LEAVES = "leaves"  # removed, or moving to another worker: hands everything over, stops
    ARRIVES = "arrives"  # new, or moving in: takes its state in, then starts
    ARRIVES_LIVE = "arrives live"  # fluid, keyed, new here: starts at once, state follows
    STAYS = "stays"  # here before and after: routing, inputs, key groups, logic change


def task_role(
    tid: str,
    here: str,
    old: Layout,
    new: Layout,
    *,
    sync_only: AbstractSet[str],
    in_place: AbstractSet[str],
    fluid: bool,
    keyed: bool,
) -> Role:
    """The role of task ``tid`` in a change from ``old`` to ``new`` on worker ``here``,
    where it is placed in one of them or both: ``sync_only`` and ``in_place`` are the
    change's tasks that only align its barrier and the keyed tasks that do not pause,
    ``fluid`` its mode, ``keyed`` whether the task's new instance here has keyed state.
    Pure: it looks at its arguments only."""
    if tid in sync_only:
        return Role.SYNC_ONLY
    if tid in in_place:
        return Role.IN_PLACE
    was_here = old.placement.get(tid) == here
    stays_here = new.placement.get(tid) == here
    if was_here and not stays_here:
        return Role.LEAVES
    if stays_here and not was_here:
        return Role.ARRIVES_LIVE if fluid and keyed else Role.ARRIVES
    return Role.STAYS


async def _update_task(job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str) -> None:
    """Task ``tid``'s part of the update from ``old`` to ``new``: the handler of its role."""
    t0 = time.perf_counter()
    keyed = keyed_processor(p.new_tasks.get(tid)) is not None
    role = task_role(
        tid,
        job.me,
        old,
        new,
        sync_only=p.sync_only,
        in_place=p.in_place,
        fluid=p.fluid,
        keyed=keyed,
    )
    await _HANDLERS[role](job, p, old, new, tid, t0)


async def _sync_only(
    job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float
) -> None:
    """It only had to align the barrier (see :func:`~runtime.layout.sync_only_tasks`)."""
    report(job, p, tid, 0.0, t0)


async def _in_place(
    job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float
) -> None:
    """Fluid, keyed, still running: ship what it gives while taking in what it gains."""
    task = job.tasks[tid]
    gained = set(new.assignment[tid]) - set(old.assignment[tid])
    await asyncio.gather(
        shipping.ship_out(job, p, task, old, new, everything=False),
        shipping.receive_groups(job, p, task, gained),
    )
    report(job, p, tid, 0.0, t0)


async def _leaves(
    job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float
) -> None:
    """Removed or moving to another worker: hand everything over, then stop and let go of
    its channels; it reports its last counts."""
    task = job.tasks.pop(tid)
    await shipping.ship_out(job, p, task, old, new, everything=True)
    pause = task.resume()  # measured before the stop cancels the wait
    await task.stop()
    for ch in task.outputs.channels:
        ch.detach()  # its receivers stop counting on this worker for it
    if isinstance(task, StreamTask):
        for key in list(task.gate.channels):
            job.unregister_input(key)
    report(job, p, tid, pause, t0, final_metrics=task.snapshot_metrics())


async def _arrives(
    job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float
) -> None:
    """New here (or moving in): take its state (a source: its position) in, then start."""
    task = p.new_tasks.pop(tid)
    position = await shipping.ship_in(job, p, task, old, new)
    job.tasks[tid] = task
    if isinstance(task, SourceTask):
        task.start(job.start_time, position, len(new.tasks_of(task.op.name)))
    else:
        task.start(job.start_time)
    report(job, p, tid, 0.0, t0)


async def _arrives_live(
    job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float
) -> None:
    """Fluid, keyed, new here: start at once; records of each key group wait for its state."""
    task = p.new_tasks.pop(tid)
    processor = keyed_processor(task)
    assert processor is not None
    groups = set(new.assignment[tid])
    for g in groups:
        processor.state.drop_group(g)  # an empty placeholder: the state is coming
    processor.await_groups(groups)
    job.tasks[tid] = task
    task.start(job.start_time)
    await shipping.receive_groups(job, p, task, groups)
    report(job, p, tid, 0.0, t0)


async def _stays(job: JobRuntime, p: Change, old: Layout, new: Layout, tid: str, t0: float) -> None:
    """Here before and after: rewire, ship what leaves, take in what arrives, swap its
    logic if that changed, then resume."""
    task = job.tasks[tid]
    await _rewire(job, task, new)
    await shipping.ship_out(job, p, task, old, new, everything=False)
    gained = await shipping.ship_in(job, p, task, old, new)
    if isinstance(task, SourceTask) and isinstance(task.reader, PartitionSetReader) and gained:
        for partition, position in gained.items():  # a partitioned source's, with positions
            task.reader.take(partition, position)
        task.partitions = tuple(new.partitions.get(tid, ()))
    elif isinstance(task, SourceTask) and task.partitions is not None:
        task.partitions = tuple(new.partitions.get(tid, ()))
    if new.logic.get(tid) != old.logic.get(tid) and isinstance(task, StreamTask):
        logic = new.logic_of(job.graph.operator(task.op.name), tid)
        task.processor = swap_logic(task.processor, logic, task.index)
    pause = task.resume()
    report(job, p, tid, pause, t0)


async def _rewire(job: JobRuntime, task: BaseTask, new: Layout) -> None:
    """Rebuild ``task``'s output edges for ``new``, reusing the channels whose target did
    not move; add its prepared input channels and remove those of upstream tasks gone."""
    tid = task.task_id
    before = task.outputs.channels
    task.outputs.set_edges(await job.edges(task.op, tid, new, task.outputs.channel_map()))
    if isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
        task.processor.splits = new.splits.get(task.op.name, {})  # its split keys from now on
    for ch in set(before) - set(task.outputs.channels):
        ch.detach()  # its target moved or went: the old link no longer carries it
    if isinstance(task, StreamTask):
        wanted = {key for key, _u, _k in job.input_keys(tid, new)}
        for key in list(task.gate.channels):
            if key not in wanted:
                task.gate.remove(key)
                task.aligner.remove_input(key)
                task.watermarks.remove_input(key)  # the task acts on it when it resumes
                job.unregister_input(key)
        for key in wanted:
            if key not in task.gate.channels:
                task.gate.add(job.inputs[key])
                task.aligner.add_input(key)
                task.watermarks.add_input(key)


_Handler = Callable[[JobRuntime, Change, Layout, Layout, str, float], Awaitable[None]]
_HANDLERS: dict[Role, _Handler] = {
    Role.SYNC_ONLY: _sync_only,
    Role.IN_PLACE: _in_place,
    Role.LEAVES: _leaves,
    Role.ARRIVES: _arrives,
    Role.ARRIVES_LIVE: _arrives_live,
    Role.STAYS: _stays,
}
