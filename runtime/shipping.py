"""The state a task gives away and takes in during a reconfiguration, on this worker.

The old owner of a key group exports it and sends it straight to the new owner's worker
(:func:`~runtime.handover.send_state`, in chunks, never through the control plane), or
hands it over as an object when the new owner is here; a group copied ahead
(:mod:`runtime.copyahead`) goes as the delta since its copy. The new owner takes each
group in from the worker's :class:`~runtime.handover.StateInbox` as it arrives: all before
it resumes (:func:`ship_in`), or in fluid mode one by one in the task's own loop while it
runs, its records of a group waiting for that group alone (:func:`receive_groups`). A
source that moves hands over its replay position the same way, and so does each
partition of a partitioned source that changes hands.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from . import precopy
from .change import Change, WorkerReconfigurationError, group_owners, keyed_processor
from .handover import send_state
from .jobruntime import JobRuntime
from .layout import Layout
from .operators import KeyedProcessor, SinkProcessor
from .partitioned import PartitionSetReader
from .task import BaseTask, SourceTask, StreamTask

__all__ = ["receive_groups", "send_part", "ship_in", "ship_out"]


async def ship_out(
    job: JobRuntime, p: Change, task: BaseTask, old: Layout, new: Layout, everything: bool
) -> None:
    """Send the state that leaves ``task`` to its new owners (worker to worker):
    ``everything`` it holds (it leaves this worker: a source's position too, and a sink
    hands its output over, :meth:`~runtime.io.SinkWriter.hand_over`), else the key groups
    it holds in ``old`` and not in ``new``."""
    tid = task.task_id
    if isinstance(task, SourceTask) and isinstance(task.reader, PartitionSetReader):
        await _ship_out_partitions(job, p, task.reader, task.op.name, tid, old, new, everything)
        return
    if isinstance(task, SourceTask) and everything and task.reader is not None:
        await send_part(
            job, p.rid, tid, new.placement[tid], "source", task.reader.position(), raw=False
        )
        return
    if isinstance(task, StreamTask) and isinstance(task.processor, SinkProcessor) and everything:
        moving = tid in new.placement
        state = task.processor.hand_over(p.barrier_id, moving)
        if moving:  # its successor adopts what it prepared (always sent: it waits for it)
            await send_part(job, p.rid, tid, new.placement[tid], "sink", state, raw=False)
        return
    if not (isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor)):
        return
    processor = task.processor
    state = processor.state
    owner_of = group_owners(new, task.op.name)
    if everything:
        leaving = list(state.owned())
    else:  # what ``old`` gives it: an earlier stage's groups may still be on their way
        kept, held = set(new.assignment.get(tid, ())), set(old.assignment.get(tid, ()))
        leaving = [g for g in state.owned() if g in held and g not in kept]
    if p.fluid:  # records of these groups wait for them: the busiest go first
        counts = task.metrics.key_group_counts or []
        leaving.sort(key=lambda g: -counts[g] if g < len(counts) else 0)
    for g in leaving:
        dest = owner_of[g]
        dest_worker = new.placement[dest]
        part: Any = None
        if dest_worker == job.me:
            job.worker.state.put(p.rid, job.mailbox(dest), g, state.group(g))  # as is
        elif (tid, g) in p.precopied:  # copied ahead: only what changed since
            touched = processor.untrack(g) or ()
            data = precopy.export_delta(state.group(g), touched, p.precopied.pop((tid, g)))
            part = precopy.part_name("delta", g)
        else:
            data, part = state.export_group(g), g
        # Let go of it before the send yields: a task still running (fluid) would
        # otherwise fire the group's timers on the state just exported, and its new owner
        # fire them again (a window emitted twice).
        state.drop_group(g)
        processor.shipped(g)
        if part is not None:
            await send_part(job, p.rid, dest, dest_worker, part, data, raw=True)
        if p.fluid:
            await asyncio.sleep(0)  # the worker's running tasks go on between groups


def partition_part(partition: str) -> str:
    """The part name a partition's position travels under."""
    return f"partition:{partition}"


