"""One job's tasks on one worker, built from the job's :class:`~runtime.layout.Layout`,
with their channels and data connections.

:class:`JobRuntime` deploys the tasks (inputs first: local outputs need them), starts
them, injects barriers at its sources, snapshots them for the stop-and-restart baseline
and stops them. It asks of the worker hosting it only what :class:`WorkerServices`
lists, and never imports :mod:`runtime.worker`.

A live reconfiguration of the job is carried out by the modules above this one, each on
the runtime and the :class:`~runtime.change.Change` it holds as ``pending``:

- :mod:`runtime.reconfigure`: the worker's part of the protocol (prepare, pause at the
  barrier, update, abort), each task's part chosen by its role in the change;
- :mod:`runtime.copyahead`: copying key groups ahead during the prepare;
- :mod:`runtime.stages`: the stages of a fluid change;
- :mod:`runtime.shipping`: the state a task gives away and takes in.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Protocol

from . import handshake, protocol
from .change import Change, WorkerReconfigurationError
from .channels import InputChannel, InputGate, LocalOutputChannel, OutputChannel
from .checkpoints.taking import (
    Capture,
    CheckpointWriter,
    GroupChains,
    capture_keyed,
    read_groups,
)
from .dataflow import JobGraph, OperatorSpec
from .handover import StateInbox
from .keygroups import key_group_fn
from .layout import Layout, split_task_id
from .messages import (
    ChannelConfig,
    CheckpointAck,
    CheckpointCaptured,
    CheckpointConfig,
    CheckpointFailed,
    PartitionsFound,
    Restore,
    Snapshot,
    ToCoordinator,
)
from .metrics import TaskMetrics
from .operators import KeyedProcessor, SinkProcessor, make_processor
from .partitioning import BroadcastEdge, Edge, ForwardEdge, KeyGroupEdge, Outputs, RebalanceEdge
from .peerlink import PeerLink, RemoteOutputChannel
from .records import Barrier, BarrierKind
from .state import KeyedState
from .task import BaseTask, SourceTask, StreamTask, TaskHost, TaskStatus

__all__ = ["JobRuntime", "WorkerServices"]

logger = logging.getLogger(__name__)


class WorkerServices(TaskHost, Protocol):
    """What a job's runtime needs from the worker hosting it (:class:`~runtime.worker.WorkerProcess`
    provides it), besides hosting its tasks (:class:`~runtime.task.TaskHost`)."""

    worker_id: str
    secret: str  # the cluster secret: data connections prove a key derived from it
    client_tls: ssl.SSLContext | None  # to dial peers' data servers
    state: StateInbox  # key-group state and source positions that came for tasks here
    checkpoint_writer: CheckpointWriter  # writes tasks' checkpoint parts off their loops

    def send(self, msg: ToCoordinator) -> None:
        """Queue ``msg`` for the coordinator."""
        ...

    def register_input(self, channel: InputChannel) -> None:
        """Route the frames of ``channel.key`` that peers send here to ``channel``."""
        ...

    def unregister_input(self, channel: InputChannel) -> None:
        """Stop routing frames to ``channel`` (if another channel of its key has not
        replaced it)."""
        ...

    def background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` beside the control loop, cancelled if the worker shuts down."""
        ...

    def forget(self, job: JobRuntime) -> None:
        """None of ``job``'s tasks is left here: drop it and let go of what it holds."""
        ...

    def peer_failed(self, job: JobRuntime, peer: str, exc: BaseException) -> None:
        """The data connection of ``job`` to worker ``peer`` failed: the job fails."""
        ...

    def task_ran_dry(self) -> None:
        """A task here has processed all its input (:attr:`InputGate.on_dry`)."""
        ...

    async def caught_up(self) -> None:
        """Wait (a while at most) until no running task here has input waiting."""
        ...


