"""The coordinator's side of a live reconfiguration: prepare, sync, update, commit.

Protocol (the worker's side is :mod:`runtime.deployment`):

1. **Prepare.** Compute the affected tasks (:func:`runtime.layout.affected_tasks`); send
   ``prepare`` with the whole new layout to every worker of the old or new layout; each
   creates new tasks idle, registers input channels for new channels and loads new
   logic. A task whose key groups leave for another worker, with at least
   ``RuntimeConfig.precopy_min_bytes`` of state, copies them ahead while it runs
   (:mod:`runtime.precopy`, for at most ``PRECOPY_BUDGET_S``); its worker replies once
   that is done, and the update then ships only what changed since. Any failure, or
   silence past ``PREPARE_TIMEOUT_S``, aborts: nothing changed.
2. **Sync.** Inject a reconfiguration barrier at the sources. Every task forwards it once
   aligned; affected tasks then pause and ack ``paused`` (those that change nothing
   themselves, and in fluid mode keyed tasks that only give or gain key groups, ack
   without pausing); unaffected tasks never stop.
   Sync ends when every affected task that existed before has paused. Past the sync
   timeout the reconfiguration aborts: paused tasks resume with the old configuration.
3. **Update.** Send ``update``: each affected task applies its own part (routing swap,
   state shipped worker to worker, logic swap, stop or start) and resumes at once,
   reporting ``updated`` with its pause time. A failure or silence past
   ``UPDATE_TIMEOUT_S`` fails the job (state may be half moved; recovery from a
   checkpoint is the fault-tolerance issue's).
   Staged (fluid, :func:`_drive_stages`): the update makes the first of several layouts
   and each later one, which only moves key groups, is a *stage*: once every worker is
   done with the stage before, a barrier starts at the tasks that route to the moving
   key groups' owners, which swap their routing as they emit it; givers ship, gainers
   wait for the state of what they gain, nothing pauses.
4. **Commit.** The job's layout becomes the new one; the record keeps timings.

A plan under way can be cancelled (:func:`.plans.cancel`): a run still preparing or
syncing aborts as a sync timeout does (status ``cancelled``: paused tasks resume on the
old configuration); a staged run starts no further stage (the job stays on the last stage
made); a run whose update has started goes on to its end (state is moving).

Only one reconfiguration runs per job at a time: others wait in order for the job's lock,
or are refused with :class:`ReconfigurationBusy` when the caller does not want to wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime import codeload
from runtime.layout import (
    Layout,
    affected_tasks,
    only_key_groups_move,
    stage_entry,
    stages_can_overlap,
)
from runtime.messages import (
    Abort,
    InjectBarrier,
    Prepare,
    StagesEnd,
    StageStart,
    StageWithdraw,
    Update,
)
from runtime.records import BarrierKind

if TYPE_CHECKING:
    from .model import Job
    from .ports import JobHost

__all__ = [
    "PREPARE_TIMEOUT_S",
    "SYNC_TIMEOUT_S",
    "UPDATE_TIMEOUT_S",
    "Cancellation",
    "Reconfiguration",
    "ReconfigurationBusy",
    "ReconfigurationError",
    "elapsed_ms",
    "new_record",
    "next_record_id",
    "reconfigure",
    "refuse_if_busy",
    "run_locked",
]

logger = logging.getLogger(__name__)

PREPARE_TIMEOUT_S = 15.0  # workers create idle tasks and channels and load logic within this
# Copying state ahead stops starting new key groups after this (well within the prepare
# timeout); what is left goes whole in the update.
PRECOPY_BUDGET_S = 10.0
SYNC_TIMEOUT_S = 10.0  # the barrier reaches every affected task within this, or we abort
UPDATE_TIMEOUT_S = 60.0  # state moves and tasks resume within this (100 MB over loopback: ~1 s)
ABORT_TIMEOUT_S = 5.0  # workers answer a stage's withdrawal within this

ENDED = ("completed", "failed", "aborted", "cancelled")

_ids = itertools.count(1)


def next_record_id() -> int:
    """A reconfiguration id never handed out before (live runs and restarts share them)."""
    return next(_ids)


class ReconfigurationError(RuntimeError):
    """A reconfiguration that cannot start (bad layout, job not running)."""


class ReconfigurationBusy(ReconfigurationError):
    """Another reconfiguration of the same job is running and the caller would not wait."""


@dataclass
class Cancellation:
    """What the runs of one plan share to learn that it was cancelled: the reason once
    it was (see :func:`.plans.cancel`), the plan's record once it has one, and how the
    plan is carried out (``fluid``: in steps; ``restart``: by the baseline)."""

    fluid: bool = False
    restart: bool = False
    reason: str | None = None
    record: Reconfiguration | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason


@dataclass
class Reconfiguration:
    """The record of one reconfiguration: what, who, how it went, how long each phase took."""

    id: int
    job_id: str
    old: Layout
    new: Layout
    affected: set[str]
    status: str = "pending"  # pending, preparing, syncing, updating, then an ENDED one
    error: str | None = None
    plan: Any = None  # the plan it came from, kept for the record
    timings_ms: dict[str, float] = field(default_factory=dict)
    pause_ms: dict[str, float] = field(default_factory=dict)
    update_ms: dict[str, float] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    barrier_id: int | None = None
    version: int | None = None  # the abstraction version it made (or left) current
    steps: int = 1  # versions it went through (fluid mode: one per batch, see .fluid)
    runs: int = 1  # live protocol runs (prepare, sync, update) it took: steps go as stages
    stages: list[Layout] = field(default_factory=list, repr=False)  # staged fluid: see _run
    worker_map: dict[str, str] = field(default_factory=dict)  # old -> new worker (a restart)
    precopied: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> copied ahead
    listener: Callable[[Reconfiguration], None] | None = field(default=None, repr=False)
    # Protocol state (filled by the coordinator's message handler).
    _prepared: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)
    _to_pause: set[str] = field(default_factory=set, repr=False)
    _to_update: set[tuple[str, str]] = field(default_factory=set, repr=False)  # (worker, task)
    _synced: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _updated: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _failure: str | None = field(default=None, repr=False)
    _stages_done: dict[int, set[str]] = field(default_factory=dict, repr=False)  # -> workers
    _stage_event: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _withdrawals: dict[str, asyncio.Future] = field(default_factory=dict, repr=False)
    stages_made: int = 0  # staged: the stages every worker is done with, so far
    stage_ms: list[float] = field(default_factory=list)  # staged: how long each stage took
    cut_short: bool = False  # staged: later stages were withdrawn (see _drive_stages)
    cancellation: Cancellation | None = field(default=None, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in ("status", "ended_at", "version", "stages_made"):  # tell whoever follows
            listener = getattr(self, "listener", None)
            if listener is not None:
                listener(self)

    @property
    def done(self) -> bool:
        return self.status in ENDED

    @property
    def cancelled(self) -> str | None:
        """Why the plan this run belongs to was cancelled, if it was."""
        return self.cancellation.reason if self.cancellation is not None else None

    def workers(self) -> list[str]:
        return sorted(set(self.old.placement.values()) | set(self.new.placement.values()))

    # -- messages from workers -------------------------------------------------------------

    def on_prepared(
        self, worker: str, error: str | None, precopied: dict[str, float] | None = None
    ) -> None:
        if precopied:
            self.precopied[worker] = precopied
        fut = self._prepared.get(worker)
        if fut is not None and not fut.done():
            fut.set_result(error)

    def on_paused(self, task: str) -> None:
        self._to_pause.discard(task)
        if not self._to_pause:
            self._synced.set()

    def on_updated(self, worker: str, task: str, pause_ms: float, update_ms: float) -> None:
        if task in self.old.placement:
            self.pause_ms[task] = max(pause_ms, self.pause_ms.get(task, 0.0))
        self.update_ms[task] = max(update_ms, self.update_ms.get(task, 0.0))
        self._to_update.discard((worker, task))
        if not self._to_update:
            self._updated.set()

    def on_stage_done(self, worker: str, stage: int) -> None:
        self._stages_done.setdefault(stage, set()).add(worker)
        self._stage_event.set()

    def on_stage_withdrawn(self, worker: str, clean: bool) -> None:
        fut = self._withdrawals.get(worker)
        if fut is not None and not fut.done():
            fut.set_result(clean)

    def stage_is_done(self, stage: int, workers: set[str]) -> bool:
        return workers <= self._stages_done.get(stage, set())

    async def stage_done(self, stage: int, workers: set[str], or_cancelled: bool = False) -> None:
        """Wait until every worker in ``workers`` is done with ``stage`` (or it failed, or
        with ``or_cancelled`` the plan was cancelled)."""
        while not self.stage_is_done(stage, workers) and self._failure is None:
            if or_cancelled and self.cancelled:
                return
            self._stage_event.clear()
            await self._stage_event.wait()

    def on_task_finished(self, task: str) -> None:
        """A task ended (its inputs ended) before pausing: the barrier cannot reach it."""
        if task in self._to_pause:
            self.on_failed(f"task {task} finished before it reached the barrier")

    def on_cancel(self) -> None:
        """The plan was cancelled: stop waiting for prepare replies and for the sync (the
        run then aborts, :func:`_run`); a staged run starts no further stage and withdraws
        the one under way if it can (:func:`_drive_stages`)."""
        for fut in self._prepared.values():
            if not fut.done():
                fut.set_result(None)
        self._synced.set()
        self._stage_event.set()

    def on_failed(self, error: str) -> None:
        self._failure = self._failure or error
        for fut in self._prepared.values():
            if not fut.done():
                fut.set_result(error)
        self._synced.set()
        self._updated.set()
        self._stage_event.set()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job_id": self.job_id,
            "status": self.status,
            "error": self.error,
            "version": self.version,
            "affected_tasks": sorted(self.affected),
            "timings_ms": dict(self.timings_ms),
            "pause_ms": dict(sorted(self.pause_ms.items())),
            "created_at": self.created_at,
            "ended_at": self.ended_at,
        }


async def reconfigure(
    coordinator: JobHost,
    job: Job,
    new: Layout,
    *,
    wait: bool = True,
    sync_timeout_s: float | None = None,
    plan: Any = None,
) -> Reconfiguration:
    """Change ``job`` to ``new`` live; returns the record (completed, aborted or failed).

    Raises :class:`ReconfigurationBusy` if ``wait`` is false and another reconfiguration
    of the job runs, and :class:`ReconfigurationError` if the job is not running or the
    layout names unknown workers or leaves key groups unowned.
    """
    refuse_if_busy(job, wait)
    async with job.lock:
        return await run_locked(coordinator, job, new, plan=plan, sync_timeout_s=sync_timeout_s)


def new_record(job: Job, layout: Layout, plan: Any) -> Reconfiguration:
    """A record, kept in the job's history, for a change that starts from ``layout`` and
    whose target and affected tasks are filled in as it goes (fluid mode)."""
    rec = Reconfiguration(next_record_id(), job.id, layout, layout, set(), plan=plan)
    job.reconfigurations.append(rec)
    return rec


def refuse_if_busy(job: Job, wait: bool) -> None:
    """Raise :class:`ReconfigurationBusy` if ``job`` is changing and the caller won't wait."""
    if job.lock.locked() and not wait:
        raise ReconfigurationBusy(f"job {job.id} is being reconfigured; try again when it is done")


