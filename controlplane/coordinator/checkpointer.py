"""The driver of a job's checkpoints: :class:`Checkpointer` carries out what the pure
:class:`~.checkpoint_protocol.CheckpointMachine` decides (the protocol is documented
there) on the coordinator's loop: timers, messages to workers, the manifest and the
removal of files in the store (on a thread: the store's calls block), and the report to
the control plane's listener.

A reconfiguration of the job first calls :meth:`Checkpointer.quiesce` (through
:meth:`.slot.ChangeSlot.hold`), which returns once no checkpoint capture is under way,
and :meth:`Checkpointer.resume` when it ends.

A savepoint (:meth:`Checkpointer.savepoint`) is a checkpoint taken on request (step 5 of
the protocol); its manifest is ``<job>/chk-<id>/_savepoint.msgpack`` (so that it is never
taken for the newest checkpoint, and the job's savepoints can be found in the store).

**Commit before anything else.** When a checkpoint or a savepoint completes, the
``commit_checkpoint`` message goes to every worker of the job (two-phase sinks make
visible what they prepared) *before* anyone waiting for it is told: whatever a waiter
sends next (the ``stop`` of a stop-with-savepoint) follows the commit on each worker's
connection, whose messages arrive in the order they were sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from controlplane.statuses import JobStatus
from runtime import messages
from runtime.checkpoints.store import CheckpointStore, open_store
from runtime.records import BarrierKind

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
from .checkpoint_protocol import CheckpointMachine, checkpoint_dir
from .checkpoint_report import CheckpointKind
from .errors import CoordinatorError

if TYPE_CHECKING:
    from runtime.dataflow import JobGraph
    from runtime.layout import Layout

    from .checkpoint_report import CheckpointPolicy, CheckpointReport
    from .model import RunningJob
    from .ports import Membership

__all__ = [
    "CheckpointListener",
    "Checkpointer",
    "Restorable",
    "manifest_path",
    "operators_of",
]

logger = logging.getLogger(__name__)

# Told of every change of a checkpoint's report; a discarded checkpoint comes as its id.
CheckpointListener = Callable[["str", "CheckpointReport | int"], None]


class Restorable(NamedTuple):
    """A complete checkpoint, as a recovery needs it: its manifest, and the layout and
    abstraction version the job ran when it was taken."""

    manifest: dict[str, Any]
    layout: Layout
    abstraction: Any


def manifest_path(
    job_id: str, checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT
) -> str:
    """Where a checkpoint's manifest is in the store: written last, it makes it complete.
    A savepoint's has a name of its own (module docstring)."""
    name = "_savepoint" if kind is CheckpointKind.SAVEPOINT else "_manifest"
    return f"{checkpoint_dir(job_id, checkpoint_id)}/{name}.msgpack"


def operators_of(graph: JobGraph, layout: Layout) -> dict[str, dict[str, Any]]:
    """What a manifest says of the job's operators, for a job restored from it to be
    checked against (:mod:`.from_savepoint`): per operator its kind, its parallelism in
    ``layout`` and its number of key groups."""
    return {
        op.name: {
            "kind": op.kind,
            "parallelism": len(layout.tasks_of(op.name)),
            "max_parallelism": op.max_parallelism,
        }
        for op in graph.operators
    }