async def _ship_out_partitions(
    job: JobRuntime,
    p: Change,
    reader: PartitionSetReader,
    op: str,
    tid: str,
    old: Layout,
    new: Layout,
    everything: bool,
) -> None:
    """A partitioned source task gives each partition it reads in ``old`` and not in
    ``new`` (``everything``: each one) to its owner in ``new``, with its position."""
    # Partition names are the source's own: another source may read a "p0" too.
    owner = {part: t for t in new.tasks_of(op) for part in new.partitions.get(t, ())}
    kept = set() if everything else set(new.partitions.get(tid, ()))
    for part in old.partitions.get(tid, ()):
        if part in kept:
            continue
        dest = owner[part]
        position = reader.give(part)
        await send_part(
            job, p.rid, dest, new.placement[dest], partition_part(part), position, raw=False
        )


async def send_part(
    job: JobRuntime, rid: int, dest: str, dest_worker: str, part: Any, data: Any, raw: bool
) -> None:
    """Hand ``data`` to task ``dest``: directly on this worker, else in chunked frames.

    ``raw`` data is bytes delivered as is (exported key-group state); other data is
    msgpack-encoded on the way and decoded on arrival (a source position).
    """
    if dest_worker == job.me:
        job.worker.state.put(rid, job.mailbox(dest), part, data)
        return
    await send_state(await job.link(dest_worker, state=True), rid, dest, part, data, raw)


async def ship_in(job: JobRuntime, p: Change, task: BaseTask, old: Layout, new: Layout) -> Any:
    """Wait for and import the state that arrives at ``task``; returns a source position
    (a partitioned source's task: partition -> position of each partition it gains)."""
    tid = task.task_id
    if isinstance(task, SourceTask) and task.partitions is not None:
        had = set(old.partitions.get(tid, ())) if old.placement.get(tid) == job.me else set()
        coming = [part for part in new.partitions.get(tid, ()) if part not in had]
        if not coming:
            return None
        read = {part for t in old.tasks_of(task.op.name) for part in old.partitions.get(t, ())}
        # A partition no task read before was found since: it starts where a new reader does.
        positions: dict[str, Any] = {part: None for part in coming if part not in read}
        names = {partition_part(part): part for part in coming if part in read}
        got = await job.worker.state.take(p.rid, job.mailbox(tid), set(names))
        positions.update({names[name]: position for name, position in got.items()})
        return positions
    if isinstance(task, StreamTask) and isinstance(task.processor, SinkProcessor):
        if old.placement.get(tid) not in (None, job.me):  # it moved here
            got = await job.worker.state.take(p.rid, job.mailbox(tid), {"sink"})
            if got["sink"] is not None:
                task.processor.writer.adopt(got["sink"])
        return None
    if isinstance(task, SourceTask):
        if old.placement.get(tid) not in (None, job.me):
            got = await job.worker.state.take(p.rid, job.mailbox(tid), {"source"})
            return got["source"]
        return None
    if not (isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor)):
        return None
    state = task.processor.state
    have = set(state.owned()) if old.placement.get(tid) == job.me else set()
    expected = set(new.assignment.get(tid, ())) - have
    if not expected:
        return None
    # Each group is taken in as it arrives, while the rest are still on their way.
    async for g, data in job.worker.state.arrivals(p.rid, job.mailbox(tid), expected):
        state.take_in(g, data)
        job.worker.state.recycle(data)
    return None


async def receive_groups(job: JobRuntime, p: Change, task: BaseTask, expected: set[int]) -> None:
    """Fluid mode: hand each key group in ``expected`` to ``task``'s loop as soon as its
    state arrives; return when all have been taken in (their waiting records done).
    Raises :class:`WorkerReconfigurationError` if the task ends before."""
    processor = keyed_processor(task)
    assert isinstance(task, StreamTask) and processor is not None
    taken: list[asyncio.Future] = []
    async for g, data in job.worker.state.arrivals(p.rid, job.mailbox(task.task_id), expected):
        taken.append(task.call_soon(functools.partial(processor.arrive, g, data)))
    if not taken:
        return
    everything = asyncio.gather(*taken)
    runner = task.runner
    if runner is not None:
        await asyncio.wait({everything, runner}, return_when=asyncio.FIRST_COMPLETED)
    if not everything.done():
        everything.cancel()
        raise WorkerReconfigurationError(f"task {task.task_id} ended before its key groups arrived")
    everything.result()