async def run_locked(
    coordinator: JobHost,
    job: Job,
    new: Layout,
    *,
    plan: Any = None,
    sync_timeout_s: float | None = None,
    on_change: Callable[[Reconfiguration], None] | None = None,
    record: bool = True,
    fluid: bool = False,
    stages: list[Layout] | None = None,
    cancellation: Cancellation | None = None,
) -> Reconfiguration:
    """:func:`reconfigure` for a caller that already holds ``job.lock``.

    ``on_change(record)`` is called when the record is created and whenever its status
    changes or it ends (on the coordinator's loop; it must not block). With ``record``
    false the record is not kept in the job's history (a step of a fluid plan, whose own
    record is kept instead). With ``fluid`` keyed tasks that only gain or give key groups
    do not pause (see :mod:`runtime.deployment`). ``stages`` (fluid): layouts to go
    through after ``new``'s predecessor, ending at ``new``; each after the first only moves
    key groups (see :func:`_drive_stages`). ``cancellation``: the plan's, shared by its runs
    (a run of a plan already cancelled ends ``cancelled`` before it starts).
    """
    if job.status != "running":
        raise ReconfigurationError(f"job {job.id} is {job.status}, not running")
    _check_layout(coordinator, job, new)
    stages = list(stages or ())
    if stages and stages[-1] != new:
        raise ReconfigurationError("the last stage must be the new layout")
    if len(stages) > 1 and not (
        fluid and all(only_key_groups_move(a, b) for a, b in itertools.pairwise(stages))
    ):
        raise ReconfigurationError("stages after the first may only move key groups (fluid)")
    path = [job.layout, *stages] if len(stages) > 1 else [job.layout, new]
    affected = set().union(*(affected_tasks(job.graph, a, b) for a, b in itertools.pairwise(path)))
    rec = Reconfiguration(next_record_id(), job.id, job.layout, new, affected, plan=plan)
    rec.stages = stages if len(stages) > 1 else []
    rec.cancellation = cancellation
    if record:
        job.reconfigurations.append(rec)
        if cancellation is not None:
            cancellation.record = rec
    if on_change is not None:
        rec.listener = on_change
        on_change(rec)
    if rec.cancelled:  # before anything was sent: nothing changed
        rec.error = rec.cancelled
        rec.timings_ms = {"prepare": 0.0, "sync": 0.0, "update": 0.0, "total": 0.0}
        rec.status = "cancelled"
        rec.ended_at = time.time()
        return rec
    if not rec.affected:
        rec.status = "completed"
        rec.timings_ms = {"prepare": 0.0, "sync": 0.0, "update": 0.0, "total": 0.0}
        rec.ended_at = time.time()
        return rec
    job.status = "reconfiguring"
    job.active = rec
    try:
        await _run(
            coordinator,
            job,
            rec,
            SYNC_TIMEOUT_S if sync_timeout_s is None else sync_timeout_s,
            fluid,
        )
    finally:
        job.active = None
        if job.status == "reconfiguring":
            job.status = "running"
        rec.ended_at = time.time()
    return rec