class Checkpointer:
    """Takes ``job``'s checkpoints as ``policy`` says, into ``store`` (module docstring)."""

    def __init__(
        self,
        host: Membership,
        job: RunningJob,
        policy: CheckpointPolicy,
        store: CheckpointStore,
        listener: CheckpointListener | None = None,
    ) -> None:
        self.host = host
        self.job = job
        self.store = store
        self.listener = listener
        self._loop = asyncio.get_running_loop()
        self.machine = CheckpointMachine(job.id, policy, self._loop.time())
        self.latest: Restorable | None = None  # the last completed one
        self._taken: dict[int, tuple[Layout, Any]] = {}  # in flight: layout and version
        self._tick: asyncio.TimerHandle | None = None
        self._timeout: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._work: set[asyncio.Task[Any]] = set()
        self._manifests: dict[int, dict[str, Any]] = {}
        # The savepoint asked, until it ends: told its report, or why none was taken.
        self._savepoint: asyncio.Future[CheckpointReport] | None = None

    @classmethod
    async def open(
        cls,
        host: Membership,
        job: RunningJob,
        policy: CheckpointPolicy,
        location: str,
        listener: CheckpointListener | None = None,
    ) -> Checkpointer:
        """A checkpointer writing to the store at ``location`` (opened on a thread)."""
        store = await asyncio.to_thread(open_store, location)
        return cls(host, job, policy, store, listener)

    # -- what the coordinator tells it ---------------------------------------------------

    def start(self) -> None:
        """The job runs: the first checkpoint comes after one interval."""
        self._run([WakeAt(self.machine.wake_at)])

    def on_message(self, msg: messages.ToCoordinator) -> None:
        """A worker's capture, ack or failure for one of this job's checkpoints."""
        match msg:
            case messages.CheckpointCaptured(task=task, checkpoint_id=cid):
                self.handle(Captured(task, cid))
            case messages.CheckpointAck(task=task, checkpoint_id=cid):
                self.handle(Acked(task, cid, msg.part, msg.written, msg.size))
            case messages.CheckpointFailed(task=task, checkpoint_id=cid, error=error):
                self.handle(TaskError(task, cid, error))

    def task_finished(self, task: str) -> None:
        self.handle(TaskFinished(task))

    async def savepoint(self) -> CheckpointReport:
        """Take a savepoint (step 5 of the protocol): returns its report once it has
        ended, ``completed`` (its commit already sent: module docstring) or
        ``abandoned`` with its error. Raises :class:`CoordinatorError` saying why when
        none can be taken (one is already asked, tasks finished, the job ended)."""
        if self._savepoint is not None:
            raise CoordinatorError("a savepoint of the job is already asked: wait for it to end")
        fut: asyncio.Future[CheckpointReport] = self._loop.create_future()
        self._savepoint = fut
        self.handle(SavepointWanted())
        try:
            return await fut
        finally:
            if self._savepoint is fut:
                self._savepoint = None

    def unpin(self, checkpoint_id: int) -> None:
        """Savepoint ``checkpoint_id`` was deleted: its manifest goes now, the files only
        it refers to once the next checkpoint completes without them (a recovery may
        still go back to it until then)."""
        self.handle(Unpinned(checkpoint_id))
        path = manifest_path(self.job.id, checkpoint_id, CheckpointKind.SAVEPOINT)
        self._spawn(self._remove(path))

    def stop(self, reason: str) -> None:
        """The job ended: no checkpoint starts again; the one in flight is abandoned."""
        if not self.machine.ended:
            self.handle(JobEnded(reason))
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def close(self) -> None:
        """Wait (briefly) for manifests and removals under way."""
        if self._work:
            await asyncio.wait(set(self._work), timeout=5.0)

    async def quiesce(self) -> None:
        """Return once a reconfiguration may go ahead (no capture under way); no
        checkpoint starts until :meth:`resume`."""
        fut = self._loop.create_future()
        self._waiters.append(fut)
        self.handle(ChangeWanted())
        await fut

    def resume(self) -> None:
        """The reconfiguration (or the recovery) ended."""
        self.handle(ChangeEnded())

    def adopt(
        self,
        checkpoint: Restorable,
        present: set[int] | None = None,
        savepoints: list[dict[str, Any]] | tuple[()] = (),
    ) -> None:
        """A job resumed from ``checkpoint`` (taken under an earlier control plane, or the
        savepoint it was submitted from): it is the one a recovery goes back to, retained,
        the ``savepoints`` (manifests) of the job are pinned, and the checkpoints
        ``present`` in the store (their directories' ids) are removed once nothing kept
        refers to them."""
        self.latest = checkpoint
        self.machine.adopt(checkpoint.manifest, present or set(), savepoints)

    def suspend(self, reason: str) -> None:
        """The job is recovering: the checkpoint in flight is abandoned with ``reason``;
        none starts until :meth:`resume`."""
        self.handle(Suspended(reason))

    # -- the machine's commands ----------------------------------------------------------

    def handle(self, event: Event) -> None:
        self._run(self.machine.handle(event, self._loop.time()))

    def _run(self, commands: list[Command]) -> None:
        job = self.job
        for c in commands:
            match c:
                case Inject(checkpoint_id=cid):
                    self._taken[cid] = (job.layout, job.abstraction)
                    barrier = messages.InjectBarrier(job.id, BarrierKind.CHECKPOINT, cid)
                    for wid in job.layout.workers_used():
                        self.host.send(wid, barrier)
                case WakeAt():
                    self._arm(c)
                case WriteManifest(checkpoint_id=cid, manifest=manifest):
                    # The job's clock origin: a job resumed from it keeps its sources' pace;
                    # its operators: a job submitted from it is checked against them.
                    layout = self._taken[cid][0]
                    manifest = {
                        **manifest,
                        "started_at": job.started_at,
                        "operators": operators_of(job.graph, layout),
                    }
                    self._manifests[cid] = manifest
                    self._spawn(self._write_manifest(cid, manifest))
                case Abandon(checkpoint_id=cid):
                    for wid in job.layout.workers_used():
                        self.host.send(wid, messages.AbandonCheckpoint(job.id, cid))
                case DeleteFiles(checkpoint_ids=ids):
                    self._spawn(self._delete(ids))
                case Report(report=report):
                    if report.status == "completed":
                        layout, abstraction = self._taken.pop(report.id)
                        manifest = self._manifests.pop(report.id)
                        self.latest = Restorable(manifest, layout, abstraction)
                        # Sinks commit what they prepared at its barrier (two-phase).
                        commit = messages.CommitCheckpoint(job.id, report.id)
                        for wid in job.layout.workers_used():
                            self.host.send(wid, commit)
                    self._tell(report)
                    if report.kind is CheckpointKind.SAVEPOINT and report.status != "in_progress":
                        self._settle(report)  # after the commit: module docstring
                case Discarded(checkpoint_id=cid):
                    self._tell(cid)
                case Abandoned(checkpoint_id=cid):
                    self._manifests.pop(cid, None)
                    self._taken.pop(cid, None)
                case SavepointRefused(reason=reason):
                    self._settle(CoordinatorError(f"no savepoint taken: {reason}"))
                case AllowChange():
                    for fut in self._waiters:
                        if not fut.done():
                            fut.set_result(None)
                    self._waiters.clear()

    def _settle(self, outcome: CheckpointReport | CoordinatorError) -> None:
        """Tell the waiter of the savepoint asked how it ended."""
        fut = self._savepoint
        if fut is None or fut.done():
            return
        if isinstance(outcome, CoordinatorError):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def _tell(self, what: CheckpointReport | int) -> None:
        if self.listener is None:
            return
        try:
            self.listener(self.job.id, what)
        except Exception:
            logger.exception("job %s: the checkpoint listener failed", self.job.id)

    def _arm(self, wake: WakeAt) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        if wake.at is not None:
            self._tick = self._loop.call_at(wake.at, self._fire)
        if wake.timeout_of is not None and wake.timeout_at is not None:
            cid = wake.timeout_of
            self._timeout = self._loop.call_at(wake.timeout_at, lambda: self.handle(TimedOut(cid)))

    def _fire(self) -> None:
        self._tick = None
        job = self.job
        tasks = frozenset(job.layout.placement) - job.finished_tasks
        if job.status is JobStatus.RECOVERING:  # its tasks are being stopped: none to take
            tasks = frozenset()
        version = getattr(job.abstraction, "version", None)
        self.handle(Tick(self.host.next_barrier_id(), tasks, version))

    def _spawn(self, work: Any) -> None:
        t = asyncio.ensure_future(work)
        self._work.add(t)
        t.add_done_callback(self._work.discard)

    async def _write_manifest(self, cid: int, manifest: dict[str, Any]) -> None:
        path = manifest_path(self.job.id, cid, CheckpointKind(manifest["kind"]))
        try:
            data = msgpack.packb(manifest, use_bin_type=True)
            await asyncio.to_thread(self.store.put, path, data)
        except Exception as exc:
            self.handle(ManifestWritten(cid, None, f"{type(exc).__name__}: {exc}"))
            return
        self.handle(ManifestWritten(cid, path))

    async def _remove(self, path: str) -> None:
        try:
            await asyncio.to_thread(self.store.delete, path)
        except Exception as exc:  # left in the store: the job's directory goes with it
            logger.warning("job %s: %s not removed: %s", self.job.id, path, exc)

    async def _delete(self, ids: tuple[int, ...]) -> None:
        for cid in ids:
            try:
                await asyncio.to_thread(self.store.delete, checkpoint_dir(self.job.id, cid))
            except Exception as exc:  # left in the store; the next removal tries no more
                logger.warning(
                    "job %s: checkpoint %s's files not removed: %s", self.job.id, cid, exc
                )
