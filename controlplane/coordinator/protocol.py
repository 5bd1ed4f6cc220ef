"""The coordinator's side of one live reconfiguration run, as a pure state machine.

No asyncio, no I/O, no clock: :class:`ReconfigurationMachine` takes events (a worker's
reply, a timer that fired, a cancel or a failure, each with the time it is handled) and
answers with :data:`Command` values for its driver (:class:`.reconfig.LiveRun`) to carry
out in order: send a message, start or stop a timer, tell the listeners, fail the job,
commit the layout, end. It fills in the run's :class:`~.report.RunReport` as it goes. The
steps (docs/design.md, section 3) and the states they pass through:

1. **Prepare** (``PREPARING``). :class:`SendPrepare` to every worker of the old or new
   layout; each answers :class:`Prepared` (with an error, or what it copied ahead). An
   error, a :class:`Failed`, or silence past ``PREPARE_TIMEOUT_S`` aborts (``failed``);
   a cancel aborts (``cancelled``): nothing changed.
2. **Sync** (``SYNCING``). :class:`InjectSyncBarrier`; sync ends when every affected task
   that existed before has :class:`Paused`. Past the sync timeout it aborts (``aborted``:
   paused tasks resume with the old configuration), on a failure it aborts (``failed``
   if the job ended), on a cancel it aborts (``cancelled``). A task that finished before
   the barrier reached it is a failure.
3. **Update** (``UPDATING``). :class:`SendUpdate`; every affected task applies its part
   and reports :class:`Updated`. A failure or silence past ``UPDATE_TIMEOUT_S`` fails the
   job (:class:`FailJob`). A staged run (fluid) then makes its later stages
   (:meth:`ReconfigurationMachine._resume_stages`):

   a. Once every worker is done with stage 0 (the update), start each later stage
      (:class:`StageMessage` ``start``); with a window above 1, a stage may start while
      those before it are under way when :func:`runtime.layout.stages_can_overlap`.
      A stage is made once every worker it involves reports :class:`StageDone`.
   b. A stage not made within the sync timeout is withdrawn with those after it, latest
      first, while each is clean (:class:`StageWithdrawn`); one that had started is told
      again to go on. The change ends (:class:`EndStages`) at the stage before the first
      one withdrawn, once those before it are made.
   c. Once the plan is cancelled no stage starts, and those under way are withdrawn the
      same way at once.

4. **Commit.** :class:`Commit` the new layout (or, cut short, the last stage made);
   ``completed``.

Every phase's entry is announced first (:class:`Announce` with ``then_continue``): the
driver tells the listeners, then hands back :class:`Announced`, so that a cancel a
listener asks for is seen before the phase sends anything.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from controlplane.statuses import ReconfigurationStatus as Status
from runtime.layout import Layout, affected_tasks, stage_entry, stages_can_overlap

from .events import (
    ABORT_TIMEOUT_S,
    PREPARE_TIMEOUT_S,
    UPDATE_TIMEOUT_S,
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
)
from .report import RunReport, elapsed_ms

__all__ = ["ReconfigurationMachine"]


@dataclass
class _Stage:
    """A stage under way: where its barrier starts, which workers report it, when it started."""

    k: int
    prev: Layout
    nxt: Layout
    entry: list[str]
    done_by: set[str]
    started: float

    def message(self, withdraw: bool) -> StageMessage:
        to = tuple(
            (wid, tuple(t for t in self.entry if self.prev.placement[t] == wid))
            for wid in sorted(self.done_by)
        )
        return StageMessage(self.k, withdraw, to)


class _StagesAt(enum.Enum):
    FIRST = "first"  # waiting for stage 0 (the update's)
    LOOP = "loop"  # starting stages, waiting for the first under way
    WITHDRAWING = "withdrawing"  # Step 3b: waiting for a withdrawal's replies
    DRAINING = "draining"  # waiting for the stages before the one withdrawn
    OVER = "over"


@dataclass
class _Stages:
    """The state of a staged run's stages (Step 3)."""

    at: _StagesAt = _StagesAt.FIRST
    done: dict[int, set[str]] = field(default_factory=dict)  # stage -> workers done with it
    under_way: dict[int, _Stage] = field(default_factory=dict)
    next: int = 1  # the next stage to start
    expired: int | None = None  # the stage whose sync timeout passed
    to_withdraw: list[_Stage] = field(default_factory=list)  # latest first
    withdrawing: _Stage | None = None
    replies: dict[str, bool] = field(default_factory=dict)  # worker -> withdrew cleanly
    withdrawn: _Stage | None = None
    to_drain: list[int] = field(default_factory=list)