def _check_layout(coordinator: JobHost, job: Job, new: Layout) -> None:
    alive = {w.id for w in coordinator.alive_workers()}
    unknown = sorted(set(new.placement.values()) - alive)
    if unknown:
        raise ReconfigurationError(f"workers {unknown} are not registered and alive")
    for op in job.graph.operators:
        tasks = new.tasks_of(op.name)
        if not tasks:
            raise ReconfigurationError(f"operator {op.name!r} would have no task")
        if op.keyed:
            try:
                new.owner_table(op, tasks)
            except ValueError as exc:
                raise ReconfigurationError(str(exc)) from None
    finished = sorted(affected_tasks(job.graph, job.layout, new) & job.finished_tasks)
    if finished:
        raise ReconfigurationError(
            f"tasks {finished[:10]} have finished; finished tasks cannot change"
        )
    sources = {t for op in job.graph.sources() for t in job.layout.tasks_of(op.name)}
    if sources <= job.finished_tasks:
        raise ReconfigurationError(f"job {job.id} is draining (every source has finished)")


async def _run(
    coordinator: JobHost, job: Job, rec: Reconfiguration, sync_timeout_s: float, fluid: bool
) -> None:
    loop = asyncio.get_running_loop()
    t_start = time.perf_counter()
    workers = rec.workers()
    # Step 1. Prepare.
    rec.status = "preparing"
    rec.barrier_id = coordinator.next_barrier_id()
    graph = pickle.dumps(job.graph)
    stage_barriers = [coordinator.next_barrier_id() for _ in rec.stages[1:]]
    msg = Prepare(
        job_id=job.id,
        rid=rec.id,
        barrier_id=rec.barrier_id,
        layout=rec.new,
        affected=tuple(sorted(rec.affected)),
        workers=coordinator.data_addresses(),
        code=codeload.sources_for([graph, *rec.new.logic.values()]),
        fluid=fluid,
        precopy_min_bytes=coordinator.config.precopy_min_bytes,
        precopy_budget_s=PRECOPY_BUDGET_S,
        precopy_pause_s=coordinator.config.precopy_pause_ms / 1000,
        stages=tuple(rec.stages),
        stage_barriers=tuple(stage_barriers),
    )
    joining = dataclasses.replace(  # a worker that hosts none of the job's tasks yet
        msg,
        graph=graph,
        current_layout=rec.old,
        config=coordinator.channel_config(),
        start_time=job.started_at,
    )
    hosting = set(rec.old.workers_used())
    for wid in workers:
        rec._prepared[wid] = loop.create_future()
        coordinator.send(wid, msg if wid in hosting else joining)
    try:
        errors = await asyncio.wait_for(asyncio.gather(*rec._prepared.values()), PREPARE_TIMEOUT_S)
        failure = "; ".join(dict.fromkeys(e for e in errors if e))  # one failure, told once
    except TimeoutError:
        failure = f"prepare timed out after {PREPARE_TIMEOUT_S:.0f}s"
    t_prepared = time.perf_counter()
    rec.timings_ms["prepare"] = elapsed_ms(t_start, t_prepared)
    if rec.precopied:  # part of the prepare: the longest a worker spent copying ahead
        rec.timings_ms["precopy"] = max(c["ms"] for c in rec.precopied.values())
    if failure:
        await _abort(coordinator, rec, workers, f"prepare failed: {failure}", "failed", t_start)
        return
    if rec.cancelled:  # a new task or worker made ready is let go again
        await _abort(coordinator, rec, workers, rec.cancelled, "cancelled", t_start)
        return
    # Step 2. Sync: barrier at the sources; affected tasks that exist pause.
    rec.status = "syncing"
    rec._to_pause = {t for t in rec.affected if t in rec.old.placement}
    # A task that moves reports twice: its old instance (handed over) and its new one.
    rec._to_update = {
        (layout.placement[t], t)
        for layout in (rec.old, rec.new)
        for t in rec.affected
        if t in layout.placement
    }
    if not rec._to_pause:
        rec._synced.set()
    if rec.cancelled:  # as the sync started (no barrier sent): nothing to take back
        await _abort(coordinator, rec, workers, rec.cancelled, "cancelled", t_start)
        return
    for wid in rec.old.workers_used():
        coordinator.send(wid, InjectBarrier(job.id, BarrierKind.RECONFIG, rec.barrier_id))
    try:
        await asyncio.wait_for(rec._synced.wait(), sync_timeout_s)
    except TimeoutError:
        waiting = sorted(rec._to_pause)
        rec.timings_ms["sync"] = elapsed_ms(t_prepared, time.perf_counter())
        await _abort(
            coordinator,
            rec,
            workers,
            f"sync timed out after {sync_timeout_s:g}s: tasks {waiting[:10]} did not reach the barrier",
            "aborted",
            t_start,
        )
        return
    t_synced = time.perf_counter()
    rec.timings_ms["sync"] = elapsed_ms(t_prepared, t_synced)
    if rec._failure:  # nothing changed yet: the job goes on unchanged unless it ended
        status = "failed" if job.done else "aborted"
        await _abort(coordinator, rec, workers, rec._failure, status, t_start)
        return
    if rec.cancelled:  # as a sync timeout: paused tasks resume on the old configuration
        await _abort(coordinator, rec, workers, rec.cancelled, "cancelled", t_start)
        return
    # Step 3. Update: every affected task applies its part and resumes.
    rec.status = "updating"
    for wid in workers:
        coordinator.send(wid, Update(job.id, rec.id))
    driver = None
    if rec.stages:
        driver = asyncio.ensure_future(
            _drive_stages(coordinator, job, rec, set(workers), stage_barriers, sync_timeout_s)
        )
        driver.add_done_callback(functools.partial(_driver_ended, rec))
    try:
        await asyncio.wait_for(rec._updated.wait(), UPDATE_TIMEOUT_S)
    except TimeoutError:
        rec._failure = f"update timed out after {UPDATE_TIMEOUT_S:.0f}s: tasks {sorted(t for _, t in rec._to_update)[:10]} did not finish"
    if driver is not None:
        if rec._failure is None:
            # Every task has reported, so every stage is done: the driver records the
            # last one's time as its stage_done comes in (it may come after the reports).
            await asyncio.wait({driver}, timeout=sync_timeout_s)
        driver.cancel()  # done by now unless the update failed; an error was reported
        await asyncio.gather(driver, return_exceptions=True)
    t_updated = time.perf_counter()
    rec.timings_ms["update"] = elapsed_ms(t_synced, t_updated)
    rec.timings_ms["total"] = elapsed_ms(t_start, t_updated)
    if rec._failure:
        rec.status = "failed"
        rec.error = rec._failure
        await coordinator.fail(
            job, f"reconfiguration {rec.id} failed during update: {rec._failure}"
        )
        return
    # Step 4. Commit.
    if rec.cut_short:  # the job runs on the last stage made
        rec.new = rec.stages[rec.stages_made - 1]
    job.layout = rec.new
    job.metrics.track_tasks({t: t.rpartition("-")[0] for t in rec.new.placement})
    rec.status = "completed"
    logger.info(
        "job %s reconfiguration %s completed in %.1f ms (%d tasks affected)",
        job.id,
        rec.id,
        rec.timings_ms["total"],
        len(rec.affected),
    )


