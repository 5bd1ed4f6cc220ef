"""The stages of a fluid reconfiguration on this worker, and the reports of tasks' parts.

A fluid change can come in *stages* (``prepare(..., stages=...)``, see
:mod:`runtime.reconfigure`): the update makes the first layout; each later one only moves
key groups and starts with its own barrier (:func:`start`), which the tasks routing to the
moving groups' owners emit themselves, swapping their owner tables as they do; a task
that gives key groups ships them once it has aligned that barrier, one that gains them
has their records wait from then on. Nobody pauses, and a stage costs one barrier hop
instead of a prepare, a sync and an update. A stage may start before the one before it is
done here (the coordinator keeps a few under way, moving different key groups): each task
does its parts in the order of the barriers, and the worker reports the stages done in
order (:func:`finished`). A stage that took too long is withdrawn (:func:`withdraw`), and
the change then ends at the stage before it (:func:`end`).

:func:`report` tells the coordinator a task's part is done; a task with a part in a later
stage reports after that one.
"""

from __future__ import annotations

import asyncio
import time

from . import shipping
from .change import Change, WorkerReconfigurationError, keyed_processor
from .jobruntime import JobRuntime
from .messages import StageDone, Updated, UpdateFailed
from .partitioning import KeyGroupEdge
from .records import Barrier, BarrierKind
from .task import BaseTask, StreamTask, TaskStatus

__all__ = ["aligned", "end", "finished", "report", "staged", "start", "task_ended", "withdraw"]


def start(job: JobRuntime, rid: int, k: int, barrier_id: int, inject: list[str]) -> None:
    """Stage ``k`` of a staged fluid reconfiguration starts (every worker is done with
    the one before): key groups move from ``stages[k - 1]`` to ``stages[k]`` while
    everything runs. The barrier starts at ``inject`` (tasks here that route to the
    tasks whose key groups move, or sources); each task with a part in the stage does
    it when it aligns the barrier: a router swaps its owner table, a task that gives
    key groups ships them, one that gains them has their records wait for them. A task
    that has ended does its part at once. The worker reports ``stage_done`` when its
    tasks are done with the stage and it has reported the earlier stages it was told
    of. Stage ``k`` may start while earlier ones are under way here."""
    p = job.pending
    if p is not None and p.rid == rid and p.stages and k < len(p.stages):
        p.announced.add(k)
        p.done.setdefault(k, set())
        for tid in sorted(p.involved[k] & job.tasks.keys()):
            task = job.tasks[tid]
            if task.status != TaskStatus.RUNNING and tid not in p.done[k]:
                _ended_task_part(job, p, k, task)
    barrier = Barrier(BarrierKind.RECONFIG, barrier_id)
    for tid in inject:
        task = job.tasks.get(tid)
        if task is not None and task.status == TaskStatus.RUNNING:
            task.inject(barrier)  # type: ignore[attr-defined]
    if p is None or p.rid != rid or not p.stages:
        job.worker.send(StageDone(job.job_id, rid, k))
    else:
        _check(job, p)


def withdraw(job: JobRuntime, rid: int, k: int, barrier_id: int, inject: list[str]) -> bool:
    """Stage ``k`` took too long: withdraw its barrier from the tasks here that were to
    start it. True if none of them had emitted it and no task here has done its part
    (an ended task does it at once): then nothing of the stage happened here, and
    nothing will unless :func:`start` is called again (the stage goes on after all)."""
    p = staged(job, rid)
    clean = not (p is not None and p.done.get(k))
    for tid in inject:
        task = job.tasks.get(tid)
        if isinstance(task, StreamTask):
            clean = task.withdraw(barrier_id) and clean
        elif task is not None and task.status == TaskStatus.RUNNING:
            clean = False  # a source: its barrier may be on its way
    if p is not None:  # no part of stage k starts now (later ones were withdrawn before it)
        p.announced = {j for j in p.announced if j < k}
    return clean


def end(job: JobRuntime, rid: int, last: int) -> None:
    """The reconfiguration ends at stage ``last`` (a later one was withdrawn before it
    started anywhere): tasks with a part in later stages report now. A worker that
    was done with the change already takes the job to be on stage ``last`` too."""
    p = staged(job, rid)
    if p is None:
        return
    if p is job.ended_early:
        job.ended_early = None
        job.layout = p.stages[last]
        return
    for tid in sorted(job.tasks):
        if p.last_stage.get(tid, 0) > last:
            p.last_stage[tid] = last
            report(job, p, tid, 0.0, p.t_update, last=True)
    p.stages = p.stages[: last + 1]
    p.layout = p.stages[-1]
    job.layout = p.layout
    job.pending = None
    p.finished.set()
    job.settle()


def task_ended(job: JobRuntime, task: BaseTask) -> None:
    """A task here ended; if a stage under way still expects its part, it does it now
    (it aligns no more barriers)."""
    p = job.pending
    if p is None or not p.stages:
        return
    for k in sorted(p.announced - p.reported):  # those under way
        if task.task_id in p.involved[k] and task.task_id not in p.done.setdefault(k, set()):
            _ended_task_part(job, p, k, task)


