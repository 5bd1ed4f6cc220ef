"""A job's checkpoints, as a pure state machine beside the reconfiguration one.

No asyncio, no I/O, no clock: :class:`CheckpointMachine` takes events (a timer that
fired, a task's capture or ack, a reconfiguration that wants the job, each with the time
it is handled) and answers with commands for its driver (:class:`.checkpointer.Checkpointer`)
to carry out in order. The protocol (docs/design.md, section 7):

1. **Trigger.** Every ``interval_s`` (from one checkpoint's start to the next) the driver
   offers a :class:`Tick` with a fresh barrier id, the job's tasks and its abstraction
   version. The machine starts a checkpoint when one is due, none is in flight, no
   reconfiguration holds the job and every task runs (a job whose tasks have started to
   finish takes no more checkpoints): :class:`Inject` the checkpoint barrier at the
   sources. A declined tick's id is never used (barrier ids only need to grow).
2. **Capture.** Each task, once the barrier is aligned, captures its state (key groups:
   what changed since its previous capture; sources: their replay positions; sinks:
   their committed offsets) on its loop and says :class:`Captured`; it then writes the
   capture to the store off its loop and says :class:`Acked` with what it wrote (its
   part of the manifest), or :class:`TaskError`.
3. **Commit.** Once every task has acked, :class:`WriteManifest`: the driver writes the
   checkpoint's manifest (every task's part) to the store, which is the commit point, and
   answers :class:`ManifestWritten`. The checkpoint is ``completed``; retention keeps the
   last ``retained`` completed ones (:class:`DeleteFiles` for the checkpoints no
   retained one refers to: incremental parts refer to earlier checkpoints' files).
4. **Abandon.** A checkpoint not complete within ``timeout_s``, one a task could not
   write or finished before acking, one whose manifest could not be written, or one a
   reconfiguration could not wait for is ``abandoned`` (:class:`Abandon`: the workers drop
   its barrier); the job goes on and the next one starts when due. An abandoned
   checkpoint's files stay while a later checkpoint may refer to them (a task's part is
   incremental over its previous capture, whatever became of that checkpoint) and go
   once a later one completes without referring to them.

5. **Savepoint.** A savepoint is a checkpoint taken on request, through the same steps:
   :class:`SavepointWanted` makes the next :class:`Tick` start one (the machine asks for
   that tick at once with :class:`WakeAt`) as soon as a checkpoint could start: after the
   checkpoint in flight (it queues behind it) and after a reconfiguration holding the job
   (it waits for it, as checkpoints do); a job whose tasks have started to finish, one
   that ended, or one that already has a savepoint asked or in flight refuses it
   (:class:`SavepointRefused`). It does not move the timer of the checkpoints. Completed,
   it is **pinned**: retention never counts it, never discards it, and never removes the
   directories its chains refer to (its own and earlier checkpoints'), until
   :class:`Unpinned` (the savepoint was deleted); then they go with the next completion
   that no longer refers to them. Its manifest says ``"kind": "savepoint"``.

At most one checkpoint is in flight. **A checkpoint and a reconfiguration never
interleave** (their barriers would overtake each other): a reconfiguration that wants the
job (:class:`ChangeWanted`) goes ahead at once if no checkpoint is in flight or the one
in flight has been captured by every task (its files may still be written: they do not
touch the tasks); otherwise it waits for the captures, at most ``capture_wait_s``, then
the checkpoint is abandoned and the reconfiguration goes ahead (:class:`AllowChange`).
No checkpoint starts while a reconfiguration holds the job (:class:`ChangeEnded` ends
that); one that came due meanwhile starts at the next tick. Each checkpoint records the
abstraction version it was taken in.

The events and commands are plain frozen data in :mod:`.checkpoint_events` (re-exported
here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from controlplane.statuses import CheckpointStatus

from .checkpoint_events import (
    Abandon,
    Abandoned,
    Acked,
    AllowChange,
    Captured,
    ChangeEnded,
    ChangeWanted,
    Command,
    DeleteFiles,
    Discarded,
    Event,
    Inject,
    JobEnded,
    ManifestWritten,
    Report,
    SavepointRefused,
    SavepointWanted,
    Suspended,
    TaskError,
    TaskFinished,
    Tick,
    TimedOut,
    Unpinned,
    WakeAt,
    WriteManifest,
)
from .checkpoint_report import CheckpointKind, CheckpointPolicy, CheckpointReport

__all__ = [
    "CAPTURE_WAIT_S",
    "Abandon",
    "Abandoned",
    "Acked",
    "AllowChange",
    "Captured",
    "ChangeEnded",
    "ChangeWanted",
    "CheckpointMachine",
    "Command",
    "DeleteFiles",
    "Discarded",
    "Event",
    "Inject",
    "JobEnded",
    "ManifestWritten",
    "Report",
    "SavepointRefused",
    "SavepointWanted",
    "Suspended",
    "TaskError",
    "TaskFinished",
    "Tick",
    "TimedOut",
    "Unpinned",
    "WakeAt",
    "WriteManifest",
    "checkpoint_dir",
    "referenced",
]

CAPTURE_WAIT_S = 1.0  # longest a reconfiguration waits for the checkpoint in flight's captures


def checkpoint_dir(job_id: str, checkpoint_id: int) -> str:
    """The store directory of a checkpoint's files (its tasks' parts and its manifest)."""
    return f"{job_id}/chk-{checkpoint_id}"


_DIR = re.compile(r"(?:^|/)chk-(\d+)/")


def referenced(manifest: dict[str, Any]) -> set[int]:
    """The checkpoints whose directories a restore from ``manifest`` reads (its own, and
    those its chains refer to)."""
    found = {int(manifest["checkpoint_id"])}
    for part in manifest["tasks"].values():
        found |= _referenced(part)
    return found


def _referenced(part: dict[str, Any]) -> set[int]:
    """The checkpoints whose files a task's part refers to (its groups' chains)."""
    found: set[int] = set()
    for chain in (part.get("groups") or {}).values():
        for link in chain:
            m = _DIR.search(link[0])
            if m:
                found.add(int(m.group(1)))
    return found


# -- the machine -------------------------------------------------------------------------


@dataclass
class _InFlight:
    report: CheckpointReport
    started: float
    waiting_capture: set[str]
    waiting_ack: set[str]
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    committing: bool = False


class CheckpointMachine:
    """The checkpoints of one job (see the module docstring). ``now`` is any monotonic
    clock in seconds, the same for every call."""

    def __init__(
        self,
        job_id: str,
        policy: CheckpointPolicy,
        now: float,
        *,
        capture_wait_s: float = CAPTURE_WAIT_S,
    ) -> None:
        if policy.interval_s is None:
            raise ValueError("a CheckpointMachine needs a policy with an interval")
        self.job_id = job_id
        self.policy = policy
        self.capture_wait_s = capture_wait_s
        self.due = now + policy.interval_s  # the first one after an interval of running
        self.in_flight: _InFlight | None = None
        self.changing = False  # a reconfiguration holds the job
        self.change_waiting_since: float | None = None
        self.ended = False
        self.finished_tasks: set[str] = set()
        # Completed checkpoints retained, oldest first: id -> the checkpoints it refers to.
        self.retained: dict[int, set[int]] = {}
        # Completed savepoints, kept until unpinned: id -> the checkpoints it refers to.
        self.pinned: dict[int, set[int]] = {}
        self.savepoint_wanted = False
        self.dirs: set[int] = set()  # checkpoints whose directory may exist in the store
        self.latest_completed: int | None = None

    # -- public -------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Command]:
        """The commands ``event`` calls for, to carry out in order."""
        out: list[Command] = []
        match event:
            case Tick():
                self._tick(event, now, out)
            case Captured(task=task, checkpoint_id=cid):
                flight = self._current(cid)
                if flight is not None:
                    flight.waiting_capture.discard(task)
                    self._maybe_allow_change(out)
            case Acked():
                self._acked(event, now, out)
            case TaskError(task=task, checkpoint_id=cid, error=error):
                if self._current(cid) is not None:
                    self._abandon(f"task {task}: {error}", now, out)
            case TaskFinished(task=task):
                self.finished_tasks.add(task)
                if self.savepoint_wanted:  # it would wait for ever
                    self.savepoint_wanted = False
                    out.append(
                        SavepointRefused(f"task {task} finished: a finishing job takes none")
                    )
                flight = self.in_flight
                if flight is not None and not flight.committing and task in flight.waiting_ack:
                    self._abandon(f"task {task} finished before it took its part", now, out)
            case TimedOut(checkpoint_id=cid):
                flight = self._current(cid)
                if flight is not None and not flight.committing:
                    waiting = sorted(flight.waiting_ack)
                    shown = ", ".join(waiting[:5]) + (" ..." if len(waiting) > 5 else "")
                    self._abandon(
                        f"not complete within {self.policy.timeout_s:g}s: waiting for {shown}",
                        now,
                        out,
                    )
            case ManifestWritten():
                self._committed(event, now, out)
            case ChangeWanted():
                self.changing = True
                self.change_waiting_since = now
                self._maybe_allow_change(out)
                if self.change_waiting_since is not None:
                    out.append(self._wake(now))
            case ChangeEnded():
                self.changing = False
                self.change_waiting_since = None
                out.append(self._wake(now))
            case Suspended(reason=reason):
                self.changing = True
                self.change_waiting_since = None
                self.finished_tasks.clear()  # the recovered tasks run again
                self._abandon(reason, now, out)
            case JobEnded(reason=reason):
                self.ended = True
                if self.savepoint_wanted:
                    self.savepoint_wanted = False
                    out.append(SavepointRefused(f"the job ended ({reason})"))
                if self.in_flight is not None:
                    self._abandon(reason, now, out)
                out.append(WakeAt(None))
            case SavepointWanted():
                self._savepoint_wanted(now, out)
            case Unpinned(checkpoint_id=cid):
                self.pinned.pop(cid, None)
        return out

    def adopt(
        self,
        manifest: dict[str, Any],
        present: set[int],
        savepoints: list[dict[str, Any]] | tuple[()] = (),
    ) -> None:
        """Take the completed checkpoint ``manifest`` (an earlier coordinator's, or the
        savepoint a job was submitted from) as the latest and retained one, and pin the
        ``savepoints`` (their manifests) the job's store holds; the directories
        ``present`` are known to exist."""
        cid = int(manifest["checkpoint_id"])
        refs = referenced(manifest)
        self.retained = {cid: refs}
        self.latest_completed = cid
        self.dirs |= present | refs
        for savepoint in savepoints:
            pins = referenced(savepoint)
            self.pinned[int(savepoint["checkpoint_id"])] = pins
            self.dirs |= pins

    @property
    def wake_at(self) -> float | None:
        """When the machine next wants a :class:`Tick` (None: never again)."""
        return None if self.ended else self.due

    # -- steps --------------------------------------------------------------------------

    def _current(self, checkpoint_id: int) -> _InFlight | None:
        flight = self.in_flight
        if flight is None or flight.report.id != checkpoint_id:
            return None  # a late reply of an abandoned checkpoint
        return flight

    def _tick(self, tick: Tick, now: float, out: list[Command]) -> None:
        if self.change_waiting_since is not None:
            if now - self.change_waiting_since >= self.capture_wait_s:
                self._abandon(
                    f"a reconfiguration went first (the capture took over "
                    f"{self.capture_wait_s:g}s)",
                    now,
                    out,
                )
            else:
                out.append(self._wake(now))
            return
        startable = (
            not self.ended
            and self.in_flight is None
            and not self.changing
            and not self.finished_tasks
            and (now >= self.due or self.savepoint_wanted)
            and tick.tasks
        )
        assert self.policy.interval_s is not None
        if not startable:
            if not tick.tasks and now >= self.due:  # nothing runs: try again an interval on
                self.due = now + self.policy.interval_s
            out.append(self._wake(now))
            return
        kind = CheckpointKind.SAVEPOINT if self.savepoint_wanted else CheckpointKind.CHECKPOINT
        report = CheckpointReport(
            tick.barrier_id, self.job_id, tick.version, kind, tasks=len(tick.tasks)
        )
        self.in_flight = _InFlight(report, now, set(tick.tasks), set(tick.tasks))
        self.dirs.add(tick.barrier_id)
        if self.savepoint_wanted:
            self.savepoint_wanted = False  # step 5: the timer of checkpoints stays as it is
        else:
            self.due = now + self.policy.interval_s
        out.append(Report(_copy(report)))
        out.append(Inject(tick.barrier_id))
        out.append(self._wake(now))

    def _acked(self, ack: Acked, now: float, out: list[Command]) -> None:
        flight = self._current(ack.checkpoint_id)
        if flight is None or ack.task not in flight.waiting_ack:
            return
        flight.waiting_capture.discard(ack.task)
        flight.waiting_ack.discard(ack.task)
        flight.parts[ack.task] = ack.part
        flight.report.bytes += ack.written
        flight.report.full_bytes += ack.size
        self._maybe_allow_change(out)
        if not flight.waiting_ack:
            flight.committing = True
            manifest = {
                "job_id": self.job_id,
                "checkpoint_id": flight.report.id,
                "kind": str(flight.report.kind),
                "version": flight.report.version,
                "tasks": dict(sorted(flight.parts.items())),
            }
            out.append(WriteManifest(flight.report.id, manifest))

    def _committed(self, done: ManifestWritten, now: float, out: list[Command]) -> None:
        flight = self._current(done.checkpoint_id)
        if flight is None:
            return
        if done.error is not None:
            self._abandon(f"its manifest could not be written: {done.error}", now, out)
            return
        report = flight.report
        report.status = CheckpointStatus.COMPLETED
        report.path = done.path
        report.duration_ms = round((now - flight.started) * 1000, 3)
        refs = {report.id}
        for part in flight.parts.values():
            refs |= _referenced(part)
        if report.kind is CheckpointKind.SAVEPOINT:
            self.pinned[report.id] = refs  # step 5: kept until unpinned, never discarded
        else:
            self.retained[report.id] = refs
        self.latest_completed = report.id
        self.in_flight = None
        out.append(Report(_copy(report)))
        while len(self.retained) > self.policy.retained:
            gone = next(iter(self.retained))
            del self.retained[gone]
            out.append(Discarded(gone))
        keep = set().union(*self.retained.values(), *self.pinned.values())
        garbage = tuple(sorted(d for d in self.dirs if d < report.id and d not in keep))
        if garbage:
            self.dirs -= set(garbage)
            out.append(DeleteFiles(garbage))
        self._maybe_allow_change(out)
        out.append(self._wake(now))

    def _abandon(self, reason: str, now: float, out: list[Command]) -> None:
        flight = self.in_flight
        if flight is None:
            return
        self.in_flight = None
        report = flight.report
        report.status = CheckpointStatus.ABANDONED
        report.error = reason
        report.duration_ms = round((now - flight.started) * 1000, 3)
        out.append(Abandon(report.id))
        out.append(Report(_copy(report)))
        out.append(Abandoned(report.id))
        self._maybe_allow_change(out)
        if not self.ended:
            out.append(self._wake(now))

    def _savepoint_wanted(self, now: float, out: list[Command]) -> None:
        """Step 5: take a savepoint at the next tick that can start one, or refuse."""
        flight = self.in_flight
        why = None
        if self.ended:
            why = "the job has ended"
        elif self.finished_tasks:
            shown = ", ".join(sorted(self.finished_tasks)[:5])
            why = f"tasks of the job have finished ({shown}): a finishing job takes none"
        elif self.savepoint_wanted:
            why = "a savepoint of the job is already asked: wait for it to end"
        elif flight is not None and flight.report.kind is CheckpointKind.SAVEPOINT:
            why = f"savepoint {flight.report.id} of the job is under way: wait for it to end"
        if why is not None:
            out.append(SavepointRefused(why))
            return
        self.savepoint_wanted = True
        out.append(self._wake(now))

    def _maybe_allow_change(self, out: list[Command]) -> None:
        if self.change_waiting_since is None:
            return
        flight = self.in_flight
        if flight is None or not flight.waiting_capture:
            self.change_waiting_since = None
            out.append(AllowChange())

    def _wake(self, now: float) -> WakeAt:
        """When to tick next: at ``due``, unless something holds checkpoints back (one in
        flight, a change, finished tasks): then only when what holds them ends (its own
        event wakes the machine), or when a waiting change's capture wait is over; never
        at a time already past, which would spin the driver's timer."""
        if self.ended:
            return WakeAt(None)
        held = self.in_flight is not None or self.changing or bool(self.finished_tasks)
        due = now if self.savepoint_wanted else self.due
        at: float | None = None if held else max(due, now)
        if self.change_waiting_since is not None:
            deadline = self.change_waiting_since + self.capture_wait_s
            at = deadline if at is None else min(at, deadline)
        flight = self.in_flight
        if flight is None:
            return WakeAt(at)
        return WakeAt(at, flight.report.id, flight.started + self.policy.timeout_s)


def _copy(report: CheckpointReport) -> CheckpointReport:
    return CheckpointReport(**{f: getattr(report, f) for f in report.__dataclass_fields__})