async def _drive_stages(
    coordinator: JobHost,
    job: Job,
    rec: Reconfiguration,
    workers: set[str],
    barriers: list[int],
    sync_timeout_s: float,
) -> None:
    """Step 3, staged (fluid): after the update has made the first stage, start each
    later one; up to ``RuntimeConfig.stage_window`` are under way at once (default 1).

    A stage only moves key groups between tasks that keep their place, so nothing pauses:
    its barrier starts at the tasks that route to the tasks whose key groups move
    (:func:`runtime.layout.stage_entry`; at the sources when the graph does not allow
    it), each router swaps its owner table as it emits or aligns it, each task that gives
    key groups ships them once aligned and each that gains them has their records wait
    for them. A stage costs a message to the workers and the barrier's hop to the keyed
    tasks, not a prepare, a sync and an update.

    Step 3a. With a window above 1, the next stage starts while the ones before it are
    still moving state (so that its barrier's hop overlaps their transfers) when it starts
    where they did (its barrier then follows theirs through every channel: each task does
    its parts in order) and moves none of the key groups they move. A stage is made once
    every worker is done with it and with the ones before. Step 3b. When a stage is not made within the
    sync timeout, the stages under way are withdrawn, latest first, as long as their
    barriers have started nowhere; those that had started go on. If one was withdrawn, the
    change ends at the stage before it (a valid layout, every key group owned once) once
    the ones before it are made; else it goes on. Step 3c. Once the plan is cancelled no
    stage starts, and those under way are withdrawn the same way at once.
    """
    await rec.stage_done(0, workers)
    rec.stages_made = 1
    under_way: dict[int, _Stage] = {}

    def made(stage: _Stage) -> None:
        rec.stage_ms.append(elapsed_ms(stage.started, time.perf_counter()))
        rec.stages_made = stage.k + 1
        del under_way[stage.k]

    k = 1  # the next stage to start
    while k < len(rec.stages) or under_way:
        if rec._failure is not None:
            return
        # Step 3a. Start what may start.
        while (
            k < len(rec.stages)
            and len(under_way) < coordinator.config.stage_window
            and not rec.cancelled
            and all(s.allows(job, rec, k) for s in under_way.values())
        ):
            under_way[k] = _Stage.start(coordinator, job, rec, k, barriers[k - 1])
            k += 1
        if not under_way:  # Step 3c. No later stage starts: the change ends at this one.
            rec.cut_short = True
            rec.error = rec.cancelled
            _end_stages(coordinator, job, rec, workers, k - 1)
            return
        first = under_way[min(under_way)]
        left = sync_timeout_s - (time.perf_counter() - first.started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                rec.stage_done(first.k, first.done_by, or_cancelled=True), max(left, 0.0)
            )
        if rec.stage_is_done(first.k, first.done_by):
            made(first)
            continue
        if rec._failure is not None:
            return
        # Step 3b. Withdraw the stages under way, latest first, while that is clean; those
        # that had started go on (within the update's timeout).
        withdrawn: _Stage | None = None
        for stage in sorted(under_way.values(), key=lambda s: -s.k):
            if not await stage.withdraw(coordinator, rec):
                stage.tell(coordinator, StageStart)  # told again: it goes on
                break
            withdrawn = stage
        for j in sorted(j for j in under_way if withdrawn is None or j < withdrawn.k):
            await rec.stage_done(j, under_way[j].done_by)
            if rec._failure is not None:
                return
            made(under_way[j])
        if withdrawn is not None:  # the change ends before it
            rec.cut_short = True
            rec.error = rec.cancelled or (
                f"sync timed out after {sync_timeout_s:g}s: the barrier of stage "
                f"{withdrawn.k + 1} of {len(rec.stages)} did not get through tasks "
                f"{sorted(withdrawn.entry)[:10]}"
            )
            _end_stages(coordinator, job, rec, workers, withdrawn.k - 1)
            return