class ReconfigurationMachine:
    """One run of the protocol (module docstring) over ``shape``, reporting into ``report``.

    Call :meth:`handle` with :class:`Start`, then with every event in the order they
    happen; it returns the commands to carry out, in order, and ignores events once the
    run has ended (:attr:`ended`). Never raises for an event a worker may send late or
    twice (a reply of an earlier phase is dropped).
    """

    def __init__(self, shape: RunShape, report: RunReport) -> None:
        self.shape = shape
        self.report = report
        self.phase = Status.PENDING
        self.ended = False
        self._workers = shape.workers
        self._next: str | None = None  # what Announced continues with
        self._t_start = self._t_prepared = self._t_synced = 0.0
        self._waiting_prepare: set[str] = set()
        self._prepare_errors: dict[str, str | None] = {}
        self._prepare_sent = False
        self._cancel: str | None = None
        self._failure: str | None = None
        self._job_ended = False
        self._to_pause: set[str] = set()
        self._to_update: set[tuple[str, str]] = set()  # (worker, task)
        self._updated = False
        self._stages = _Stages(at=_StagesAt.FIRST if shape.stages else _StagesAt.OVER)

    def handle(self, event: Event, now: float) -> list[Command]:
        """The commands ``event``, handled at ``now`` (seconds, monotonic), calls for."""
        if self.ended:
            return []
        match event:
            case Start():
                self._t_start = now
                return self._enter(Status.PREPARING, "prepare")
            case Announced():
                return self._continue(now)
            case Prepared(worker=worker, error=error, precopied=precopied):
                if precopied:
                    self.report.precopied[worker] = precopied
                if self.phase == Status.PREPARING and worker in self._waiting_prepare:
                    self._prepare_errors[worker] = error
                    self._waiting_prepare.discard(worker)
                    if not self._waiting_prepare and self._prepare_sent:
                        return self._prepare_over(now)
                return []
            case Paused(task=task):
                self._to_pause.discard(task)
                if self.phase == Status.SYNCING and not self._to_pause and self._next is None:
                    return self._sync_over(now)
                return []
            case Updated():
                return self._on_updated(event, now)
            case StageDone(worker=worker, stage=stage):
                self._stages.done.setdefault(stage, set()).add(worker)
                return self._on_stages(now)
            case StageWithdrawn(worker=worker, clean=clean):
                return self._on_withdrawn(worker, clean, now)
            case TaskFinished(task=task, job_ended=job_ended):
                if task in self._to_pause:
                    return self._on_failed(
                        f"task {task} finished before it reached the barrier", job_ended, now
                    )
                return []
            case CancelRequested(reason=reason):
                return self._on_cancel(reason, now)
            case Failed(error=error, job_ended=job_ended):
                return self._on_failed(error, job_ended, now)
            case TimedOut(timer=timer):
                return self._on_timeout(timer, now)
        raise TypeError(f"not an event: {event!r}")

    # -- phases ------------------------------------------------------------------------------

    def _enter(self, phase: Status, then: str) -> list[Command]:
        self.phase = self.report.status = phase
        self._next = then
        return [Announce(then_continue=True)]

    def _continue(self, now: float) -> list[Command]:
        then, self._next = self._next, None
        if then == "prepare":  # Step 1.
            self._waiting_prepare = set(self._workers)
            self._prepare_sent = True
            out: list[Command] = [SendPrepare(), StartTimer(Timer.PREPARE, PREPARE_TIMEOUT_S)]
            if self._failure is not None:  # a failure before it was sent: no reply will do
                return out + self._fill_prepare(self._failure, now)
            return out
        if then == "sync":  # Step 2.
            if self._cancel:  # as the sync started (no barrier sent): nothing to take back
                return self._abort(Status.CANCELLED, self._cancel, now)
            out = [InjectSyncBarrier()]
            if not self._to_pause or self._failure is not None:
                return out + self._sync_over(now)
            return [*out, StartTimer(Timer.SYNC, self.shape.sync_timeout_s)]
        if then == "update":  # Step 3.
            out = [SendUpdate(), StartTimer(Timer.UPDATE, UPDATE_TIMEOUT_S)]
            if self._failure is not None:
                return out + self._update_over(now)
            return out + self._on_stages(now)
        return []

    def _fill_prepare(self, error: str | None, now: float) -> list[Command]:
        """Stop waiting for prepare replies: those missing count as ``error``."""
        for wid in self._waiting_prepare:
            self._prepare_errors[wid] = error
        self._waiting_prepare.clear()
        return self._prepare_over(now)

    def _prepare_over(self, now: float, timed_out: bool = False) -> list[Command]:
        self._t_prepared = now
        timings = self.report.timings_ms
        timings["prepare"] = elapsed_ms(self._t_start, now)
        if self.report.precopied:  # part of the prepare: the longest a worker spent copying ahead
            timings["precopy"] = max(c["ms"] for c in self.report.precopied.values())
        if timed_out:
            failure = f"prepare timed out after {PREPARE_TIMEOUT_S:.0f}s"
        else:  # one failure, told once, in the workers' order
            errors = (self._prepare_errors.get(w) for w in self._workers)
            failure = "; ".join(dict.fromkeys(e for e in errors if e))
        out: list[Command] = [StopTimer(Timer.PREPARE)]
        if failure:
            return out + self._abort(Status.FAILED, f"prepare failed: {failure}", now)
        if self._cancel:  # a new task or worker made ready is let go again
            return out + self._abort(Status.CANCELLED, self._cancel, now)
        shape = self.shape
        self._to_pause = {t for t in shape.affected if t in shape.old.placement}
        # A task that moves reports twice: its old instance (handed over) and its new one.
        self._to_update = {
            (layout.placement[t], t)
            for layout in (shape.old, shape.new)
            for t in shape.affected
            if t in layout.placement
        }
        return out + self._enter(Status.SYNCING, "sync")

    def _sync_over(self, now: float) -> list[Command]:
        self._t_synced = now
        self.report.timings_ms["sync"] = elapsed_ms(self._t_prepared, now)
        out: list[Command] = [StopTimer(Timer.SYNC)]
        if self._failure is not None:  # nothing changed yet: the job goes on unless it ended
            status = Status.FAILED if self._job_ended else Status.ABORTED
            return out + self._abort(status, self._failure, now)
        if self._cancel:  # as a sync timeout: paused tasks resume on the old configuration
            return out + self._abort(Status.CANCELLED, self._cancel, now)
        return out + self._enter(Status.UPDATING, "update")

    def _on_updated(self, event: Updated, now: float) -> list[Command]:
        report = self.report
        if event.task in self.shape.old.placement:
            report.pause_ms[event.task] = max(event.pause_ms, report.pause_ms.get(event.task, 0.0))
        report.update_ms[event.task] = max(event.update_ms, report.update_ms.get(event.task, 0.0))
        self._to_update.discard((event.worker, event.task))
        if self.phase != Status.UPDATING or self._to_update or self._updated:
            return []
        self._updated = True
        if self._stages.at is _StagesAt.OVER:
            return self._update_over(now)
        # Every task has reported, so every stage is done: the last stage_done may still
        # be on its way.
        return [StopTimer(Timer.UPDATE), StartTimer(Timer.DRAIN, self.shape.sync_timeout_s)]

    def _update_over(self, now: float) -> list[Command]:
        timings = self.report.timings_ms
        timings["update"] = elapsed_ms(self._t_synced, now)
        timings["total"] = self._total(now)
        self._stages.at = _StagesAt.OVER
        out: list[Command] = [StopTimer(t) for t in Timer]
        self.ended = True
        if self._failure is not None:
            self.report.status = Status.FAILED
            self.report.error = self._failure
            error = f"reconfiguration {self.report.id} failed during update: {self._failure}"
            return [*out, Announce(), FailJob(error), End()]
        # Step 4. Commit.
        stages = self.shape.stages
        layout = stages[self.report.stages_made - 1] if self.report.cut_short else self.shape.new
        self.report.status = Status.COMPLETED
        return [*out, Commit(layout), Announce(), End()]

    def _abort(self, status: Status, error: str, now: float) -> list[Command]:
        self.report.timings_ms["total"] = self._total(now)
        self.report.status = status
        self.report.error = error
        self.ended = True
        return [*(StopTimer(t) for t in Timer), SendAbort(), Announce(), End(aborted=True)]

    def _total(self, now: float) -> float:
        """The run's time so far: never less than its phases' (each rounded) add up to."""
        phases = sum(self.report.timings_ms.get(p, 0.0) for p in ("prepare", "sync", "update"))
        floor = math.ceil(phases * 1000) / 1000  # up to the microsecond: not below the sum
        if floor < phases:
            floor = math.nextafter(floor, math.inf)
        return max(elapsed_ms(self._t_start, now), floor)

    # -- what interrupts -----------------------------------------------------------------------

    def _on_cancel(self, reason: str, now: float) -> list[Command]:
        self._cancel = self._cancel or reason
        if self._next is not None:  # a listener cancelled on a phase's entry: seen on Announced
            return []
        if self.phase == Status.PREPARING and self._prepare_sent:
            return self._fill_prepare(None, now)
        if self.phase == Status.SYNCING:
            return self._sync_over(now)
        if self.phase == Status.UPDATING:
            return self._on_stages(now)
        return []

    def _on_failed(self, error: str, job_ended: bool, now: float) -> list[Command]:
        self._failure = self._failure or error
        self._job_ended = job_ended
        if self._next is not None:
            return []
        if self.phase == Status.PREPARING and self._prepare_sent:
            return self._fill_prepare(error, now)
        if self.phase == Status.SYNCING:
            return self._sync_over(now)
        if self.phase == Status.UPDATING:
            return self._update_over(now)
        return []

    def _on_timeout(self, timer: Timer, now: float) -> list[Command]:
        if timer is Timer.PREPARE and self.phase == Status.PREPARING:
            self._waiting_prepare.clear()
            return self._prepare_over(now, timed_out=True)
        if timer is Timer.SYNC and self.phase == Status.SYNCING:
            waiting = sorted(self._to_pause)
            self.report.timings_ms["sync"] = elapsed_ms(self._t_prepared, now)
            error = (
                f"sync timed out after {self.shape.sync_timeout_s:g}s: tasks {waiting[:10]} "
                "did not reach the barrier"
            )
            return self._abort(Status.ABORTED, error, now)
        if timer is Timer.UPDATE and self.phase == Status.UPDATING:
            tasks = sorted(t for _, t in self._to_update)[:10]
            self._failure = (
                f"update timed out after {UPDATE_TIMEOUT_S:.0f}s: tasks {tasks} did not finish"
            )
            return self._update_over(now)
        if timer is Timer.DRAIN and self.phase == Status.UPDATING:
            return self._update_over(now)  # the stages are left as they are (as a bug would)
        if timer is Timer.STAGE and self._stages.under_way:
            self._stages.expired = min(self._stages.under_way)
            return self._on_stages(now)
        if timer is Timer.WITHDRAW and self._stages.at is _StagesAt.WITHDRAWING:
            return self._withdrawal_over(clean=False, now=now)
        return []

    # -- Step 3, staged ---------------------------------------------------------------------

    def _on_stages(self, now: float) -> list[Command]:
        """Take the stages as far as they go without waiting, then, once every task has
        updated too, end the update."""
        if self.phase != Status.UPDATING or self._next is not None:
            return []
        out = self._resume_stages(now)
        if self._updated and self._stages.at is _StagesAt.OVER and not self.ended:
            out += self._update_over(now)
        return out

    def _is_done(self, k: int, workers: set[str]) -> bool:
        return workers <= self._stages.done.get(k, set())

    def _resume_stages(self, now: float) -> list[Command]:
        s, shape, report = self._stages, self.shape, self.report
        out: list[Command] = []
        while True:
            if s.at is _StagesAt.OVER:
                return out
            if s.at is _StagesAt.FIRST:
                if not self._is_done(0, set(self._workers)):
                    return out
                report.stages_made = 1
                out.append(Announce())
                s.at = _StagesAt.LOOP
            elif s.at is _StagesAt.LOOP:
                if s.next >= len(shape.stages) and not s.under_way:  # every stage made
                    s.at = _StagesAt.OVER
                    return out
                # Step 3a. Start what may start.
                while (
                    s.next < len(shape.stages)
                    and len(s.under_way) < shape.stage_window
                    and not self._cancel
                    and all(self._allows(u, s.next) for u in s.under_way.values())
                ):
                    stage = self._start(s.next, now)
                    s.under_way[stage.k] = stage
                    out.append(stage.message(withdraw=False))
                    s.next += 1
                if not s.under_way:  # Step 3c. No later stage starts: the change ends here.
                    return out + self._end_stages(s.next - 1, self._cancel)
                first = s.under_way[min(s.under_way)]
                if self._is_done(first.k, first.done_by):
                    out.append(self._made(first.k, now))
                    continue
                late = s.expired == first.k or now - first.started >= shape.sync_timeout_s
                if not self._cancel and not late:
                    left = shape.sync_timeout_s - (now - first.started)
                    return [*out, StartTimer(Timer.STAGE, left)]
                # Step 3b. Withdraw the stages under way, latest first, while that is clean.
                out.append(StopTimer(Timer.STAGE))
                s.to_withdraw = sorted(s.under_way.values(), key=lambda u: -u.k)
                s.withdrawn = None
                return out + self._withdraw_next(now)
            elif s.at is _StagesAt.WITHDRAWING:
                return out
            elif s.at is _StagesAt.DRAINING:
                while s.to_drain and self._is_done(
                    s.to_drain[0], s.under_way[s.to_drain[0]].done_by
                ):
                    out.append(self._made(s.to_drain.pop(0), now))
                if s.to_drain:
                    return out
                if s.withdrawn is not None:  # the change ends before it
                    w = s.withdrawn
                    error = self._cancel or (
                        f"sync timed out after {shape.sync_timeout_s:g}s: the barrier of stage "
                        f"{w.k + 1} of {len(shape.stages)} did not get through tasks "
                        f"{sorted(w.entry)[:10]}"
                    )
                    return out + self._end_stages(w.k - 1, error)
                s.under_way.clear()
                s.at = _StagesAt.LOOP

    def _start(self, k: int, now: float) -> _Stage:
        graph = self.shape.graph
        prev, nxt = self.shape.stages[k - 1], self.shape.stages[k]
        entry = stage_entry(graph, prev, nxt) or [  # at the routers, else at the sources
            t for op in graph.sources() for t in prev.tasks_of(op.name)
        ]
        done_by = {prev.placement[t] for t in affected_tasks(graph, prev, nxt) | set(entry)}
        return _Stage(k, prev, nxt, entry, done_by, now)

    def _allows(self, under_way: _Stage, k: int) -> bool:
        """Whether stage ``k`` may start while ``under_way`` is."""
        stages = self.shape.stages
        return stages_can_overlap(
            self.shape.graph, (under_way.prev, under_way.nxt), (stages[k - 1], stages[k])
        )

    def _made(self, k: int, now: float) -> Announce:
        stage = self._stages.under_way.pop(k)
        self.report.stage_ms.append(elapsed_ms(stage.started, now))
        self.report.stages_made = k + 1
        return Announce()

    def _end_stages(self, last: int, error: str | None) -> list[Command]:
        self.report.cut_short = True
        self.report.error = error
        self._stages.at = _StagesAt.OVER
        return [EndStages(last)]

    def _withdraw_next(self, now: float) -> list[Command]:
        s = self._stages
        if not s.to_withdraw:
            return self._drain(now)
        s.withdrawing = s.to_withdraw.pop(0)
        s.replies = {}
        s.at = _StagesAt.WITHDRAWING
        return [s.withdrawing.message(withdraw=True), StartTimer(Timer.WITHDRAW, ABORT_TIMEOUT_S)]

    def _on_withdrawn(self, worker: str, clean: bool, now: float) -> list[Command]:
        s = self._stages
        if s.at is not _StagesAt.WITHDRAWING or s.withdrawing is None:
            return []
        if worker in s.withdrawing.done_by and worker not in s.replies:
            s.replies[worker] = clean
        if set(s.replies) < s.withdrawing.done_by:
            return []
        return self._withdrawal_over(all(s.replies.values()), now)

    def _withdrawal_over(self, clean: bool, now: float) -> list[Command]:
        s = self._stages
        stage = s.withdrawing
        assert stage is not None
        s.withdrawing = None
        out: list[Command] = [StopTimer(Timer.WITHDRAW)]
        if not clean:  # it had started somewhere: told again, it goes on
            s.to_withdraw = []
            return [*out, stage.message(withdraw=False), *self._drain(now)]
        s.withdrawn = stage
        return out + self._withdraw_next(now)

    def _drain(self, now: float) -> list[Command]:
        s = self._stages
        cut = s.withdrawn.k if s.withdrawn is not None else None
        s.to_drain = sorted(k for k in s.under_way if cut is None or k < cut)
        s.at = _StagesAt.DRAINING
        if self._failure is not None:
            return []
        out = self._resume_stages(now)
        if self._updated and s.at is _StagesAt.OVER and not self.ended:
            out += self._update_over(now)
        return out