def aligned(job: JobRuntime, p: Change, k: int, task: BaseTask) -> None:
    """``task`` has aligned the barrier of stage ``k``: it does its part if it has one."""
    tid = task.task_id
    if tid in p.involved[k] and tid not in p.done.setdefault(k, set()):
        _part(job, p, k, task, has_aligned=True)


def staged(job: JobRuntime, rid: int) -> Change | None:
    """The staged change ``rid``, pending here or done here before it ended."""
    for p in (job.pending, job.ended_early):
        if p is not None and p.rid == rid and p.stages:
            return p
    return None


def finished(job: JobRuntime, p: Change, k: int) -> None:
    """Report stage ``k`` done here; after the last stage a task here has a part in,
    the reconfiguration is over on this worker."""
    p.reported.add(k)
    job.layout = p.stages[k]
    job.worker.send(StageDone(job.job_id, p.rid, k))
    if k >= max((p.last_stage.get(t, 0) for t in job.tasks), default=0):
        job.layout = p.layout
        job.pending = None
        job.ended_early = p if k < len(p.stages) - 1 else None
        p.finished.set()
        job.settle()


def report(
    job: JobRuntime,
    p: Change,
    tid: str,
    pause_s: float,
    t0: float,
    final_metrics: dict | None = None,
    last: bool = False,
) -> None:
    """Tell the coordinator ``tid``'s part here is done. A task with a part in a later
    stage reports after that one (``last``; its time counted from the update's start);
    a task leaving this worker (``final_metrics``) has no later part here."""
    if p.stages:
        pause_s = max(pause_s, p.pause_s.pop(tid, 0.0))
        if final_metrics is None and not last and p.last_stage.get(tid, 0) > 0:
            p.pause_s[tid] = pause_s
            return
        t0 = p.t_update
    job.worker.send(
        Updated(
            job.job_id,
            p.rid,
            tid,
            pause_ms=round(pause_s * 1000, 3),
            update_ms=round((time.perf_counter() - t0) * 1000, 3),
            metrics=final_metrics,  # the last counts of a task that left this worker
        )
    )


def _part(job: JobRuntime, p: Change, k: int, task: BaseTask, has_aligned: bool) -> None:
    """Do ``task``'s part of stage ``k``: swap its routing now; ship and take in key
    groups in the background (records of gained groups wait from now on)."""
    tid = task.task_id
    prev, nxt = p.stages[k - 1], p.stages[k]
    p.done[k].add(tid)
    for edge in task.outputs.edges:
        if isinstance(edge, KeyGroupEdge):
            down = job.graph.operator(edge.operator)
            edge.set_owner(nxt.owner_table(down, [ch.target for ch in edge.channels]))
    processor = keyed_processor(task)
    if processor is None or prev.assignment.get(tid) == nxt.assignment.get(tid):
        _task_done(job, p, k, tid)
        return
    gained = set(nxt.assignment[tid]) - set(prev.assignment[tid])
    early = sorted(g for g in gained if processor.state.owns(g))
    if early:  # its records would count on empty state, then lose it to the shipped one
        raise WorkerReconfigurationError(
            f"task {tid} owns key groups {early[:10]} before they arrive"
        )
    if has_aligned:
        processor.await_groups(gained)
        processor.give_away(set(prev.assignment[tid]) - set(nxt.assignment[tid]))

    async def part() -> None:
        # An ended task takes its groups in directly: no record of them can come.
        receive = (
            shipping.receive_groups(job, p, task, gained)
            if has_aligned
            else shipping.ship_in(job, p, task, prev, nxt)
        )
        await asyncio.gather(shipping.ship_out(job, p, task, prev, nxt, everything=False), receive)

    def part_done(fut: asyncio.Future) -> None:
        job.stage_work.discard(fut)
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            _failed(job, p, k, tid, exc)
            return
        _task_done(job, p, k, tid)

    work = asyncio.ensure_future(part())
    job.stage_work.add(work)
    work.add_done_callback(part_done)


def _ended_task_part(job: JobRuntime, p: Change, k: int, task: BaseTask) -> None:
    """The part of a task that has ended (it aligns no barrier any more): done at once,
    from the worker's control loop, which an error must not break."""
    try:
        _part(job, p, k, task, has_aligned=False)
    except Exception as exc:
        _failed(job, p, k, task.task_id, exc)


def _failed(job: JobRuntime, p: Change, k: int, tid: str, exc: BaseException) -> None:
    error = f"worker {job.me}: {tid} in stage {k}: {exc}"
    job.worker.send(UpdateFailed(job.job_id, p.rid, error))


def _task_done(job: JobRuntime, p: Change, k: int, tid: str) -> None:
    p.completed.setdefault(k, set()).add(tid)
    if p.last_stage.get(tid, 0) == k:
        report(job, p, tid, 0.0, p.t_update, last=True)
    _check(job, p)


def _check(job: JobRuntime, p: Change) -> None:
    """Report the stages started here that are done here, in order: a stage is done
    once every task here with a part in it has done that part. A worker is told only
    of the stages it has a part in (a later one can come before an earlier one it
    was not told of is done elsewhere)."""
    while job.pending is p and (under_way := sorted(p.announced - p.reported)):
        k = under_way[0]
        if (p.involved[k] & job.tasks.keys()) - p.completed.get(k, set()):
            return
        finished(job, p, k)