@dataclass
class _Stage:
    """A stage of a staged change, started: where its barrier starts, which workers
    report it done, and when it started."""

    k: int
    job_id: str
    rid: int
    barrier_id: int
    prev: Layout
    nxt: Layout
    entry: list[str]
    done_by: set[str]
    started: float

    @classmethod
    def start(
        cls, coordinator: JobHost, job: Job, rec: Reconfiguration, k: int, barrier: int
    ) -> _Stage:
        prev, nxt = rec.stages[k - 1], rec.stages[k]
        entry = _stage_entry(job, prev, nxt)
        done_by = {prev.placement[t] for t in affected_tasks(job.graph, prev, nxt) | set(entry)}
        stage = cls(k, job.id, rec.id, barrier, prev, nxt, entry, done_by, time.perf_counter())
        stage.tell(coordinator, StageStart)
        return stage

    def allows(self, job: Job, rec: Reconfiguration, k: int) -> bool:
        """Whether stage ``k`` may start while this one is under way."""
        prev, nxt = rec.stages[k - 1], rec.stages[k]
        return stages_can_overlap(job.graph, (self.prev, self.nxt), (prev, nxt))

    def tell(self, coordinator: JobHost, kind: type[StageStart] | type[StageWithdraw]) -> None:
        """Send this stage's ``kind`` message to its workers, each with the entry tasks it
        hosts."""
        for wid in sorted(self.done_by):
            inject = tuple(t for t in self.entry if self.prev.placement[t] == wid)
            coordinator.send(wid, kind(self.job_id, self.rid, self.k, self.barrier_id, inject))

    async def withdraw(self, coordinator: JobHost, rec: Reconfiguration) -> bool:
        """Take this stage's barrier back where it has not started; True if it had
        started nowhere (nothing of it happened, nor will)."""
        loop = asyncio.get_running_loop()
        rec._withdrawals = {wid: loop.create_future() for wid in self.done_by}
        self.tell(coordinator, StageWithdraw)
        try:
            replies = await asyncio.wait_for(
                asyncio.gather(*rec._withdrawals.values()), ABORT_TIMEOUT_S
            )
        except TimeoutError:
            return False
        return all(replies)