class JobRuntime:
    """The tasks of one job that run on this worker, and their channels."""

    def __init__(
        self,
        worker: WorkerServices,
        job_id: str,
        graph: bytes,
        layout: Layout,
        peers: Mapping[str, tuple[str, int]],
        config: ChannelConfig,
        restore: Mapping[str, Restore] | None = None,
        checkpoints: CheckpointConfig | None = None,
        attempt: int = handshake.FIRST_ATTEMPT,
    ) -> None:
        """The job ``job_id`` here, as a ``deploy`` (or a ``prepare`` that makes this worker
        join it) describes it: ``graph`` pickled (its code installed already), every
        worker's data address, per task what it restarts from (:meth:`deploy`), where
        its checkpoints go (None: it takes none), and which deployment of the job it is
        (its data connections name it)."""
        self.worker = worker
        self.job_id = job_id
        self.attempt = attempt
        self.graph: JobGraph = pickle.loads(graph)
        self.layout = layout
        self.peers: dict[str, tuple[str, int]] = dict(peers)
        self.batch_size = config.batch_size
        self.linger_s = config.linger_s
        self.credits = config.credits
        self.hot_keys = config.hot_keys  # keyed tasks sketch their heaviest keys
        self.tasks: dict[str, BaseTask] = {}
        self.inputs: dict[str, InputChannel] = {}
        self.links: dict[str, PeerLink] = {}
        # Key-group state goes to a peer on a connection of its own, so that data frames
        # never queue behind it (a copy ahead is sent while the tasks run).
        self.state_links: dict[str, PeerLink] = {}
        self.start_time = 0.0
        self.pending: Change | None = None  # see runtime.reconfigure
        # A staged change this worker was done with before the change ended (its tasks had
        # no part in the later stages): cut short, it must still end here where it ended.
        self.ended_early: Change | None = None
        self.savepoint_id: int | None = None
        self.restore: dict[str, Restore] = dict(restore or {})
        self.checkpoints = checkpoints
        self._discover_at: dict[str, float] = {}  # partitioned source -> next listing due
        self._discovering: set[str] = set()  # partitioned sources being listed now
        self.restored: dict[str, int] = {}  # bytes of state restored: local_bytes, store_bytes
        self.stage_work: set[asyncio.Future] = set()  # key groups moving in a fluid stage
        self._connecting: dict[tuple[str, bool], asyncio.Future[PeerLink]] = {}

    @property
    def me(self) -> str:
        return self.worker.worker_id

    def local_task_ids(self, layout: Layout) -> list[str]:
        return [t for t, w in layout.placement.items() if w == self.me]

    # -- channels ----------------------------------------------------------------------------

    def register_input(self, upstream: str, task: str, key_fn: Callable | None) -> InputChannel:
        """The input channel from ``upstream`` into ``task``, made and registered with the
        worker if there is none yet."""
        key = protocol.channel_key(self.job_id, upstream, task)
        ch = self.inputs.get(key)
        if ch is None:
            ch = InputChannel(key, upstream, key_fn)
            self.inputs[key] = ch
            self.worker.register_input(ch)
        return ch

    def unregister_input(self, key: str) -> None:
        """Forget input channel ``key``, here and in the worker's registry if it is ours
        there (a runtime of the job made after this one was forgotten has its own)."""
        ch = self.inputs.pop(key, None)
        if ch is not None:
            self.worker.unregister_input(ch)

    def input_keys(self, task: str, layout: Layout) -> list[tuple[str, str, Callable | None]]:
        """(channel key, upstream task, key function) of each input of ``task`` in ``layout``."""
        op = self.graph.operator(split_task_id(task)[0])
        return [
            (protocol.channel_key(self.job_id, u, task), u, inp.key)
            for inp in op.inputs
            for u in layout.upstream_tasks(self.graph, task, inp)
        ]

    async def link(self, worker_id: str, state: bool = False) -> PeerLink:
        """The data connection to ``worker_id`` (``state``: the one for key-group state),
        opened on first use."""
        link = (self.state_links if state else self.links).get(worker_id)
        if link is not None:
            return link
        # Tasks updated together (or stages under way together) may ask at once: one
        # connection, which they all wait for (a waiter cancelled does not cancel it).
        key = (worker_id, state)
        connecting = self._connecting.get(key)
        if connecting is None:
            connecting = asyncio.ensure_future(self._connect(worker_id, state))
            self._connecting[key] = connecting
            connecting.add_done_callback(lambda _: self._connecting.pop(key, None))
        return await asyncio.shield(connecting)

    def mailbox(self, task: str) -> str:
        """Task ``task``'s name in the worker's state inbox (see protocol.state_owner)."""
        return protocol.state_owner(self.job_id, task)

    async def _connect(self, worker_id: str, state: bool) -> PeerLink:
        """A data connection to ``worker_id`` for this job alone: it proves the job's data
        key (see runtime.handshake), and the peer routes only this job's frames from it."""
        host, port = self.peers[worker_id]
        link = await PeerLink.connect(
            worker_id,
            host,
            port,
            self.me,
            job_id=self.job_id,
            key=handshake.data_key(self.worker.secret, self.job_id),
            attempt=self.attempt,
            tls=self.worker.client_tls,
        )
        link.on_error = lambda exc, w=worker_id: self.worker.peer_failed(self, w, exc)
        if state:  # it carries no channels, only the state of a pending change
            link.in_use = lambda: self.pending is not None
        (self.state_links if state else self.links)[worker_id] = link
        return link

    async def _output_channel(
        self, src: str, dst: str, layout: Layout, reuse: dict[str, OutputChannel]
    ) -> OutputChannel:
        old = reuse.get(dst)
        target_worker = layout.placement[dst]
        if old is not None:
            same_place = isinstance(old, LocalOutputChannel) == (target_worker == self.me)
            if same_place and (target_worker == self.me or old.link.peer == target_worker):  # type: ignore[attr-defined]
                return old
        key = protocol.channel_key(self.job_id, src, dst)
        if target_worker == self.me:
            receiver = self.inputs.get(key)
            if receiver is None:
                raise WorkerReconfigurationError(f"no input channel {key} on worker {self.me}")
            return LocalOutputChannel(key, dst, self.credits, receiver)
        return RemoteOutputChannel(key, dst, self.credits, await self.link(target_worker))

    async def edges(
        self, op: OperatorSpec, tid: str, layout: Layout, reuse: dict[str, OutputChannel]
    ) -> list[Edge]:
        """Task ``tid``'s output edges in ``layout``, reusing the channels of ``reuse`` (by
        target task) whose target has not moved to another worker."""
        edges: list[Edge] = []
        for down, inp in self.graph.downstream(op.name):
            targets = layout.downstream_tasks(tid, down.name, inp)
            chans = [await self._output_channel(tid, t, layout, reuse) for t in targets]
            if inp.partitioning == "forward":
                edges.append(ForwardEdge(down.name, chans))
            elif inp.partitioning == "broadcast":
                edges.append(BroadcastEdge(down.name, chans))
            elif inp.partitioning == "rebalance":
                edges.append(
                    RebalanceEdge(down.name, chans, [layout.weights.get(t, 1.0) for t in targets])
                )
            else:
                owner = layout.owner_table(down, targets)
                edges.append(
                    KeyGroupEdge(
                        down.name,
                        chans,
                        inp.key,
                        key_group_fn(down.max_parallelism),
                        owner,
                        layout.splits.get(down.name),
                    )
                )
        return edges

    async def make_task(self, tid: str, layout: Layout, gate: InputGate) -> BaseTask:
        """Task ``tid`` as ``layout`` has it (its logic, key groups and output channels),
        reading ``gate``; not started."""
        op = self.graph.operator(split_task_id(tid)[0])
        index = split_task_id(tid)[1]
        outputs = Outputs(await self.edges(op, tid, layout, {}), self.batch_size, self.linger_s)
        metrics = TaskMetrics(
            op.max_parallelism if op.keyed else 0, sink=op.kind == "sink", hot_keys=self.hot_keys
        )
        logic = layout.logic_of(op, tid)
        if logic is not op.logic:
            op = replace(op, logic=logic)
        task: BaseTask
        if op.kind == "source":
            task = SourceTask(tid, op, index, outputs, metrics, self.worker)
            if op.partitions is not None:
                task.partitions = tuple(layout.partitions.get(tid, ()))
        else:
            state = KeyedState(tid, layout.assignment.get(tid, ())) if op.keyed else None
            if op.kind == "sink":  # its writer knows the parallelism it runs at now
                op = replace(op, parallelism=len(layout.tasks_of(op.name)))
            processor = make_processor(tid, op, index, outputs, metrics, state)
            if isinstance(processor, KeyedProcessor):
                processor.splits = layout.splits.get(op.name, {})
            if isinstance(processor, SinkProcessor) and self.checkpoints is not None:
                processor.writer.transactional()
            if isinstance(processor, KeyedProcessor) and self.checkpoints is not None:
                processor.note_changes()
                processor.chains = GroupChains(self.checkpoints.full_every)
            task = StreamTask(tid, op, index, outputs, metrics, self.worker, gate, processor)
        task.job_id = self.job_id  # type: ignore[attr-defined]
        return task

    # -- running -----------------------------------------------------------------------------

    async def deploy(self) -> None:
        """Create this worker's tasks and their channels (inputs first: local outputs need them)."""
        local = sorted(self.local_task_ids(self.layout))
        gates: dict[str, InputGate] = {}
        for tid in local:
            gate = InputGate(on_dry=self.worker.task_ran_dry)
            for _key, u, key_fn in self.input_keys(tid, self.layout):
                gate.add(self.register_input(u, tid, key_fn))
            gates[tid] = gate
        for tid in local:
            self.tasks[tid] = await self.make_task(tid, self.layout, gates[tid])
        for tid, entry in self.restore.items():  # a restart from a snapshot or a checkpoint
            await self._restore(self.tasks[tid], entry)

    async def _restore(self, task: BaseTask, entry: Restore) -> None:
        """Give ``task`` the state ``entry`` holds: key groups (bytes of a savepoint, or
        chains of a checkpoint read from the store on a thread), a sink's snapshot. A
        source's position is taken when it starts."""
        processor = task.processor if isinstance(task, StreamTask) else None
        if isinstance(processor, KeyedProcessor):
            state = processor.state
            for g, data in entry.groups.items():
                state.import_group(g, data)
            if entry.chains:
                if self.checkpoints is None:
                    raise WorkerReconfigurationError(
                        f"task {task.task_id}: restored from a checkpoint, but the job has "
                        "no checkpoint store here"
                    )
                writer, location = self.worker.checkpoint_writer, self.checkpoints.store
                store = await asyncio.to_thread(writer.store, location)
                local = writer.copies_for(location)
                groups, read = await asyncio.to_thread(read_groups, store, entry.chains, local)
                for what, n in read.items():
                    self.restored[what] = self.restored.get(what, 0) + n
                for g, data in groups.items():
                    state.take_in(g, data)
                processor.chains = GroupChains.restored(
                    self.checkpoints.full_every, entry.chains, state.arrivals
                )
        elif isinstance(processor, SinkProcessor) and entry.sink is not None:
            processor.writer.restore(entry.sink)

    def start(self, start_time: float) -> None:
        """Start every task here. A task that cannot (a source whose reader does not
        open: a broker gone, a partition deleted) fails, as one whose code raises does:
        the coordinator hears ``task_failed``; the worker and its other tasks go on."""
        self.start_time = start_time
        for tid, task in self.tasks.items():
            entry = self.restore.get(tid)
            position = None if entry is None else entry.position
            try:
                if isinstance(task, SourceTask):
                    task.start(start_time, position, len(self.layout.tasks_of(task.op.name)))
                else:
                    task.start(start_time)
            except Exception as exc:
                logger.warning("task %s could not start", tid, exc_info=True)
                task.status = TaskStatus.FAILED
                task.close()
                self.worker.task_failed(
                    task, f"task {tid!r} could not start: {type(exc).__name__}: {exc}"
                )
        self.restore = {}

    def savepoint(self, barrier_id: int) -> None:
        """Stop-and-restart baseline, step 1: snapshot every task at ``barrier_id`` and halt."""
        self.savepoint_id = barrier_id
        self.inject(Barrier(BarrierKind.CHECKPOINT, barrier_id))

    def snapshot_and_halt(self, task: BaseTask) -> None:
        """Send ``task``'s whole state to the coordinator; the task then stays paused."""
        position: Any = None
        groups: dict[int, bytes] = {}
        if isinstance(task, SourceTask) and task.reader is not None:
            position = task.reader.position()
        elif isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
            state = task.processor.state
            groups = {g: state.export_group(g) for g in state.owned()}
        elif isinstance(task, StreamTask) and isinstance(task.processor, SinkProcessor):
            task.processor.close()
        metrics = task.snapshot_metrics()  # its last counts: the task stops here
        self.worker.send(Snapshot(self.job_id, task.task_id, metrics, groups, position))

    def inject(self, barrier: Barrier) -> None:
        for task in self.tasks.values():
            if isinstance(task, SourceTask):
                task.inject(barrier)

    def abort_barrier(self, barrier_id: int) -> None:
        """Drop barrier ``barrier_id`` here: sources that have not emitted it will not, and
        tasks aligning it unblock their inputs (later arrivals of it are ignored)."""
        for task in self.tasks.values():
            if isinstance(task, SourceTask):
                task.abort_barrier(barrier_id)
            elif isinstance(task, StreamTask):
                pending = task.aligner.pending
                task.aligner.abort(barrier_id)
                if pending is not None and pending.id == barrier_id:
                    task.gate.unblock_all()

    def take_checkpoint(self, task: BaseTask, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id``'s barrier is aligned at ``task``: capture its part
        now, on its loop, and write it off the loop (:mod:`runtime.checkpoints.taking`);
        the coordinator hears ``checkpoint_captured``, then ``checkpoint_ack`` once the
        part is durable, or ``checkpoint_failed``."""
        send, tid = self.worker.send, task.task_id
        if self.checkpoints is None:
            send(CheckpointFailed(self.job_id, tid, checkpoint_id, "no checkpoint store here"))
            return
        capture = Capture(self.job_id, tid, checkpoint_id, self.checkpoints.store)
        processor = task.processor if isinstance(task, StreamTask) else None
        chains: GroupChains | None = None
        try:
            if isinstance(task, SourceTask) and task.reader is not None:
                capture.position = task.reader.position()
                task.checkpointed(checkpoint_id, capture.position)
            elif isinstance(processor, SinkProcessor):
                capture.sink = processor.writer.prepare(checkpoint_id)
            elif isinstance(processor, KeyedProcessor) and processor.chains is not None:
                chains = processor.chains
                state = processor.state
                changed = processor.take_changes()
                try:
                    capture_keyed(capture, chains, state.groups(), state.arrivals, changed)
                except BaseException:
                    chains.broken.update(state.arrivals)  # its changes are no longer noted
                    raise
        except Exception as exc:
            error = f"task {tid!r} could not capture its state: {type(exc).__name__}: {exc}"
            send(CheckpointFailed(self.job_id, tid, checkpoint_id, error))
            return
        if chains is None:  # nothing to write: its part is in the ack
            part = {"groups": {}, "position": capture.position, "sink": capture.sink}
            send(CheckpointAck(self.job_id, tid, checkpoint_id, part, 0, 0))
            return
        send(CheckpointCaptured(self.job_id, tid, checkpoint_id))
        loop = asyncio.get_running_loop()
        broken = chains.broken

        def on_broken(groups: Iterable[int]) -> None:  # on the writer's thread
            loop.call_soon_threadsafe(broken.update, list(groups))

        written = self.worker.checkpoint_writer.submit(capture, on_broken)
        self.worker.background(self._ack_when_written(capture, written))

    async def _ack_when_written(self, capture: Capture, written: Future) -> None:
        try:
            part, nbytes, size = await asyncio.wrap_future(written)
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            self.worker.send(
                CheckpointFailed(self.job_id, capture.task, capture.checkpoint_id, error)
            )
            return
        self.worker.send(
            CheckpointAck(self.job_id, capture.task, capture.checkpoint_id, part, nbytes, size)
        )

    def commit_checkpoint(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: the sinks here commit what they
        prepared at it or before (a sink that cannot is logged; its next commit, or a
        recovery's restore, commits it), and the sources tell their readers the position
        it recorded (to acknowledge upstream)."""
        for task in self.tasks.values():
            if isinstance(task, SourceTask):
                try:
                    task.committed(checkpoint_id)
                except Exception as exc:
                    logger.warning("task %s: checkpoint %s not acknowledged upstream: %s",
                                   task.task_id, checkpoint_id, exc)  # fmt: skip
                continue
            processor = task.processor if isinstance(task, StreamTask) else None
            if isinstance(processor, SinkProcessor):
                try:
                    processor.commit(checkpoint_id)
                except Exception as exc:
                    logger.warning(
                        "task %s: checkpoint %s not committed yet: %s",
                        task.task_id,
                        checkpoint_id,
                        exc,
                    )

    def discover_partitions(self) -> None:
        """Every ``discovery_interval_s`` of each partitioned source whose first task runs
        here: list its partitions off the loop and tell the coordinator of those no task
        reads (``partitions_found``), until a change gives them out. Called about once a
        second by the worker."""
        now = time.monotonic()
        for op in self.graph.operators:
            interval = getattr(op.logic, "discovery_interval_s", None)
            if op.partitions is None or not interval or op.name in self._discovering:
                continue
            task = self.tasks.get(f"{op.name}-0")
            if task is None or task.status != TaskStatus.RUNNING:
                continue
            if now < self._discover_at.get(op.name, 0.0):
                continue
            self._discover_at[op.name] = now + float(interval)
            self._discovering.add(op.name)
            self.worker.background(self._discover(op))

    async def _discover(self, op: OperatorSpec) -> None:
        try:
            names = await asyncio.to_thread(op.logic.partitions)
        except Exception as exc:
            logger.warning("source %s could not list its partitions: %s", op.name, exc)
            return
        finally:
            self._discovering.discard(op.name)
        layout = self.layout
        read = {p for t in layout.tasks_of(op.name) for p in layout.partitions.get(t, ())}
        found = tuple(p for p in names if p not in read)
        if found:
            self.worker.send(PartitionsFound(self.job_id, op.name, found))

    def behind(self) -> bool:
        """True while a running task here has input waiting for it."""
        return any(
            isinstance(t, StreamTask) and t.status == TaskStatus.RUNNING and t.gate.has_ready()
            for t in self.tasks.values()
        )

    async def stop(self) -> None:
        for work in [*self.stage_work, *self._connecting.values()]:
            work.cancel()
        pending = self.pending
        if pending is not None:
            if pending.precopy is not None:
                pending.precopy.cancel()
            for task in pending.new_tasks.values():
                task.close()
        for task in self.tasks.values():
            await task.stop()
        for link in [*self.links.values(), *self.state_links.values()]:
            await link.close()
        for key in list(self.inputs):
            self.unregister_input(key)

    def settle(self) -> None:
        """A change is over here: let go of what the job no longer needs here. The links to
        workers that host none of its tasks now (they carried channels to tasks that left
        those workers, or state) close once their peers have read them; if none of the
        job's tasks is left here, all of its links do and the worker forgets the job."""
        hosts = set(self.layout.workers_used()) if self.tasks else set()
        for links in (self.links, self.state_links):
            for wid in [w for w, link in links.items() if w not in hosts and not link.in_use()]:
                self.worker.background(links.pop(wid).finish())
        if not self.tasks:
            self.worker.forget(self)
