"""The coordinator's side of a live reconfiguration: prepare, sync, update, commit.

The protocol itself (its steps, states, events and commands) is the pure state machine
of :mod:`.protocol`; the worker's side is :mod:`runtime.reconfigure`. This module is its
asyncio driver, :class:`LiveRun`: it turns the workers' replies, the coordinator's news
(a task finished, a worker lost, the job ended, a cancel) and timers into the machine's
events, each handled on the loop's next turn in the order they came, and carries out the
commands the machine answers with: messages to workers, timers, telling the listener,
committing the layout, failing the job. The run's report (:class:`~.report.RunReport`)
is plain data; the driver tells the listener when it changes.

A task whose key groups leave for another worker, with at least
``RuntimeConfig.precopy_min_bytes`` of state, copies them ahead while it runs
(:mod:`runtime.precopy`, for at most ``PRECOPY_BUDGET_S``) during the prepare.

A plan under way can be cancelled (:func:`.plans.cancel`): a run still preparing or
syncing aborts as a sync timeout does (status ``cancelled``: paused tasks resume on the
old configuration); a staged run starts no further stage (the job stays on the last stage
made); a run whose update has started goes on to its end (state is moving).

Only one reconfiguration runs per job at a time (:class:`.slot.ChangeSlot`): others wait
in order for the job's lock, or are refused with :class:`ReconfigurationBusy` when the
caller does not want to wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import pickle
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from controlplane.statuses import JobStatus, ReconfigurationStatus
from runtime import codeload, messages
from runtime.layout import Layout, only_key_groups_move
from runtime.records import BarrierKind

from .errors import ReconfigurationError
from .events import (
    SYNC_TIMEOUT_S,
    Announce,
    Announced,
    CancelRequested,
    Command,
    Commit,
    End,
    EndStages,
    Event,
    Failed,
    FailJob,
    InjectSyncBarrier,
    Paused,
    Prepared,
    RunShape,
    SendAbort,
    SendPrepare,
    SendUpdate,
    StageDone,
    StageMessage,
    StageWithdrawn,
    Start,
    StartTimer,
    StopTimer,
    TaskFinished,
    TimedOut,
    Timer,
    Updated,
    union_affected,
)
from .protocol import ReconfigurationMachine
from .report import Listener, RunReport

if TYPE_CHECKING:
    from .model import RunningJob
    from .ports import JobHost
    from .slot import Cancellation

__all__ = ["PRECOPY_BUDGET_S", "LiveRun", "check_layout", "reconfigure", "run_locked"]

logger = logging.getLogger(__name__)

# Copying state ahead stops starting new key groups after this (well within the prepare
# timeout); what is left goes whole in the update.
PRECOPY_BUDGET_S = 10.0

_NOTHING_TIMED = {"prepare": 0.0, "sync": 0.0, "update": 0.0, "total": 0.0}


async def reconfigure(
    host: JobHost,
    job: RunningJob,
    new: Layout,
    *,
    wait: bool = True,
    sync_timeout_s: float | None = None,
    plan: Any = None,
) -> RunReport:
    """Change ``job`` to ``new`` live; returns the report (completed, aborted or failed).

    Raises :class:`ReconfigurationBusy` if ``wait`` is false and another reconfiguration
    of the job runs, and :class:`ReconfigurationError` if the job is not running or the
    layout names unknown workers or leaves key groups unowned.
    """
    job.slot.refuse_if_busy(wait)
    async with job.slot.hold():
        check_layout(job, new)
        return await run_locked(host, job, new, plan=plan, sync_timeout_s=sync_timeout_s)


def check_layout(job: RunningJob, new: Layout) -> None:
    """:class:`ReconfigurationError` unless ``new`` gives every operator of the job a task
    and every key group an owner: what a layout that does not come from a validated plan
    (:class:`.plans.ValidatedPlan`) is checked for."""
    for op in job.graph.operators:
        tasks = new.tasks_of(op.name)
        if not tasks:
            raise ReconfigurationError(f"operator {op.name!r} would have no task")
        if op.keyed:
            try:
                new.owner_table(op, tasks)
            except ValueError as exc:
                raise ReconfigurationError(str(exc)) from None


async def run_locked(
    host: JobHost,
    job: RunningJob,
    new: Layout,
    *,
    plan: Any = None,
    sync_timeout_s: float | None = None,
    on_change: Listener | None = None,
    record: bool = True,
    fluid: bool = False,
    stages: list[Layout] | None = None,
    cancellation: Cancellation | None = None,
    affected: Iterable[str] | None = None,
) -> RunReport:
    """Run the protocol from ``job``'s layout to ``new`` (a valid layout: see
    :func:`check_layout`) for a caller that holds ``job.slot.lock``.

    ``on_change(report)`` is called when the report is created and whenever its status
    changes or it ends (on the coordinator's loop; it must not block). With ``record``
    false the report is not kept in the job's history (a step of a fluid plan, whose own
    report is kept instead). With ``fluid`` keyed tasks that only gain or give key groups
    do not pause (see :mod:`runtime.reconfigure`). ``stages`` (fluid): layouts to go
    through after ``new``'s predecessor, ending at ``new``; each after the first only moves
    key groups (Step 3 of :mod:`.protocol`). ``cancellation``: the plan's, shared by its
    runs (a run of a plan already cancelled ends ``cancelled`` before it starts).
    ``affected``: the tasks the change touches when the caller has them (a validated plan),
    else computed from the layouts (:func:`.events.union_affected`).

    Raises :class:`ReconfigurationError` when the run cannot start now: the job is not
    running, ``new`` names workers that are not alive, tasks it changes have finished, or
    every source has finished.
    """
    if job.status != JobStatus.RUNNING:
        raise ReconfigurationError(f"job {job.id} is {job.status}, not running")
    alive = {w.id for w in host.alive_workers()}
    unknown = sorted(set(new.placement.values()) - alive)
    if unknown:
        raise ReconfigurationError(f"workers {unknown} are not registered and alive")
    stages = list(stages or ())
    if stages and stages[-1] != new:
        raise ReconfigurationError("the last stage must be the new layout")
    if len(stages) > 1 and not (
        fluid and all(only_key_groups_move(a, b) for a, b in itertools.pairwise(stages))
    ):
        raise ReconfigurationError("stages after the first may only move key groups (fluid)")
    _check_not_finished(job, new)
    path = [job.layout, *stages] if len(stages) > 1 else [job.layout, new]
    touched = union_affected(job.graph, path) if affected is None else frozenset(affected)
    report = RunReport.new(job.id, touched, plan)
    if record:
        job.reconfigurations.append(report)
        if cancellation is not None:
            cancellation.record = report
    announce = on_change or (lambda _report: None)
    announce(report)
    cancelled = cancellation.reason if cancellation is not None else None
    if cancelled or not report.affected:  # nothing to send: nothing changes
        report.error = cancelled
        report.timings_ms = dict(_NOTHING_TIMED)
        report.status = (
            ReconfigurationStatus.CANCELLED if cancelled else ReconfigurationStatus.COMPLETED
        )
        announce(report)
        report.ended_at = time.time()
        announce(report)
        return report
    shape = RunShape(
        job.graph,
        job.layout,
        new,
        touched,
        tuple(stages) if len(stages) > 1 else (),
        SYNC_TIMEOUT_S if sync_timeout_s is None else sync_timeout_s,
        host.config.stage_window,
    )
    run = LiveRun(host, job, shape, report, fluid=fluid, on_change=announce)
    job.status = JobStatus.RECONFIGURING
    job.active = run
    try:
        await run.run()
    finally:
        job.active = None
        if job.status == JobStatus.RECONFIGURING:
            job.status = JobStatus.RUNNING
        report.ended_at = time.time()
        announce(report)
    return report


def _check_not_finished(job: RunningJob, new: Layout) -> None:
    finished = sorted(union_affected(job.graph, [job.layout, new]) & job.finished_tasks)
    if finished:
        raise ReconfigurationError(
            f"tasks {finished[:10]} have finished; finished tasks cannot change"
        )
    sources = {t for op in job.graph.sources() for t in job.layout.tasks_of(op.name)}
    if sources <= job.finished_tasks:
        raise ReconfigurationError(f"job {job.id} is draining (every source has finished)")


class LiveRun:
    """The asyncio driver of one run of :class:`.protocol.ReconfigurationMachine`.

    Made by :func:`run_locked`, which awaits :meth:`run`. While it runs the coordinator
    tells it what workers reply (:meth:`deliver`), that a task finished
    (:meth:`task_finished`), that something it waits on failed (:meth:`fail`) and that
    its plan was cancelled (:meth:`cancel`); each becomes an event, handled on the loop's
    next turn, in the order told.
    """

    def __init__(
        self,
        host: JobHost,
        job: RunningJob,
        shape: RunShape,
        report: RunReport,
        *,
        fluid: bool,
        on_change: Listener,
    ) -> None:
        self.report = report
        self.workers = shape.workers
        self._host = host
        self._job = job
        self._shape = shape
        self._fluid = fluid
        self._on_change = on_change
        self._machine = ReconfigurationMachine(shape, report)
        self._loop = asyncio.get_running_loop()
        self._timers: dict[Timer, asyncio.TimerHandle] = {}
        self._ended = asyncio.Event()
        self._fail_job: str | None = None
        self._barrier_id = host.next_barrier_id()
        self._stage_barriers = [host.next_barrier_id() for _ in shape.stages[1:]]

    async def run(self) -> None:
        """Run the protocol to its end; the report says how it ended."""
        self._feed(Start)
        try:
            await self._ended.wait()
        finally:
            for handle in self._timers.values():
                handle.cancel()
            self._machine.ended = True  # a run cancelled from outside handles nothing more
        if self._fail_job is not None:
            await self._host.fail(self._job, self._fail_job)

    # -- what the coordinator tells it -------------------------------------------------------

    def deliver(self, worker: str, msg: messages.ToCoordinator) -> None:
        """A worker's reply in this run (the caller has checked its ``rid``)."""
        match msg:
            case messages.Prepared(precopy=precopy):
                self._feed(lambda: Prepared(worker, None, precopy))
            case messages.PrepareFailed(error=error):
                self._feed(lambda: Prepared(worker, error))
            case messages.Paused(task=task):
                self._feed(lambda: Paused(task))
            case messages.StageDone(stage=stage):
                self._feed(lambda: StageDone(worker, stage))
            case messages.StageWithdrawn(clean=clean):
                self._feed(lambda: StageWithdrawn(worker, clean))
            case messages.Updated(task=task, pause_ms=pause_ms, update_ms=update_ms):
                self._feed(lambda: Updated(worker, task, pause_ms, update_ms))
            case messages.UpdateFailed(error=error):
                self.fail(error)

    def task_finished(self, task: str) -> None:
        """A task of the job ended (its inputs ended): the barrier cannot reach it."""
        self._feed(lambda: TaskFinished(task, self._job.done))

    def fail(self, error: str) -> None:
        """Something the run waits on failed: a task, a worker, the job."""
        self._feed(lambda: Failed(error, self._job.done))

    def cancel(self, reason: str) -> None:
        """The plan was cancelled: the run stops at its next safe point."""
        self._feed(lambda: CancelRequested(reason))

    # -- plumbing ---------------------------------------------------------------------------

    def _feed(self, event: Callable[[], Event]) -> None:
        """Handle ``event()`` on the loop's next turn (made then, so that it sees the job
        as the coordinator left it after what it is handling now)."""
        self._loop.call_soon(self._handle, event)

    def _handle(self, event: Callable[[], Event]) -> None:
        for command in self._machine.handle(event(), time.perf_counter()):
            self._execute(command)

    def _execute(self, command: Command) -> None:
        job, rid, host = self._job, self.report.id, self._host
        match command:
            case SendPrepare():
                self._send_prepare()
            case InjectSyncBarrier():
                for wid in self._shape.old.workers_used():
                    host.send(
                        wid, messages.InjectBarrier(job.id, BarrierKind.RECONFIG, self._barrier_id)
                    )
            case SendUpdate():
                self._broadcast(messages.Update(job.id, rid))
            case SendAbort():
                self._broadcast(messages.Abort(job.id, rid))
            case StageMessage(stage=k, withdraw=withdraw, to=to):
                kind = messages.StageWithdraw if withdraw else messages.StageStart
                for wid, inject in to:
                    host.send(wid, kind(job.id, rid, k, self._stage_barriers[k - 1], inject))
            case EndStages(last=last):
                self._broadcast(messages.StagesEnd(job.id, rid, last))
            case StartTimer(timer=timer, seconds=seconds):
                self._stop(timer)
                fired = TimedOut(timer)
                self._timers[timer] = self._loop.call_later(
                    max(seconds, 0.0), self._handle, lambda: fired
                )
            case StopTimer(timer=timer):
                self._stop(timer)
            case Announce(then_continue=then_continue):
                self._on_change(self.report)
                if then_continue:
                    self._feed(Announced)
            case Commit(layout=layout):
                job.layout = layout
                job.metrics.track_tasks({t: t.rpartition("-")[0] for t in layout.placement})
            case FailJob(error=error):
                self._fail_job = error
            case End(aborted=aborted):
                self._log_end(aborted)
                self._ended.set()

    def _send_prepare(self) -> None:
        """Step 1: ``prepare`` to every worker of the run; a worker that hosts none of the
        job's tasks yet also gets the graph, the current layout and the channel settings."""
        host, job, shape = self._host, self._job, self._shape
        graph = pickle.dumps(job.graph)
        msg = messages.Prepare(
            job_id=job.id,
            rid=self.report.id,
            barrier_id=self._barrier_id,
            layout=shape.new,
            affected=tuple(sorted(shape.affected)),
            workers=host.data_addresses(),
            code=codeload.sources_for([graph, *shape.new.logic.values()]),
            fluid=self._fluid,
            precopy_min_bytes=host.config.precopy_min_bytes,
            precopy_budget_s=PRECOPY_BUDGET_S,
            precopy_pause_s=host.config.precopy_pause_ms / 1000,
            stages=shape.stages,
            stage_barriers=tuple(self._stage_barriers),
        )
        joining = dataclasses.replace(
            msg,
            graph=graph,
            current_layout=shape.old,
            config=host.channel_config(),
            start_time=job.started_at,
            checkpoints=job.checkpoint_config,
            attempt=job.attempt,
        )
        hosting = set(shape.old.workers_used())
        for wid in self.workers:
            host.send(wid, msg if wid in hosting else joining)

    def _broadcast(self, msg: messages.ToWorker) -> None:
        for wid in self.workers:
            self._host.send(wid, msg)

    def _stop(self, timer: Timer) -> None:
        handle = self._timers.pop(timer, None)
        if handle is not None:
            handle.cancel()

    def _log_end(self, aborted: bool) -> None:
        report = self.report
        if aborted:
            logger.warning(
                "reconfiguration %s of job %s %s: %s",
                report.id,
                report.job_id,
                report.status,
                report.error,
            )
        elif report.status == ReconfigurationStatus.COMPLETED:
            logger.info(
                "job %s reconfiguration %s completed in %.1f ms (%d tasks affected)",
                report.job_id,
                report.id,
                report.timings_ms["total"],
                len(report.affected),
            )