def _stage_entry(job: Job, prev: Layout, nxt: Layout) -> list[str]:
    """The tasks a stage's barrier starts at: the routers, else the sources."""
    return stage_entry(job.graph, prev, nxt) or [
        t for op in job.graph.sources() for t in prev.tasks_of(op.name)
    ]


def _end_stages(
    coordinator: JobHost, job: Job, rec: Reconfiguration, workers: set[str], last: int
) -> None:
    """Tell every worker of the change that it ends at stage ``last``."""
    for wid in workers:
        coordinator.send(wid, StagesEnd(job.id, rec.id, last))


def _driver_ended(rec: Reconfiguration, driver: asyncio.Future) -> None:
    """A bug in :func:`_drive_stages` fails the reconfiguration instead of hanging it."""
    if not driver.cancelled() and driver.exception() is not None:
        exc = driver.exception()
        logger.error("reconfiguration %s: driving its stages failed", rec.id, exc_info=exc)
        rec.on_failed(f"driving the stages failed: {type(exc).__name__}: {exc}")


async def _abort(
    coordinator: JobHost,
    rec: Reconfiguration,
    workers: list[str],
    error: str,
    status: str,
    t_start: float,
) -> None:
    rec.timings_ms["total"] = elapsed_ms(t_start, time.perf_counter())
    rec.status = status
    rec.error = error
    for wid in workers:
        coordinator.send(wid, Abort(rec.job_id, rec.id))
    logger.warning("reconfiguration %s of job %s %s: %s", rec.id, rec.job_id, status, error)


def elapsed_ms(t0: float, t1: float) -> float:
    """Milliseconds from ``t0`` to ``t1`` (``time.perf_counter`` readings), to the microsecond."""
    return round((t1 - t0) * 1000, 3)
