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

Fluid mode (``prepare(..., fluid=True)``, DESIGN section 3) pauses key groups rather than
tasks: a keyed task whose only change is which key groups it owns
(:func:`~runtime.layout.in_place_owners`) acks the barrier without pausing. What it gives
away is shipped while it goes on with the rest, hottest groups first; records of a group
it gains wait for that group's state alone and are processed as it arrives, in the
task's own loop. A new keyed task, or a keyed task's new instance on another worker,
starts at the update the same way, before its state has come. Only upstream tasks (whose
routing swaps), the old instances of tasks that move or stop, and tasks whose logic
changes pause.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from . import protocol
from .channels import (
    InputChannel,
    InputGate,
    LocalOutputChannel,
    OutputChannel,
    PeerLink,
    RemoteOutputChannel,
)
from .dataflow import JobGraph, OperatorSpec
from .handover import send_state
from .keygroups import key_group_fn
from .layout import Layout, affected_tasks, in_place_owners, split_task_id, sync_only_tasks
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


class JobRuntime:
    """The tasks of one job that run on this worker, and their channels."""

    def __init__(self, worker: Worker, msg: dict[str, Any]) -> None:
        self.worker = worker
        self.job_id: str = msg["job_id"]
        self.graph: JobGraph = pickle.loads(msg["graph"])
        self.layout = Layout.from_wire(msg["layout"])
        self.peers: dict[str, tuple[str, int]] = {
            w: (a[0], int(a[1])) for w, a in msg["workers"].items()
        }
        config = dict(msg.get("config", {}))
        self.batch_size = int(config.get("batch_size", 512))
        self.linger_s = float(config.get("linger_s", 0.005))
        self.credits = int(config.get("credits", 8))
        self.tasks: dict[str, BaseTask] = {}
        self.inputs: dict[str, InputChannel] = {}
        self.links: dict[str, PeerLink] = {}
        self.start_time = 0.0
        self.pending: _Pending | None = None
        self.savepoint_id: int | None = None
        self.restore: dict[str, dict] = dict(msg.get("restore") or {})

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
        self.inputs.pop(key, None)
        if self.worker.inputs.get(key) is not None:
            del self.worker.inputs[key]

    def _input_keys(self, task: str, layout: Layout) -> list[tuple[str, str, Callable | None]]:
        op = self.graph.operator(split_task_id(task)[0])
        return [
            (protocol.channel_key(self.job_id, u, task), u, inp.key)
            for inp in op.inputs
            for u in layout.upstream_tasks(self.graph, task, inp)
        ]

    async def _link(self, worker_id: str) -> PeerLink:
        link = self.links.get(worker_id)
        if link is None:
            host, port = self.peers[worker_id]
            link = await PeerLink.connect(worker_id, host, port, self.me, self.worker.secret)
            link.on_error = lambda exc, w=worker_id: self.worker.peer_failed(self, w, exc)
            self.links[worker_id] = link
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
            gate = InputGate()
            for _key, u, key_fn in self._input_keys(tid, self.layout):
                gate.add(self._register_input(u, tid, key_fn))
            gates[tid] = gate
        for tid in local:
            self.tasks[tid] = await self._make_task(tid, self.layout, gates[tid])
        for tid, entry in self.restore.items():  # a restart from a snapshot
            task = self.tasks[tid]
            groups = dict(entry.get("groups") or {})
            if (
                groups
                and isinstance(task, StreamTask)
                and isinstance(task.processor, KeyedProcessor)
            ):
                for g, data in groups.items():
                    task.processor.state.import_group(int(g), data)

    def start(self, start_time: float) -> None:
        self.start_time = start_time
        for tid, task in self.tasks.items():
            position = self.restore.get(tid, {}).get("position")
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
        msg: dict[str, Any] = {"type": "snapshot", "job_id": self.job_id, "task": task.task_id}
        if isinstance(task, SourceTask) and task.reader is not None:
            msg["position"] = task.reader.position()
        elif isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
            state = task.processor.state
            msg["groups"] = {g: state.export_group(g) for g in state.owned()}
        elif isinstance(task, StreamTask) and isinstance(task.processor, SinkProcessor):
            task.processor.close()
        msg["metrics"] = task.snapshot_metrics()  # its last counts: the task stops here
        self.worker.send(msg)

    def inject(self, barrier: Barrier) -> None:
        for task in self.tasks.values():
            if isinstance(task, SourceTask):
                task.inject(barrier)

    async def stop(self) -> None:
        pending = self.pending
        if pending is not None:
            for task in pending.new_tasks.values():
                task.close()
        for task in self.tasks.values():
            await task.stop()
        for link in self.links.values():
            await link.close()
        for key in list(self.inputs):
            self._unregister_input(key)

    # -- reconfiguration ---------------------------------------------------------------------

    def barrier_aligned(self, task: BaseTask, barrier: Barrier) -> bool:
        """True if ``task`` must pause for the pending reconfiguration's update."""
        p = self.pending
        if barrier.kind is not BarrierKind.RECONFIG or p is None or barrier.id != p.barrier_id:
            return False
        tid = task.task_id
        if tid not in p.affected:
            return False
        self.worker.send({"type": "paused", "job_id": self.job_id, "rid": p.rid, "task": tid})
        if tid in p.sync_only:  # it has taken in all a moving upstream task sent before
            return False
        if tid in p.in_place:  # fluid: only the key groups it gains wait, for their state
            _keyed(task).await_groups(p.layout.assignment[tid])
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
    ) -> None:
        """Step 1: get ready for ``layout`` without changing anything that runs."""
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
        p.sync_only = sync_only_tasks(self.graph, self.layout, layout) & p.affected
        if fluid:
            p.in_place = {
                t
                for t in in_place_owners(self.graph, self.layout, layout) & p.affected
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
                gate = InputGate()
                for key, _u, _k in self._input_keys(tid, layout):
                    gate.add(self.inputs[key])
                p.new_tasks[tid] = await self._make_task(tid, layout, gate)
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

    def abort(self, rid: int) -> None:
        """Undo a prepared reconfiguration; paused tasks resume on the old configuration."""
        p = self.pending
        if p is None or p.rid != rid:
            return
        self.pending = None
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
        old = self.layout
        involved = sorted(
            t
            for t in p.affected
            if old.placement.get(t) == self.me or p.layout.placement.get(t) == self.me
        )
        results = await asyncio.gather(
            *(self._update_task(p, old, tid) for tid in involved), return_exceptions=True
        )
        errors = [
            f"{tid}: {r}"
            for tid, r in zip(involved, results, strict=True)
            if isinstance(r, BaseException)
        ]
        self.layout = p.layout
        self.pending = None
        p.finished.set()
        if errors:
            raise ReconfigError("; ".join(errors))

    async def _update_task(self, p: _Pending, old: Layout, tid: str) -> None:
        new = p.layout
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
        task.outputs.set_edges(await self._edges(task.op, tid, new, task.outputs.channel_map()))
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
        async for g, data in self.worker.state.arrivals(p.rid, task.task_id, expected):
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
        self, p: _Pending, tid: str, pause_s: float, t0: float, final_metrics: dict | None = None
    ) -> None:
        msg = {
            "type": "updated",
            "job_id": self.job_id,
            "rid": p.rid,
            "task": tid,
            "pause_ms": round(pause_s * 1000, 3),
            "update_ms": round((time.perf_counter() - t0) * 1000, 3),
        }
        if final_metrics is not None:
            msg["metrics"] = final_metrics  # the last counts of a task that left this worker
        self.worker.send(msg)

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
        state = task.processor.state
        kept = set() if everything else set(new.assignment.get(tid, ()))
        op_tasks = new.tasks_of(task.op.name)
        owner_of = {g: t for t in op_tasks for g in new.assignment.get(t, ())}
        leaving = [g for g in state.owned() if g not in kept]
        if p.fluid:  # records of these groups wait for them: the busiest go first
            counts = task.metrics.key_group_counts or []
            leaving.sort(key=lambda g: -counts[g] if g < len(counts) else 0)
        for g in leaving:
            dest = owner_of[g]
            dest_worker = new.placement[dest]
            if dest_worker == self.me:
                self.worker.state.put(p.rid, dest, g, state.group(g))  # no serialization
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
            self.worker.state.put(rid, dest, part, data)
            return
        await send_state(await self._link(dest_worker), rid, dest, part, data, raw)

    async def _ship_in(self, p: _Pending, task: BaseTask, old: Layout, new: Layout) -> Any:
        """Wait for and import the state that arrives at ``task``; returns a source position."""
        tid = task.task_id
        if isinstance(task, SourceTask):
            if old.placement.get(tid) not in (None, self.me):
                got = await self.worker.state.take(p.rid, tid, {"source"})
                return got["source"]
            return None
        if not (isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor)):
            return None
        state = task.processor.state
        have = set(state.owned()) if old.placement.get(tid) == self.me else set()
        expected = set(new.assignment.get(tid, ())) - have
        if not expected:
            return None
        got = await self.worker.state.take(p.rid, tid, expected)
        for g, data in got.items():
            if isinstance(data, bytes | bytearray):
                state.import_group(g, data)
            else:
                state.groups()[g] = data
        return None


def _keyed(task: BaseTask | None) -> KeyedProcessor | None:
    """The keyed processor of ``task``, if it has one."""
    if isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
        return task.processor
    return None


def _with_logic(op: OperatorSpec, logic: Any) -> OperatorSpec:
    return replace(op, logic=logic)
