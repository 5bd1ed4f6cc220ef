"""Copying key groups ahead during a prepare: which, in what order, and when to stop.

Once a reconfiguration is prepared here (``prepare(..., precopy_min_bytes=...)``, see
:mod:`runtime.reconfigure`), a running keyed task here whose key groups leave for a task
on another worker, and come to at least that much state, copies them ahead, coldest
first, while it runs (:func:`start`); the worker replies ``prepared`` when that is done
(or its time is up). Its update then ships only what changed in those groups since
(:func:`runtime.shipping.ship_out`). Nothing running changes: an abort drops the copies.
What a copy and a delta hold is :mod:`runtime.precopy`; how the receiving worker reads
them, :mod:`runtime.handover`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import precopy
from .change import Change, group_owners, keyed_processor
from .handover import IdleBudget, send_state, ships_within
from .jobruntime import JobRuntime
from .task import TaskStatus

__all__ = [
    "PRECOPY_RATE_MIN_BYTES",
    "PRECOPY_ROOM_WAIT_S",
    "PRECOPY_WINDOW",
    "copy_ahead",
    "moves",
    "start",
    "under_way",
]

# The copy ahead stops early for a pause budget (see copy_ahead) only once this much has
# gone, so that the rate it estimates the rest's shipping time from is measured.
PRECOPY_RATE_MIN_BYTES = 4 << 20
# Copies ahead one receiving worker may have unread before the next waits (it reads them
# at its idle moments), and for how long at most: the receiver reads at least one copy in
# that time (WorkerProcess.caught_up waits as long), so a longer wait means it has dropped them.
PRECOPY_WINDOW = 2
PRECOPY_ROOM_WAIT_S = 0.05

Move = tuple[str, int, str, str, int]  # (task, key group, new owner, its worker, its size)


def start(job: JobRuntime, p: Change, min_bytes: int, budget_s: float, pause_s: float) -> None:
    """Start copying ahead what the tasks here give to other workers in ``p`` (see
    :func:`moves`), for at most ``budget_s`` and until what is left would ship within
    ``pause_s`` (see :func:`copy_ahead`); :func:`under_way` gives the copying."""
    planned = moves(job, p, min_bytes)
    if planned:
        p.precopy = asyncio.ensure_future(copy_ahead(job, p, planned, budget_s, pause_s))


def under_way(job: JobRuntime, rid: int) -> asyncio.Task | None:
    """The copying ahead that prepared reconfiguration ``rid`` started here, if any; it
    returns what it copied (``ms``, ``bytes``, ``groups``)."""
    p = job.pending
    return p.precopy if p is not None and p.rid == rid else None


def moves(job: JobRuntime, p: Change, min_bytes: int) -> list[Move]:
    """(task, key group, new owner, its worker, its size as last measured) for each key
    group that a running task here gives to a task on another worker in the update,
    for the tasks whose leaving state comes to at least ``min_bytes``; coldest groups
    first, since keys touched after their copy are sent again."""
    found: list[Move] = []
    for tid in sorted(p.affected & job.tasks.keys()):
        task = job.tasks[tid]
        processor = keyed_processor(task)
        if processor is None or task.status != TaskStatus.RUNNING:
            continue
        owner_of = group_owners(p.first, task.op.name)
        away = [
            (g, owner_of[g])
            for g in processor.state.owned()
            if p.first.placement[owner_of[g]] != job.me
        ]
        if not away:
            continue
        if not processor.state.group_sizes():
            processor.state.size()  # never measured yet
        sizes = processor.state.group_sizes()
        if sum(sizes.get(g, 0) for g, _ in away) < min_bytes:
            continue
        counts = task.metrics.key_group_counts or []
        away.sort(key=lambda m: counts[m[0]] if m[0] < len(counts) else 0)
        found += [(tid, g, dest, p.first.placement[dest], sizes.get(g, 0)) for g, dest in away]
    return found


async def copy_ahead(
    job: JobRuntime, p: Change, planned: list[Move], budget_s: float, pause_s: float = 0.0
) -> dict[str, Any]:
    """Copy each of ``planned`` ahead, in order, to its new owner's worker while the tasks
    run, until all are copied, the copying is stopped (an abort), ``budget_s`` has
    passed, or what is left would ship within ``pause_s`` at the pace the copies went
    so far, on this end and at the receivers (:func:`~runtime.handover.ships_within`:
    the stop-and-copy point of a virtual machine's live migration, QEMU's downtime
    limit); what is not copied goes whole in the update. It goes at idle
    priority: each group once the tasks here have caught up with their input
    (:meth:`WorkerServices.caught_up`), so that a record waits at most for one group's copy
    (about a millisecond per 1.5 MB here), and for ``PRECOPY_IDLE_BUDGET_S`` in all
    (:class:`~runtime.handover.IdleBudget`); the receiver reads the copies the same way
    (:meth:`~runtime.handover.StateInbox.read_copies`), and paces the copying: at most
    ``PRECOPY_WINDOW`` copies go to a worker that has not read them
    (:meth:`~runtime.peerlink.PeerLink.copy_room`)."""
    t0 = time.perf_counter()
    sent = 0
    sending_s = 0.0  # spent pickling and writing the copies, idle waits left out
    left = sum(size for *_, size in planned)
    idle = IdleBudget(p.rid)  # waits for the tasks here to catch up with their input
    room = 0.0  # for the receiver to read the copies it has
    try:
        for tid, g, dest, dest_worker, size in planned:
            link = await job.link(dest_worker, state=True)
            t_room = time.perf_counter()
            await link.copy_room(p.rid, PRECOPY_WINDOW, PRECOPY_ROOM_WAIT_S)
            room += time.perf_counter() - t_room
            await idle.wait(job.worker.caught_up)
            if p.precopy_stop or time.perf_counter() - t0 > budget_s:
                break
            if sent >= PRECOPY_RATE_MIN_BYTES and ships_within(
                left, pause_s, sent, sending_s, *_copies_read(job, p.rid)
            ):
                break  # the rest ships within the pause: copying on only delays the change
            processor = keyed_processor(job.tasks.get(tid))
            left -= size
            if processor is None or not processor.state.owns(g):
                continue
            t1 = time.perf_counter()
            data, memo = precopy.export_base(processor.state.group(g))
            processor.track(g)  # no await since the copy: no touched key is missed
            p.precopied[(tid, g)] = memo
            nbytes = sum(map(len, data))
            sent += nbytes
            await send_state(link, p.rid, dest, precopy.part_name("base", g), data, raw=True)
            link.copy_sent(p.rid, nbytes)
            sending_s += time.perf_counter() - t1
            await asyncio.sleep(0)  # the tasks see the input that came meanwhile
    finally:  # the update reads what is still unread; late reads are not counted
        for link in job.state_links.values():
            link.forget_copies(p.rid)
    ms = round((time.perf_counter() - t0) * 1000, 3)
    return {
        "ms": ms,
        "bytes": sent,
        "groups": len(p.precopied),
        "left_bytes": max(0, left),
        "waited_ms": round(idle.spent * 1000, 3),
        "room_ms": round(room * 1000, 3),
        "sending_ms": round(sending_s * 1000, 3),
    }


def _copies_read(job: JobRuntime, rid: int) -> tuple[int, float]:
    """(bytes, seconds) of the copies ahead of ``rid`` read so far by the workers they
    went to, and the seconds those said reading them took."""
    read = [link.copies_read(rid) for link in job.state_links.values()]
    return sum(b for b, _ in read), sum(s for _, s in read)
