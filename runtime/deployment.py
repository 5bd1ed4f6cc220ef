"""One job's tasks on one worker, built from the job's :class:`~runtime.layout.Layout`, and
their live reconfiguration.

The worker's part of the reconfiguration protocol (the coordinator drives the steps):

1. ``prepare(rid, barrier_id, new_layout, affected)``: create the tasks that are new here
   (idle, not started), register input channels for every channel that will exist into a
   task here (data that arrives early waits in them), load new logic, connect to new
   peers. Nothing running changes; :meth:`abort` undoes all of it.
2. Sync: when an affected task has aligned the reconfiguration barrier and forwarded it,
   :meth:`barrier_aligned` tells it to pause (the worker acks ``paused``); unaffected tasks
   go on, and so do affected tasks that change nothing themselves (downstream of a task
   that moves: they only have to have taken in what its old instance sent before the
   barrier, see :func:`~runtime.layout.sync_only_tasks`).
3. ``update(rid)``: each affected task here applies its own part and resumes at once:
   routing tables and output channels are rebuilt (channels to unchanged targets are
   kept), input channels added or removed, key groups that leave are exported and shipped
   straight to their new owner's worker (in chunks), key groups that arrive are awaited
   and imported, logic is swapped, removed tasks stop, new tasks start.

Pre-copy (``prepare(..., precopy_min_bytes=...)``, :mod:`runtime.precopy`): once prepared,
a running keyed task here whose key groups leave for a task on another worker, and come
to at least that much state, copies them ahead, coldest first, while it runs; the worker
replies ``prepared`` when that is done (or its time is up). Its update then ships only
what changed in those groups since. Nothing running changes: an abort drops the copies.

Fluid mode (``prepare(..., fluid=True)``, docs/design.md, section 3) pauses key groups rather than
tasks: a keyed task whose only change is which key groups it owns
(:func:`~runtime.layout.in_place_owners`) acks the barrier without pausing. What it gives
away is shipped while it goes on with the rest, hottest groups first; records of a group
it gains wait for that group's state alone and are processed as it arrives, in the
task's own loop. A new keyed task, or a keyed task's new instance on another worker,
starts at the update the same way, before its state has come. Only upstream tasks (whose
routing swaps), the old instances of tasks that move or stop, and tasks whose logic
changes pause.

A fluid change can come in *stages* (``prepare(..., stages=...)``): the update makes the
first layout; each later one only moves key groups and starts with its own barrier
(:meth:`JobRuntime.stage`), which the tasks routing to the moving groups' owners emit
themselves, swapping their owner tables as they do; a task that gives key groups ships
them once it has aligned that barrier, one that gains them has their records wait from
then on. Nobody pauses, and a stage costs one barrier hop instead of a prepare, a sync
and an update. A stage may start before the one before it is done here (the coordinator
keeps a few under way, moving different key groups): each task does its parts in the
order of the barriers, and the worker reports the stages done in order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from . import handshake, precopy, protocol
from .channels import (
    InputChannel,
    InputGate,
    LocalOutputChannel,
    OutputChannel,
    PeerLink,
    RemoteOutputChannel,
)
from .dataflow import JobGraph, OperatorSpec
from .handover import IdleBudget, send_state, ships_within
from .keygroups import key_group_fn
from .layout import Layout, affected_tasks, in_place_owners, split_task_id, sync_only_tasks
from .messages import (
    ChannelConfig,
    Paused,
    Restore,
    Snapshot,
    StageDone,
    Updated,
    UpdateFailed,
)
from .metrics import TaskMetrics
from .operators import KeyedProcessor, SinkProcessor, make_processor
from .partitioning import BroadcastEdge, Edge, ForwardEdge, KeyGroupEdge, Outputs, RebalanceEdge
from .records import Barrier, BarrierKind
from .state import KeyedState
from .task import BaseTask, SourceTask, StreamTask

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["JobRuntime", "ReconfigError"]

logger = logging.getLogger(__name__)

# The copy ahead stops early for a pause budget (see JobRuntime._precopy) only once this
# much has gone, so that the rate it estimates the rest's shipping time from is measured.
PRECOPY_RATE_MIN_BYTES = 4 << 20
# Copies ahead one receiving worker may have unread before the next waits (it reads them
# at its idle moments), and for how long at most: the receiver reads at least one copy in
# that time (Worker.caught_up waits as long), so a longer wait means it has dropped them.
PRECOPY_WINDOW = 2
PRECOPY_ROOM_WAIT_S = 0.05


class ReconfigError(RuntimeError):
    """A reconfiguration step that cannot be carried out on this worker."""


@dataclass
class _Pending:
    """A prepared reconfiguration on this worker."""

    rid: int
    barrier_id: int
    layout: Layout
    affected: set[str]
    new_tasks: dict[str, BaseTask] = field(default_factory=dict)
    new_inputs: dict[str, InputChannel] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    fluid: bool = False
    in_place: set[str] = field(default_factory=set)  # keyed tasks that do not pause (fluid)
    sync_only: set[str] = field(default_factory=set)  # tasks that only align the barrier
    updating: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    # Fluid stages (see JobRuntime.stage): the layout after each (the last is ``layout``),
    # each later stage's barrier id, the tasks here each stage involves and, per task, the
    # last stage it has a part in (it reports then).
    stages: list[Layout] = field(default_factory=list)
    stage_of: dict[int, int] = field(default_factory=dict)  # barrier id -> stage
    involved: list[set[str]] = field(default_factory=list)
    last_stage: dict[str, int] = field(default_factory=dict)
    announced: set[int] = field(default_factory=set)  # later stages started here
    done: dict[int, set[str]] = field(default_factory=dict)  # stage -> tasks whose part began
    completed: dict[int, set[str]] = field(default_factory=dict)  # ... and ended
    reported: set[int] = field(default_factory=set)  # stages reported done from here
    pause_s: dict[str, float] = field(default_factory=dict)
    t_update: float = 0.0
    # Pre-copy: the key groups copied ahead, by (task, group), with what their delta needs
    # (see runtime.precopy); the copying under way, and a flag that stops it after a group.
    precopied: dict[tuple[str, int], dict | None] = field(default_factory=dict)
    precopy: asyncio.Task | None = None
    precopy_stop: bool = False

    @property
    def first(self) -> Layout:
        """The layout the update (stage 0) makes: the whole change unless staged."""
        return self.stages[0] if self.stages else self.layout


class JobRuntime:
    """The tasks of one job that run on this worker, and their channels."""

    def __init__(
        self,
        worker: Worker,
        job_id: str,
        graph: bytes,
        layout: Layout,
        peers: Mapping[str, tuple[str, int]],
        config: ChannelConfig,
        restore: Mapping[str, Restore] | None = None,
    ) -> None:
        """The job ``job_id`` here, as a ``deploy`` (or a ``prepare`` that makes this worker
        join it) describes it: ``graph`` pickled (its code installed already), every
        worker's data address, and per task what it restarts from (:meth:`deploy`)."""
        self.worker = worker
        self.job_id = job_id
        self.graph: JobGraph = pickle.loads(graph)
        self.layout = layout
        self.peers: dict[str, tuple[str, int]] = dict(peers)
        self.batch_size = config.batch_size
        self.linger_s = config.linger_s
        self.credits = config.credits
        self.tasks: dict[str, BaseTask] = {}
        self.inputs: dict[str, InputChannel] = {}
        self.links: dict[str, PeerLink] = {}
        # Key-group state goes to a peer on a connection of its own, so that data frames
        # never queue behind it (a copy ahead is sent while the tasks run).
        self.state_links: dict[str, PeerLink] = {}
        self.start_time = 0.0
        self.pending: _Pending | None = None
        # A staged change this worker was done with before the change ended (its tasks had
        # no part in the later stages): cut short, it must still end here where it ended.
        self.ended_early: _Pending | None = None
        self.savepoint_id: int | None = None
        self.restore: dict[str, Restore] = dict(restore or {})
        self._stage_work: set[asyncio.Future] = set()  # key groups moving in a fluid stage
        self._connecting: dict[tuple[str, bool], asyncio.Future[PeerLink]] = {}

    @property
    def me(self) -> str:
        return self.worker.worker_id

    def local_task_ids(self, layout: Layout) -> list[str]:
        return [t for t, w in layout.placement.items() if w == self.me]

    # -- building ----------------------------------------------------------------------------

    def _register_input(self, upstream: str, task: str, key_fn: Callable | None) -> InputChannel:
        key = protocol.channel_key(self.job_id, upstream, task)
        ch = self.inputs.get(key)
        if ch is None:
            ch = InputChannel(key, upstream, key_fn)
            self.inputs[key] = ch
            self.worker.inputs[key] = ch
        return ch

    def _unregister_input(self, key: str) -> None:
        """Forget input channel ``key``, here and in the worker's registry if it is ours
        there (a runtime of the job made after this one was forgotten has its own)."""
        ch = self.inputs.pop(key, None)
        if ch is not None and self.worker.inputs.get(key) is ch:
            del self.worker.inputs[key]

    def _input_keys(self, task: str, layout: Layout) -> list[tuple[str, str, Callable | None]]:
        op = self.graph.operator(split_task_id(task)[0])
        return [
            (protocol.channel_key(self.job_id, u, task), u, inp.key)
            for inp in op.inputs
            for u in layout.upstream_tasks(self.graph, task, inp)
        ]

    async def _link(self, worker_id: str, state: bool = False) -> PeerLink:
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

    def _mailbox(self, task: str) -> str:
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
                raise ReconfigError(f"no input channel {key} on worker {self.me}")
            return LocalOutputChannel(key, dst, self.credits, receiver)
        return RemoteOutputChannel(key, dst, self.credits, await self._link(target_worker))

    async def _edges(
        self, op: OperatorSpec, tid: str, layout: Layout, reuse: dict[str, OutputChannel]
    ) -> list[Edge]:
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
                        down.name, chans, inp.key, key_group_fn(down.max_parallelism), owner
                    )
                )
        return edges

    async def _make_task(self, tid: str, layout: Layout, gate: InputGate) -> BaseTask:
        op = self.graph.operator(split_task_id(tid)[0])
        index = split_task_id(tid)[1]
        outputs = Outputs(await self._edges(op, tid, layout, {}), self.batch_size, self.linger_s)
        metrics = TaskMetrics(op.max_parallelism if op.keyed else 0, sink=op.kind == "sink")
        logic = layout.logic_of(op, tid)
        if logic is not op.logic:
            op = _with_logic(op, logic)
        task: BaseTask
        if op.kind == "source":
            task = SourceTask(tid, op, index, outputs, metrics, self.worker)
        else:
            state = KeyedState(tid, layout.assignment.get(tid, ())) if op.keyed else None
            processor = make_processor(tid, op, index, outputs, metrics, state)
            task = StreamTask(tid, op, index, outputs, metrics, self.worker, gate, processor)
        task.job_id = self.job_id  # type: ignore[attr-defined]
        return task

    async def deploy(self) -> None:
        """Create this worker's tasks and their channels (inputs first: local outputs need them)."""
        local = sorted(self.local_task_ids(self.layout))
        gates: dict[str, InputGate] = {}
        for tid in local:
            gate = InputGate(on_dry=self.worker.task_ran_dry)
            for _key, u, key_fn in self._input_keys(tid, self.layout):
                gate.add(self._register_input(u, tid, key_fn))
            gates[tid] = gate
        for tid in local:
            self.tasks[tid] = await self._make_task(tid, self.layout, gates[tid])
        for tid, entry in self.restore.items():  # a restart from a snapshot
            task = self.tasks[tid]
            if (
                entry.groups
                and isinstance(task, StreamTask)
                and isinstance(task.processor, KeyedProcessor)
            ):
                for g, data in entry.groups.items():
                    task.processor.state.import_group(g, data)

    def start(self, start_time: float) -> None:
        self.start_time = start_time
        for tid, task in self.tasks.items():
            entry = self.restore.get(tid)
            position = None if entry is None else entry.position
            if isinstance(task, SourceTask):
                task.start(start_time, position, len(self.layout.tasks_of(task.op.name)))
            else:
                task.start(start_time)
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

    async def stop(self) -> None:
        for work in [*self._stage_work, *self._connecting.values()]:
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
            self._unregister_input(key)

    # -- reconfiguration ---------------------------------------------------------------------

    def barrier_aligned(self, task: BaseTask, barrier: Barrier) -> bool:
        """True if ``task`` must pause for the pending reconfiguration's update."""
        p = self.pending
        if barrier.kind is not BarrierKind.RECONFIG or p is None:
            return False
        if barrier.id in p.stage_of:
            self._stage_aligned(p, p.stage_of[barrier.id], task)
            return False
        if barrier.id != p.barrier_id:
            return False
        tid = task.task_id
        if tid not in p.affected:
            return False
        self.worker.send(Paused(self.job_id, p.rid, tid))
        if tid in p.sync_only:  # it has taken in all a moving upstream task sent before
            return False
        if p.stages and tid not in p.involved[0]:  # its part comes in a later stage
            return False
        if tid in p.in_place:  # fluid: only the key groups it gains wait, for their state
            _keyed(task).await_groups(p.first.assignment[tid])
            return False
        p.paused.add(tid)
        return True

    async def prepare(
        self,
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
        its barrier (``stage_barriers``, one per later stage, see :meth:`stage`).
        ``precopy_min_bytes``: start copying ahead the key groups that leave a task here for
        another worker in the update when they come to at least that much state (None:
        never), for at most ``precopy_budget_s`` and until what is left would ship within
        ``precopy_pause_s`` (see :meth:`_precopy`); :meth:`precopying` gives the copying."""
        if self.pending is not None and self.pending.updating:
            # The previous update's last task has reported; let its bookkeeping finish.
            await self.pending.finished.wait()
        if self.pending is not None:
            raise ReconfigError(f"reconfiguration {self.pending.rid} is still pending here")
        own = affected_tasks(self.graph, self.layout, layout)
        missing = sorted(own - affected)
        if missing:
            raise ReconfigError(f"tasks {missing} change but are not in the affected set")
        for tid in affected:
            task = self.tasks.get(tid)
            if task is not None and task.status != "running":
                raise ReconfigError(f"task {tid} is {task.status}; only running tasks can change")
        self.peers.update(peers)
        p = _Pending(rid, barrier_id, layout, set(affected), fluid=fluid)
        if stages and len(stages) > 1:
            if stages[-1] != layout or len(stage_barriers or ()) != len(stages) - 1:
                raise ReconfigError("stages must end at the layout, one barrier per later stage")
            p.stages = list(stages)
            p.stage_of = {b: k for k, b in enumerate(stage_barriers or (), start=1)}
            before = [self.layout, *stages[:-1]]
            p.involved = [
                affected_tasks(self.graph, a, b) for a, b in zip(before, stages, strict=True)
            ]
            for k, tasks in enumerate(p.involved):
                p.last_stage.update(dict.fromkeys(tasks, k))
        p.sync_only = sync_only_tasks(self.graph, self.layout, p.first) & p.affected
        if fluid:
            p.in_place = {
                t
                for t in in_place_owners(self.graph, self.layout, p.first) & p.affected
                if _keyed(self.tasks.get(t)) is not None
            }
        try:
            # Input channels for every channel into a task here that does not exist yet.
            for tid in self.local_task_ids(layout):
                for key, u, key_fn in self._input_keys(tid, layout):
                    if key not in self.inputs:
                        p.new_inputs[key] = self._register_input(u, tid, key_fn)
            # New tasks here (including tasks moving in), idle until their update.
            for tid in self.local_task_ids(layout):
                if tid in self.tasks:
                    continue
                gate = InputGate(on_dry=self.worker.task_ran_dry)
                for key, _u, _k in self._input_keys(tid, layout):
                    gate.add(self.inputs[key])
                # Made for the first stage: a task new in a staged change owns no key group
                # it gains in a later stage until that group's state has come.
                p.new_tasks[tid] = await self._make_task(tid, p.first, gate)
            for tid, data in layout.logic.items():
                if layout.placement.get(tid) == self.me and data != self.layout.logic.get(tid):
                    pickle.loads(data)  # the new logic must load here
        except BaseException:
            for key in p.new_inputs:
                self._unregister_input(key)
            for task in p.new_tasks.values():
                task.close()
            raise
        self.pending = p
        self.ended_early = None  # the change before has ended everywhere
        if precopy_min_bytes is not None:
            moves = self._precopy_moves(p, precopy_min_bytes)
            if moves:
                p.precopy = asyncio.ensure_future(
                    self._precopy(p, moves, precopy_budget_s, precopy_pause_s)
                )

    def precopying(self, rid: int) -> asyncio.Task | None:
        """The copying ahead that prepared reconfiguration ``rid`` started here, if any; it
        returns what it copied (``ms``, ``bytes``, ``groups``)."""
        p = self.pending
        return p.precopy if p is not None and p.rid == rid else None

    def _precopy_moves(self, p: _Pending, min_bytes: int) -> list[tuple[str, int, str, str, int]]:
        """(task, key group, new owner, its worker, its size as last measured) for each key
        group that a running task here gives to a task on another worker in the update,
        for the tasks whose leaving state comes to at least ``min_bytes``; coldest groups
        first, since keys touched after their copy are sent again."""
        moves: list[tuple[str, int, str, str, int]] = []
        for tid in sorted(p.affected & self.tasks.keys()):
            task = self.tasks[tid]
            processor = _keyed(task)
            if processor is None or task.status != "running":
                continue
            owner_of = _owners(p.first, task.op.name)
            away = [
                (g, owner_of[g])
                for g in processor.state.owned()
                if p.first.placement[owner_of[g]] != self.me
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
            moves += [(tid, g, dest, p.first.placement[dest], sizes.get(g, 0)) for g, dest in away]
        return moves

    async def _precopy(
        self,
        p: _Pending,
        moves: list[tuple[str, int, str, str, int]],
        budget_s: float,
        pause_s: float = 0.0,
    ) -> dict[str, Any]:
        """Copy each of ``moves`` ahead, in order, to its new owner's worker while the tasks
        run, until all are copied, the copying is stopped (an abort), ``budget_s`` has
        passed, or what is left would ship within ``pause_s`` at the pace the copies went
        so far, on this end and at the receivers (:func:`~runtime.handover.ships_within`:
        the stop-and-copy point of a virtual machine's live migration, QEMU's downtime
        limit); what is not copied goes whole in the update. It goes at idle
        priority: each group once the tasks here have caught up with their input
        (:meth:`Worker.caught_up`), so that a record waits at most for one group's copy
        (about a millisecond per 1.5 MB here), and for ``PRECOPY_IDLE_BUDGET_S`` in all
        (:class:`~runtime.handover.IdleBudget`); the receiver reads the copies the same way
        (:meth:`StateInbox.read_copies`), and paces the copying: at most
        ``PRECOPY_WINDOW`` copies go to a worker that has not read them
        (:meth:`PeerLink.copy_room`)."""
        t0 = time.perf_counter()
        sent = 0
        sending_s = 0.0  # spent pickling and writing the copies, idle waits left out
        left = sum(size for *_, size in moves)
        idle = IdleBudget(p.rid)  # waits for the tasks here to catch up with their input
        room = 0.0  # for the receiver to read the copies it has
        try:
            for tid, g, dest, dest_worker, size in moves:
                link = await self._link(dest_worker, state=True)
                t_room = time.perf_counter()
                await link.copy_room(p.rid, PRECOPY_WINDOW, PRECOPY_ROOM_WAIT_S)
                room += time.perf_counter() - t_room
                await idle.wait(self.worker.caught_up)
                if p.precopy_stop or time.perf_counter() - t0 > budget_s:
                    break
                if sent >= PRECOPY_RATE_MIN_BYTES and ships_within(
                    left, pause_s, sent, sending_s, *self._copies_read(p.rid)
                ):
                    break  # the rest ships within the pause: copying on only delays the change
                processor = _keyed(self.tasks.get(tid))
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
            for link in self.state_links.values():
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

    def _copies_read(self, rid: int) -> tuple[int, float]:
        """(bytes, seconds) of the copies ahead of ``rid`` read so far by the workers they
        went to, and the seconds those said reading them took."""
        read = [link.copies_read(rid) for link in self.state_links.values()]
        return sum(b for b, _ in read), sum(s for _, s in read)

    def behind(self) -> bool:
        """True while a running task here has input waiting for it."""
        return any(
            isinstance(t, StreamTask) and t.status == "running" and t.gate.has_ready()
            for t in self.tasks.values()
        )

    def abort(self, rid: int) -> None:
        """Undo a prepared reconfiguration; paused tasks resume on the old configuration."""
        p = self.pending
        if p is None or p.rid != rid:
            return
        self.pending = None
        p.precopy_stop = True  # the copying ahead stops after the group it is sending
        for tid, g in p.precopied:
            processor = _keyed(self.tasks.get(tid))
            if processor is not None:
                processor.untrack(g)
        p.precopied.clear()
        for tid in p.in_place:
            processor = _keyed(self.tasks.get(tid))
            if processor is not None and processor.cancel_awaiting():
                logger.error("task %s had records of key groups it was to gain", tid)
        for task in self.tasks.values():
            if isinstance(task, SourceTask):
                task.abort_barrier(p.barrier_id)
            elif isinstance(task, StreamTask):
                pending = task.aligner.pending
                task.aligner.abort(p.barrier_id)  # late arrivals of it are ignored from now on
                if pending is not None and pending.id == p.barrier_id:
                    task.gate.unblock_all()
        for key in p.new_inputs:
            self._unregister_input(key)
        for task in p.new_tasks.values():
            task.close()
        for tid in p.paused:
            task = self.tasks.get(tid)
            if task is not None:
                task.resume()
        self.worker.state.drop(rid)

    def update_received(self, rid: int) -> None:
        """The update of ``rid`` has arrived and will run: a prepare read after it (the next
        step of a fluid plan, sent as soon as the workers with tasks in this one are done)
        waits for it instead of finding the reconfiguration still pending."""
        if self.pending is not None and self.pending.rid == rid:
            self.pending.updating = True

    async def update(self, rid: int) -> None:
        """Step 3: every affected task here applies its part and resumes independently."""
        p = self.pending
        if p is None or p.rid != rid:
            raise ReconfigError(f"update {rid} without a matching prepare")
        p.updating = True
        if p.precopy is not None:  # done by now: the worker replied prepared after it
            p.precopy_stop = True
            await asyncio.wait({p.precopy})
        p.t_update = time.perf_counter()
        old, new = self.layout, p.first
        involved = sorted(
            t
            for t in (p.involved[0] if p.stages else p.affected)
            if old.placement.get(t) == self.me or new.placement.get(t) == self.me
        )
        results = await asyncio.gather(
            *(self._update_task(p, old, new, tid) for tid in involved), return_exceptions=True
        )
        errors = [
            f"{tid}: {r}"
            for tid, r in zip(involved, results, strict=True)
            if isinstance(r, BaseException)
        ]
        if p.stages and not errors:
            p.done[0] = set(involved)
            self._stage_finished(p, 0)
        else:
            self.layout = p.layout
            self.pending = None
            p.finished.set()
        if errors:
            raise ReconfigError("; ".join(errors))
        if not p.stages:
            self._settle()

    # -- fluid stages ------------------------------------------------------------------------

    def stage(self, rid: int, k: int, barrier_id: int, inject: list[str]) -> None:
        """Stage ``k`` of a staged fluid reconfiguration starts (every worker is done with
        the one before): key groups move from ``stages[k - 1]`` to ``stages[k]`` while
        everything runs. The barrier starts at ``inject`` (tasks here that route to the
        tasks whose key groups move, or sources); each task with a part in the stage does
        it when it aligns the barrier: a router swaps its owner table, a task that gives
        key groups ships them, one that gains them has their records wait for them. A task
        that has ended does its part at once. The worker reports ``stage_done`` when its
        tasks are done with the stage and it has reported the earlier stages it was told
        of. Stage ``k`` may start while earlier ones are under way here."""
        p = self.pending
        if p is not None and p.rid == rid and p.stages and k < len(p.stages):
            p.announced.add(k)
            p.done.setdefault(k, set())
            for tid in sorted(p.involved[k] & self.tasks.keys()):
                task = self.tasks[tid]
                if task.status != "running" and tid not in p.done[k]:
                    self._stage_ended_task(p, k, task)
        barrier = Barrier(BarrierKind.RECONFIG, barrier_id)
        for tid in inject:
            task = self.tasks.get(tid)
            if task is not None and task.status == "running":
                task.inject(barrier)  # type: ignore[attr-defined]
        if p is None or p.rid != rid or not p.stages:
            self.worker.send(StageDone(self.job_id, rid, k))
        else:
            self._stage_check(p)

    def withdraw_stage(self, rid: int, k: int, barrier_id: int, inject: list[str]) -> bool:
        """Stage ``k`` took too long: withdraw its barrier from the tasks here that were to
        start it. True if none of them had emitted it and no task here has done its part
        (an ended task does it at once): then nothing of the stage happened here, and
        nothing will unless :meth:`stage` is called again (the stage goes on after all)."""
        p = self._staged(rid)
        ours = p is not None
        clean = not (ours and p.done.get(k))  # type: ignore[union-attr]
        for tid in inject:
            task = self.tasks.get(tid)
            if isinstance(task, StreamTask):
                clean = task.withdraw(barrier_id) and clean
            elif task is not None and task.status == "running":
                clean = False  # a source: its barrier may be on its way
        if ours:  # no part of stage k starts now (later ones were withdrawn before it)
            p.announced = {j for j in p.announced if j < k}  # type: ignore[union-attr]
        return clean

    def end_stages(self, rid: int, last: int) -> None:
        """The reconfiguration ends at stage ``last`` (a later one was withdrawn before it
        started anywhere): tasks with a part in later stages report now. A worker that
        was done with the change already takes the job to be on stage ``last`` too."""
        p = self._staged(rid)
        if p is None:
            return
        if p is self.ended_early:
            self.ended_early = None
            self.layout = p.stages[last]
            return
        for tid in sorted(self.tasks):
            if p.last_stage.get(tid, 0) > last:
                p.last_stage[tid] = last
                self._report(p, tid, 0.0, p.t_update, last=True)
        p.stages = p.stages[: last + 1]
        p.layout = p.stages[-1]
        self.layout = p.layout
        self.pending = None
        p.finished.set()
        self._settle()

    def task_ended(self, task: BaseTask) -> None:
        """A task here ended; if a stage under way still expects its part, it does it now
        (it aligns no more barriers)."""
        p = self.pending
        if p is None or not p.stages:
            return
        for k in sorted(p.announced - p.reported):  # those under way
            if task.task_id in p.involved[k] and task.task_id not in p.done.setdefault(k, set()):
                self._stage_ended_task(p, k, task)

    def _stage_aligned(self, p: _Pending, k: int, task: BaseTask) -> None:
        tid = task.task_id
        if tid in p.involved[k] and tid not in p.done.setdefault(k, set()):
            self._stage_part(p, k, task, aligned=True)

    def _stage_part(self, p: _Pending, k: int, task: BaseTask, aligned: bool) -> None:
        """Do ``task``'s part of stage ``k``: swap its routing now; ship and take in key
        groups in the background (records of gained groups wait from now on)."""
        tid = task.task_id
        prev, nxt = p.stages[k - 1], p.stages[k]
        p.done[k].add(tid)
        for edge in task.outputs.edges:
            if isinstance(edge, KeyGroupEdge):
                down = self.graph.operator(edge.operator)
                edge.set_owner(nxt.owner_table(down, [ch.target for ch in edge.channels]))
        processor = _keyed(task)
        if processor is None or prev.assignment.get(tid) == nxt.assignment.get(tid):
            self._stage_task_done(p, k, tid)
            return
        gained = set(nxt.assignment[tid]) - set(prev.assignment[tid])
        early = sorted(g for g in gained if processor.state.owns(g))
        if early:  # its records would count on empty state, then lose it to the shipped one
            raise ReconfigError(f"task {tid} owns key groups {early[:10]} before they arrive")
        if aligned:
            processor.await_groups(gained)

        async def part() -> None:
            # An ended task takes its groups in directly: no record of them can come.
            receive = (
                self._receive_groups(p, task, gained)
                if aligned
                else self._ship_in(p, task, prev, nxt)
            )
            await asyncio.gather(self._ship_out(p, task, prev, nxt, everything=False), receive)

        def finished(fut: asyncio.Future) -> None:
            self._stage_work.discard(fut)
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                self._stage_failed(p, k, tid, exc)
                return
            self._stage_task_done(p, k, tid)

        work = asyncio.ensure_future(part())
        self._stage_work.add(work)
        work.add_done_callback(finished)

    def _stage_ended_task(self, p: _Pending, k: int, task: BaseTask) -> None:
        """The part of a task that has ended (it aligns no barrier any more): done at once,
        from the worker's control loop, which an error must not break."""
        try:
            self._stage_part(p, k, task, aligned=False)
        except Exception as exc:
            self._stage_failed(p, k, task.task_id, exc)

    def _stage_failed(self, p: _Pending, k: int, tid: str, exc: BaseException) -> None:
        error = f"worker {self.me}: {tid} in stage {k}: {exc}"
        self.worker.send(UpdateFailed(self.job_id, p.rid, error))

    def _stage_task_done(self, p: _Pending, k: int, tid: str) -> None:
        p.completed.setdefault(k, set()).add(tid)
        if p.last_stage.get(tid, 0) == k:
            self._report(p, tid, 0.0, p.t_update, last=True)
        self._stage_check(p)

    def _stage_check(self, p: _Pending) -> None:
        """Report the stages started here that are done here, in order: a stage is done
        once every task here with a part in it has done that part. A worker is told only
        of the stages it has a part in (a later one can come before an earlier one it
        was not told of is done elsewhere)."""
        while self.pending is p and (under_way := sorted(p.announced - p.reported)):
            k = under_way[0]
            if (p.involved[k] & self.tasks.keys()) - p.completed.get(k, set()):
                return
            self._stage_finished(p, k)

    def _stage_finished(self, p: _Pending, k: int) -> None:
        """Report stage ``k`` done here; after the last stage a task here has a part in,
        the reconfiguration is over on this worker."""
        p.reported.add(k)
        self.layout = p.stages[k]
        self.worker.send(StageDone(self.job_id, p.rid, k))
        if k >= max((p.last_stage.get(t, 0) for t in self.tasks), default=0):
            self.layout = p.layout
            self.pending = None
            self.ended_early = p if k < len(p.stages) - 1 else None
            p.finished.set()
            self._settle()

    def _settle(self) -> None:
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

    def _staged(self, rid: int) -> _Pending | None:
        """The staged change ``rid``, pending here or done here before it ended."""
        for p in (self.pending, self.ended_early):
            if p is not None and p.rid == rid and p.stages:
                return p
        return None

    async def _update_task(self, p: _Pending, old: Layout, new: Layout, tid: str) -> None:
        was_here = old.placement.get(tid) == self.me
        stays_here = new.placement.get(tid) == self.me
        t0 = time.perf_counter()
        if tid in p.sync_only:
            self._report(p, tid, 0.0, t0)
            return
        if tid in p.in_place:
            task = self.tasks[tid]
            gained = set(new.assignment[tid]) - set(old.assignment[tid])
            await asyncio.gather(
                self._ship_out(p, task, old, new, everything=False),
                self._receive_groups(p, task, gained),
            )
            self._report(p, tid, 0.0, t0)
            return
        if was_here and not stays_here:
            # Removed, or moving to another worker: hand everything over, then stop.
            task = self.tasks.pop(tid)
            await self._ship_out(p, task, old, new, everything=True)
            pause = task.resume()  # measured before the stop cancels the wait
            await task.stop()
            for ch in task.outputs.channels:
                ch.detach()  # its receivers stop counting on this worker for it
            if isinstance(task, StreamTask):
                for key in list(task.gate.channels):
                    self._unregister_input(key)
            self._report(p, tid, pause, t0, final_metrics=task.snapshot_metrics())
            return
        if stays_here and not was_here:
            task = p.new_tasks.pop(tid)
            processor = _keyed(task)
            if p.fluid and processor is not None:
                # A new (or moved) keyed task starts at once; its records wait for their state.
                groups = set(new.assignment[tid])
                for g in groups:
                    processor.state.drop_group(g)  # an empty placeholder: the state is coming
                processor.await_groups(groups)
                self.tasks[tid] = task
                task.start(self.start_time)
                await self._receive_groups(p, task, groups)
                self._report(p, tid, 0.0, t0)
                return
            position = await self._ship_in(p, task, old, new)
            self.tasks[tid] = task
            if isinstance(task, SourceTask):
                task.start(self.start_time, position, len(new.tasks_of(task.op.name)))
            else:
                task.start(self.start_time)
            self._report(p, tid, 0.0, t0)
            return
        task = self.tasks[tid]
        # Routing: rebuild edges, reusing channels whose target did not move.
        before = task.outputs.channels
        task.outputs.set_edges(await self._edges(task.op, tid, new, task.outputs.channel_map()))
        for ch in set(before) - set(task.outputs.channels):
            ch.detach()  # its target moved or went: the old link no longer carries it
        # Inputs: add prepared channels, remove channels of upstream tasks that are gone.
        if isinstance(task, StreamTask):
            wanted = self._input_keys_set(tid, new)
            for key in list(task.gate.channels):
                if key not in wanted:
                    task.gate.remove(key)
                    task.aligner.remove_input(key)
                    self._unregister_input(key)
            for key in wanted:
                if key not in task.gate.channels:
                    task.gate.add(self.inputs[key])
                    task.aligner.add_input(key)
        # State: ship what leaves, import what arrives.
        await self._ship_out(p, task, old, new, everything=False)
        await self._ship_in(p, task, old, new)
        # Logic.
        if new.logic.get(tid) != old.logic.get(tid) and isinstance(task, StreamTask):
            task.processor.fn = new.logic_of(self.graph.operator(task.op.name), tid)
        pause = task.resume()
        self._report(p, tid, pause, t0)

    async def _receive_groups(self, p: _Pending, task: BaseTask, expected: set[int]) -> None:
        """Fluid mode: hand each key group in ``expected`` to ``task``'s loop as soon as its
        state arrives; return when all have been taken in (their waiting records done)."""
        processor = _keyed(task)
        assert isinstance(task, StreamTask) and processor is not None
        taken: list[asyncio.Future] = []
        async for g, data in self.worker.state.arrivals(
            p.rid, self._mailbox(task.task_id), expected
        ):
            taken.append(task.call_soon(functools.partial(processor.arrive, g, data)))
        if not taken:
            return
        everything = asyncio.gather(*taken)
        runner = task.runner
        if runner is not None:
            await asyncio.wait({everything, runner}, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():
            everything.cancel()
            raise ReconfigError(f"task {task.task_id} ended before its key groups arrived")
        everything.result()

    def _input_keys_set(self, tid: str, layout: Layout) -> set[str]:
        return {key for key, _u, _k in self._input_keys(tid, layout)}

    def _report(
        self,
        p: _Pending,
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
        self.worker.send(
            Updated(
                self.job_id,
                p.rid,
                tid,
                pause_ms=round(pause_s * 1000, 3),
                update_ms=round((time.perf_counter() - t0) * 1000, 3),
                metrics=final_metrics,  # the last counts of a task that left this worker
            )
        )

    async def _ship_out(
        self, p: _Pending, task: BaseTask, old: Layout, new: Layout, everything: bool
    ) -> None:
        """Send the state that leaves ``task`` to its new owners (worker to worker)."""
        tid = task.task_id
        if isinstance(task, SourceTask) and everything and task.reader is not None:
            await self._send_part(
                p.rid, tid, new.placement[tid], "source", task.reader.position(), raw=False
            )
            return
        if (
            isinstance(task, StreamTask)
            and isinstance(task.processor, SinkProcessor)
            and everything
        ):
            task.processor.close()
            return
        if not (isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor)):
            return
        processor = task.processor
        state = processor.state
        owner_of = _owners(new, task.op.name)
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
            if dest_worker == self.me:
                self.worker.state.put(p.rid, self._mailbox(dest), g, state.group(g))  # as is
            elif (tid, g) in p.precopied:  # copied ahead: only what changed since
                touched = processor.untrack(g) or ()
                delta = precopy.export_delta(state.group(g), touched, p.precopied.pop((tid, g)))
                part = precopy.part_name("delta", g)
                await self._send_part(p.rid, dest, dest_worker, part, delta, raw=True)
            else:
                await self._send_part(p.rid, dest, dest_worker, g, state.export_group(g), raw=True)
            state.drop_group(g)
            if p.fluid:
                await asyncio.sleep(0)  # the worker's running tasks go on between groups

    async def _send_part(
        self, rid: int, dest: str, dest_worker: str, part: Any, data: Any, raw: bool
    ) -> None:
        """Hand ``data`` to task ``dest``: directly on this worker, else in chunked frames.

        ``raw`` data is bytes delivered as is (exported key-group state); other data is
        msgpack-encoded on the way and decoded on arrival (a source position).
        """
        if dest_worker == self.me:
            self.worker.state.put(rid, self._mailbox(dest), part, data)
            return
        await send_state(await self._link(dest_worker, state=True), rid, dest, part, data, raw)

    async def _ship_in(self, p: _Pending, task: BaseTask, old: Layout, new: Layout) -> Any:
        """Wait for and import the state that arrives at ``task``; returns a source position."""
        tid = task.task_id
        if isinstance(task, SourceTask):
            if old.placement.get(tid) not in (None, self.me):
                got = await self.worker.state.take(p.rid, self._mailbox(tid), {"source"})
                return got["source"]
            return None
        if not (isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor)):
            return None
        state = task.processor.state
        have = set(state.owned()) if old.placement.get(tid) == self.me else set()
        expected = set(new.assignment.get(tid, ())) - have
        if not expected:
            return None
        # Each group is taken in as it arrives, while the rest are still on their way.
        async for g, data in self.worker.state.arrivals(p.rid, self._mailbox(tid), expected):
            state.take_in(g, data)
            self.worker.state.recycle(data)
        return None


def _owners(layout: Layout, operator: str) -> dict[int, str]:
    """Key group -> the task of ``operator`` that owns it in ``layout``."""
    return {g: t for t in layout.tasks_of(operator) for g in layout.assignment.get(t, ())}


def _keyed(task: BaseTask | None) -> KeyedProcessor | None:
    """The keyed processor of ``task``, if it has one."""
    if isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
        return task.processor
    return None


def _with_logic(op: OperatorSpec, logic: Any) -> OperatorSpec:
    return replace(op, logic=logic)
