"""Task loops: one asyncio task per stream task, many per worker.

A task runs until its inputs end, it fails, or it is cancelled:

1. Take the next item from the :class:`~runtime.channels.InputGate` (round-robin over
   channels that barrier alignment has not blocked).
2. A batch goes through the operator's :class:`~runtime.operators.Processor`; outputs are
   flushed by the batching policy (full batches now, everything after ``linger_s`` or
   when the input runs dry).
3. A barrier goes to the :class:`~runtime.alignment.Aligner`: the input that delivered it
   is blocked until all open inputs have; then the barrier is forwarded on every output
   channel, the host is told (it acks to the coordinator) and all inputs unblock.
4. End of stream on an input counts as aligned for later barriers; when all inputs have
   ended (and key groups the task still awaits have arrived, their records processed)
   the processor is closed, end of stream goes downstream and the host is told the task
   finished.
5. A call posted by the worker (:meth:`StreamTask.call_soon`: key-group state that
   arrived in fluid mode) runs between batches, ahead of inputs; so does a barrier the
   worker asks the task itself to start (:meth:`StreamTask.inject`: a fluid stage's
   barrier starts at the tasks whose routing it swaps), emitted after the records it
   has sent so far.

6. Processing-time timers (:mod:`runtime.timers`) fire once the wall clock passes the
   processor's ``wakeup``, checked before each item and waited for when the input is dry.
7. A :class:`~runtime.records.Watermark` goes to the task's
   :class:`~runtime.eventtime.WatermarkTracker`; when the task's watermark rises, the
   processor fires its event-time timers up to it, then the watermark is forwarded after
   what they emitted. At a reconfiguration's barrier the task forgets what its inputs
   said (they re-announce after it; see :mod:`runtime.eventtime`); after the change
   touched the task, its watermark is re-evaluated (inputs gone), sent again on new
   output channels, and timers of key groups that came are fired up to it. While the
   task awaits key groups' state (fluid mode) it holds its watermark back, forwarding
   the latest once the last has come: the records waiting for them and their timers
   emit then, and would be behind a watermark forwarded meanwhile (a window, or the
   merge of a windowed aggregation's parts, downstream would take them as late).

A source task instead polls its :class:`~runtime.io.SourceReader` and emits barriers that
the coordinator asked to inject, in order with its records; with event time
(:mod:`runtime.eventtime`) it stamps records with their event time and sends its
watermark at most every ``WATERMARK_INTERVAL_S``, and the final one at its end.

Exceptions from user code end the task as failed, with the message the processor built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

from .alignment import Aligner, Finished, Forward
from .channels import InputGate
from .dataflow import OperatorSpec
from .eventtime import SourceClock, WatermarkTracker
from .metrics import TaskMetrics
from .operators import KeyedProcessor, Processor
from .partitioned import PartitionSetReader
from .partitioning import Outputs
from .records import Barrier, BarrierKind, Batch, EndOfStream, Watermark

__all__ = ["SourceTask", "StreamTask", "TaskHost", "TaskStatus"]

logger = logging.getLogger(__name__)

SOURCE_IDLE_WAIT_S = 0.05  # longest a source sleeps before re-checking for barriers
SOURCE_MIN_WAIT_S = 0.001  # a throttled source emits what is due at most this often
WHOLE = ""  # the one split of an unpartitioned source task, for its event-time clock


class TaskHost(Protocol):
    """What a task tells the worker hosting it."""

    def task_finished(self, task: BaseTask) -> None: ...
    def task_failed(self, task: BaseTask, error: str) -> None: ...
    def barrier_aligned(self, task: BaseTask, barrier: Barrier) -> bool:
        """Told after ``barrier`` was forwarded; returns True if the task must pause."""
        ...


class TaskStatus(StrEnum):
    """A task's life on its worker: ``created``, ``running``, then ``finished`` (its
    inputs ended), ``failed`` (its code or a channel raised) or ``stopped`` (told to)."""

    CREATED = "created"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


class BaseTask:
    def __init__(
        self,
        task_id: str,
        op: OperatorSpec,
        index: int,
        outputs: Outputs,
        metrics: TaskMetrics,
        host: TaskHost,
    ) -> None:
        self.task_id = task_id
        self.op = op
        self.index = index
        self.outputs = outputs
        self.metrics = metrics
        self.host = host
        self.status = TaskStatus.CREATED
        self._runner: asyncio.Task | None = None
        self._resume: asyncio.Future | None = None
        self._paused_at = 0.0

    @property
    def runner(self) -> asyncio.Task | None:
        """The task's loop once started (done when it finished, failed or was stopped)."""
        return self._runner

    @property
    def paused(self) -> bool:
        return self._resume is not None and not self._resume.done()

    async def _pause(self) -> None:
        """Stop here (inputs unread, outputs flushed) until :meth:`resume` is called."""
        self._paused_at = time.perf_counter()
        self._resume = asyncio.get_running_loop().create_future()
        await self._resume

    def resume(self) -> float:
        """Let a paused task go on; returns how long it was paused, in seconds."""
        if self._resume is None or self._resume.done():
            return 0.0
        self._resume.set_result(None)
        return time.perf_counter() - self._paused_at

    def start(self, start_time: float) -> None:
        """Begin running; ``start_time`` is the job's common clock origin (sources' rates)."""
        self.status = TaskStatus.RUNNING
        self._runner = asyncio.create_task(self._run_guarded(), name=self.task_id)

    async def stop(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        if self.status == TaskStatus.RUNNING:
            self.status = TaskStatus.STOPPED
        self.close()

    def close(self) -> None:
        """Release resources (files, readers); idempotent."""

    def queued(self) -> dict[str, int]:
        return {}

    def snapshot_metrics(self) -> dict:
        m = self.metrics
        m.records_out = self.outputs.records_out
        self.outputs.records_out = 0
        for ch in self.outputs.channels:
            m.channel_records[ch.target] = ch.records_sent
            m.channel_bytes[ch.target] = ch.bytes_sent
            ch.records_sent = 0
            ch.bytes_sent = 0.0
        bp = self.outputs.backpressure_s()
        for ch in self.outputs.channels:
            ch.backpressure_s = 0.0
        m.backpressure_s += bp
        return m.snapshot(self.queued())

    async def _run_guarded(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.status = TaskStatus.FAILED
            message = str(exc) if str(exc) else type(exc).__name__
            if self.task_id not in message:
                message = f"task {self.task_id!r}: {type(exc).__name__}: {message}"
            logger.debug("task %s failed", self.task_id, exc_info=True)
            self.close()
            self.host.task_failed(self, message)
            return
        self.status = TaskStatus.FINISHED
        self.host.task_finished(self)

    async def _run(self) -> None:
        raise NotImplementedError

    async def _emit_barrier(self, barrier: Barrier) -> None:
        """Send ``barrier`` on every output after the records before it, tell the host,
        and pause if it says so (a reconfiguration's update, a savepoint)."""
        await self.outputs.broadcast(barrier)
        if self.host.barrier_aligned(self, barrier):
            await self._pause()


class StreamTask(BaseTask):
    """A task with inputs: map, flat_map, filter, keyed or sink."""

    def __init__(
        self,
        task_id: str,
        op: OperatorSpec,
        index: int,
        outputs: Outputs,
        metrics: TaskMetrics,
        host: TaskHost,
        gate: InputGate,
        processor: Processor,
    ) -> None:
        super().__init__(task_id, op, index, outputs, metrics, host)
        self.gate = gate
        self.processor = processor
        self.aligner = Aligner(gate.channels)
        self.watermarks = WatermarkTracker(gate.channels)
        self._injected: deque[Barrier] = deque()
        self._held: Watermark | None = None  # not forwarded yet: key groups on their way
        self._emitted: set[int] = set()  # ids of barriers injected here and emitted
        self._withdrawn: set[int] = set()

    def inject(self, barrier: Barrier) -> None:
        """Emit ``barrier`` from this task, after the records it has emitted so far, as if
        all its inputs had delivered it (the host is told, as for an aligned barrier).
        A barrier is emitted once, however often it is injected."""
        self._withdrawn.discard(barrier.id)

        def queue() -> None:
            if barrier.id in self._withdrawn or barrier.id in self._emitted:
                return
            if all(b.id != barrier.id for b in self._injected):
                self._injected.append(barrier)

        self.gate.post(queue)

    def withdraw(self, barrier_id: int) -> bool:
        """Take back an injected barrier not emitted yet; False if it has been."""
        if barrier_id in self._emitted:
            return False
        self._withdrawn.add(barrier_id)
        self._injected = deque(b for b in self._injected if b.id != barrier_id)
        return True

    def queued(self) -> dict[str, int]:
        return self.gate.queued()

    def close(self) -> None:
        """A sink's writer lets go of its files now (at the end of stream it was closed
        already; stopped or failed, it is aborted), not when it is collected."""
        abort = getattr(self.processor, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception:
                logger.warning("task %s: its sink could not be closed", self.task_id, exc_info=True)

    def snapshot_metrics(self) -> dict:
        snap = super().snapshot_metrics()
        if isinstance(self.processor, KeyedProcessor):  # a level, like the queues
            state = self.processor.state
            keys, size = state.size()
            snap["state"] = {"keys": keys, "bytes": size, "groups": state.group_sizes()}
        return snap

    def call_soon(self, call: Callable[[], None]) -> asyncio.Future:
        """Run ``call`` in this task's loop between batches (its outputs are flushed like a
        batch's); the future resolves when it has run. An exception from ``call`` fails the
        task, as one from processing would, and the future."""
        done = asyncio.get_running_loop().create_future()

        def run() -> None:
            try:
                call()
            except BaseException as exc:
                if not done.done():
                    done.set_exception(exc)
                raise
            if not done.done():
                done.set_result(None)

        self.gate.post(run)
        return done

    async def _advance(self, mark: Watermark | None) -> None:
        """Fire the event-time timers up to a risen watermark, then forward it (or an idle
        or active mark) after what they emitted; held while key groups are on their way."""
        if mark is None:
            return
        if not mark.idle:
            self.metrics.watermark = mark.time
            t0 = time.perf_counter()
            self.processor.on_watermark(self.watermarks.current)
            self.metrics.busy_s += time.perf_counter() - t0
        if getattr(self.processor, "awaiting", None):
            self._held = mark
            return
        self._held = None
        await self.outputs.broadcast(mark)

    async def _release(self) -> None:
        """Forward the watermark held back while key groups were on their way, once the
        last has come (their waiting records processed, their timers due fired)."""
        if self._held is not None and not getattr(self.processor, "awaiting", None):
            mark, self._held = self._held, None
            await self.outputs.broadcast(mark)

    async def _after_change(self) -> None:
        """After a reconfiguration touched the task: inputs gone may raise its watermark,
        new output channels need it, and key groups that came may have timers due."""
        await self._advance(self.watermarks.refresh())
        if self.outputs.resend:
            await self.outputs.resend_watermark()
        if self.watermarks.current > -math.inf:
            self.processor.on_watermark(self.watermarks.current)
            await self.outputs.flush()

    async def _run(self) -> None:
        gate, outputs, processor, metrics = self.gate, self.outputs, self.processor, self.metrics
        aligner = self.aligner
        loop = asyncio.get_running_loop()
        latency = metrics.latency
        hot_keys = metrics.hot_keys  # a keyed task's sketch of its heaviest keys
        clock = time.perf_counter
        wall = time.time
        while True:
            # Step 1. Next item. When the input runs dry, wait for more until the oldest
            # pending output record has lingered long enough, then send what is pending.
            if not gate.has_ready():
                t0 = clock()
                deadline = outputs.flush_deadline()
                got = None
                if deadline is not None:
                    got = await gate.next(loop.time() + max(deadline - time.monotonic(), 0.0))
                if got is None:
                    await outputs.flush(force=True)
                    wake = processor.wakeup
                    at = None if wake == math.inf else loop.time() + max(wake - wall(), 0.0)
                    got = await gate.next(at)
                metrics.idle_s += clock() - t0
                if got is None:  # Step 6. A processing-time timer is due.
                    processor.on_processing_time(wall())
                    await outputs.flush()
                    continue
                ch, item = got
            else:
                ch, item = await gate.next()
                await asyncio.sleep(0)  # let the worker's other tasks and I/O run
            t0 = clock()
            if processor.wakeup <= wall():
                # Step 6. Processing-time timers due.
                processor.on_processing_time(wall())
            if ch is None:
                # Step 5. A call from the worker.
                item()
                metrics.busy_s += clock() - t0
                await outputs.flush()
                while self._injected:
                    barrier = self._injected.popleft()
                    self._emitted.add(barrier.id)
                    await self._emit_barrier(barrier)
                    outputs, processor = self.outputs, self.processor
                    await self._advance(self.watermarks.reannounce())
                await self._after_change()
                await self._release()
                continue
            if type(item) is Batch:
                # Step 2. Process the batch.
                values = item.values
                metrics.records_in += len(values)
                if latency is not None:
                    latency.record(wall(), item.timestamps)
                processor.process(ch.key_fn, values, item.timestamps)
                if hot_keys is not None:
                    hot_keys.feed(ch.key_fn, values)
                metrics.busy_s += clock() - t0
                await outputs.flush()
                continue
            if type(item) is Watermark:
                # Step 7. Event time: forward the task's watermark when it rises.
                await self._advance(self.watermarks.on_watermark(ch.key, item))
                continue
            if type(item) is Barrier:
                # Step 3. Align; forward when every open input has delivered it.
                decision = aligner.on_barrier(ch.key, item)
                if aligner.is_blocked(ch.key):
                    gate.block(ch.key)
            elif type(item) is EndOfStream:
                # Step 4. An input ended.
                decision = aligner.on_end(ch.key)
                await self._advance(self.watermarks.remove_input(ch.key))
            else:
                raise TypeError(f"task {self.task_id!r}: unexpected item {item!r} on {ch.key}")
            if isinstance(decision, Forward):
                await outputs.broadcast(decision.barrier)
                if decision.barrier.kind is BarrierKind.RECONFIG:
                    self.watermarks.reset()  # Step 7: inputs re-announce after it
                    self._held = None  # what they re-announce is held or forwarded
                gate.unblock_all()
                if self.host.barrier_aligned(self, decision.barrier):
                    # Affected by a reconfiguration: wait for this task's update.
                    await self._pause()
                    outputs, processor = self.outputs, self.processor
                    await self._after_change()
            elif isinstance(decision, Finished):
                while getattr(processor, "awaiting", None):  # key groups still on their way
                    call = (await gate.next())[1]
                    call()
                await self._release()
                processor.close()
                await outputs.broadcast(EndOfStream())
                return


class SourceTask(BaseTask):
    """A source task: polls its reader at the source's rate and injects barriers."""

    def __init__(
        self,
        task_id: str,
        op: OperatorSpec,
        index: int,
        outputs: Outputs,
        metrics: TaskMetrics,
        host: TaskHost,
    ) -> None:
        super().__init__(task_id, op, index, outputs, metrics, host)
        self.reader = None
        # A partitioned source's task: the partitions it reads (None: its share by index).
        self.partitions: tuple[str, ...] | None = None
        self._checkpointed: dict[int, Any] = {}  # checkpoint id -> reader position
        self._barriers: deque[Barrier] = deque()
        self._injected: set[int] = set()  # ids of every barrier injected here
        self._wakeup = asyncio.Event()
        self._closed = False
        self.clock: SourceClock | None = None  # event time: the watermark of what it read

    def start(
        self, start_time: float, position: object = None, parallelism: int | None = None
    ) -> None:
        """Open the reader (seeking to ``position`` if given, for a moved task) and run. A
        partitioned source's task reads its :attr:`partitions`, each from its entry in
        ``position`` (a dict partition -> position) if it has one."""
        spec = self.op.event_time
        if spec is not None:
            self.clock = SourceClock(spec)
        if self.partitions is not None:
            positions = position if isinstance(position, dict) else None
            self.reader = PartitionSetReader(
                self.op.logic, self.partitions, start_time, positions, self.clock
            )
            super().start(start_time)
            return
        if self.clock is not None:
            self.clock.add(WHOLE, time.time())
        self.reader = self.op.logic.open(self.index, parallelism or self.op.parallelism, start_time)
        if position is not None:
            self.reader.seek(position)
        super().start(start_time)

    def snapshot_metrics(self) -> dict:
        snap = super().snapshot_metrics()
        if isinstance(self.reader, PartitionSetReader):  # levels, like the queues
            snap["partitions"] = self.reader.health()
        elif self.reader is not None and (lag := self.reader.lag()) is not None:
            snap["lag"] = lag  # records due and not read yet: what it is behind
        return snap

    def checkpointed(self, checkpoint_id: int, position: Any) -> None:
        """Its reader was at ``position`` at checkpoint ``checkpoint_id``'s barrier: kept
        until the checkpoint completes (:meth:`committed`) or a later one does."""
        self._checkpointed[checkpoint_id] = position

    def committed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: its reader is told the position it
        recorded; positions of earlier checkpoints are dropped (superseded)."""
        position = self._checkpointed.pop(checkpoint_id, None)
        for cid in [c for c in self._checkpointed if c < checkpoint_id]:
            del self._checkpointed[cid]
        if position is not None and self.reader is not None:
            self.reader.committed(position)

    def end_input(self) -> None:
        """A bounded partitioned source's task will be given no partition any more: once
        it reads none, it ends (:meth:`PartitionSetReader.end`)."""
        if isinstance(self.reader, PartitionSetReader):
            self.reader.end()
            self._wakeup.set()

    def abort_barrier(self, barrier_id: int) -> None:
        """Drop a barrier that was asked for but not emitted yet."""
        self._barriers = deque(b for b in self._barriers if b.id != barrier_id)

    def inject(self, barrier: Barrier) -> None:
        """Emit ``barrier`` after the records already emitted (called by the worker). A
        barrier is emitted once, however often it is injected: a stage that goes on after
        a withdrawal that could not take its barrier back is started again."""
        if barrier.id in self._injected:
            return
        self._injected.add(barrier.id)
        self._barriers.append(barrier)
        self._wakeup.set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.reader is not None:
                self.reader.close()

    async def _emit_barriers(self) -> None:
        while self._barriers:
            barrier = self._barriers.popleft()
            await self._emit_barrier(barrier)
            if self.clock is not None and barrier.kind is BarrierKind.RECONFIG:
                self.clock.reset()  # its partitions may have changed: announce anew

    async def _send_watermark(self, mark: Watermark | None) -> None:
        if mark is not None:
            if not mark.idle:
                self.metrics.watermark = mark.time
            await self.outputs.broadcast(mark)

    async def _run(self) -> None:
        reader, outputs, metrics = self.reader, self.outputs, self.metrics
        loop = asyncio.get_running_loop()
        batch_size = outputs.batch_size
        clock = time.perf_counter
        wall = time.time
        timed = self.clock
        whole = timed is not None and not isinstance(reader, PartitionSetReader)
        while True:
            if self._barriers:
                await self._emit_barriers()
                outputs = self.outputs
            if outputs.resend:
                await outputs.resend_watermark()
            t0 = clock()
            now = wall()
            polled = reader.poll(now, batch_size)
            if polled is None:
                await self._emit_barriers()
                if timed is not None:
                    await self._send_watermark(timed.final())
                await outputs.broadcast(EndOfStream())
                self.close()
                return
            values, stamps = polled
            if values:
                metrics.records_in += len(values)
                if timed is not None:
                    if whole:
                        stamps = timed.spec.stamps(values)
                        timed.observe(WHOLE, stamps, now)
                    mark = timed.before_records()
                    if mark is not None:
                        await self._send_watermark(mark)
                outputs.emit(values, stamps)
                metrics.busy_s += clock() - t0
                await outputs.flush()
                if timed is not None:
                    await self._send_watermark(timed.due(now))
                await asyncio.sleep(0)
                continue
            if timed is not None:
                await self._send_watermark(timed.due(now))
            # Nothing due yet: sleep until a record is due (at least SOURCE_MIN_WAIT_S, so
            # records come in batches), flushing pending output when it has lingered enough.
            await outputs.flush()
            now = wall()
            wait = min(max(reader.next_due(now) - now, SOURCE_MIN_WAIT_S), SOURCE_IDLE_WAIT_S)
            deadline = outputs.flush_deadline()
            if deadline is not None:
                wait = min(wait, max(deadline - time.monotonic(), 0.0))
            t1 = clock()
            self._wakeup.clear()
            if not self._barriers:
                timer = loop.call_later(wait, self._wakeup.set)
                await self._wakeup.wait()
                timer.cancel()
            metrics.idle_s += clock() - t1
