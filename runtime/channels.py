"""Channels between tasks: in-process and TCP, credit-based, batches in order.

A channel links one upstream task to one downstream task and carries, in order, record
:class:`~runtime.records.Batch` es, :class:`~runtime.records.Barrier` s and one
:class:`~runtime.records.EndOfStream`. Flow control is by credits, as in Flink: the
sender starts with ``credits`` credits (the receiver's buffer size, in items), spends one
per item and waits when it has none; the receiver returns a credit each time its task
takes an item. A slow consumer therefore backpressures its producers and nothing is
dropped or buffered without bound.

- Inside one worker, :class:`LocalOutputChannel` hands Python objects to the receiver's
  :class:`InputChannel` (no serialization) and returns credits by a direct call.
- Across workers, :class:`~runtime.peerlink.RemoteOutputChannel` writes msgpack frames
  on a :class:`~runtime.peerlink.PeerLink` (one TCP connection per job and pair of
  workers, per direction, and one more for key-group state); the receiving worker's
  :class:`~runtime.dataserver.DataServer` routes frames to input channels and writes
  credits back on the same connection. A connection starts with the handshake of
  :mod:`runtime.handshake` with the job's data key, and carries that job's frames only,
  of one deployment of the job: a channel's name says nothing of the deployment, so a
  receiver refuses connections of an earlier one than it runs.

A task reads all its input channels through one :class:`InputGate`, round-robin, skipping
channels that barrier alignment has blocked.

This module holds what both kinds share: the receiving end and the gate, the sending
end's batching and credits, and the in-process channel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .codec import packb
from .errors import StreamRuntimeError
from .records import Barrier, Batch, EndOfStream, Watermark

__all__ = [
    "ChannelError",
    "InputChannel",
    "InputGate",
    "LocalOutputChannel",
    "OutputChannel",
    "wait_while",
]

logger = logging.getLogger(__name__)

BYTES_SAMPLE_EVERY = 32  # local channels estimate bytes/record from one batch in this many


class ChannelError(StreamRuntimeError, ConnectionError):
    """A peer that disconnected mid-stream, sent data for an unknown channel, or lied."""


async def wait_while(holds: Callable[[], bool], changed: asyncio.Event, most_s: float) -> bool:
    """Wait while ``holds()``, checking it again each time ``changed`` is set, but at most
    ``most_s``; True once it no longer holds, False if it still does by then."""
    end = time.perf_counter() + most_s
    while holds():
        left = end - time.perf_counter()
        if left <= 0:
            return False
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(), left)
        except TimeoutError:
            return not holds()
    return True


class InputChannel:
    """The receiving end of one channel: a bounded FIFO of items read by one task."""

    __slots__ = ("closed", "gate", "items", "key", "key_fn", "queued", "upstream")

    def __init__(self, key: str, upstream: str, key_fn: Callable | None = None) -> None:
        self.key = key
        self.upstream = upstream
        self.key_fn = key_fn
        self.items: deque[tuple[Any, Callable[[int], None] | None]] = deque()  # (item, credit to)
        self.queued = 0  # records waiting
        self.gate: InputGate | None = None
        self.closed = False

    def push(self, item: Any, credit_to: Callable[[int], None] | None = None) -> None:
        """Queue ``item``; ``credit_to(1)`` is called when the task takes it.

        Credits go back to the sender of each item, so a channel whose sender moved to
        another worker (or came back) credits the right one even while older items of
        the previous sender are still queued.
        """
        self.items.append((item, credit_to))
        if type(item) is Batch:
            self.queued += len(item.values)
        if self.gate is not None:
            self.gate.notify(self)


class InputGate:
    """All input channels of one task; :meth:`next` returns the next item to process."""

    def __init__(self, on_dry: Callable[[], None] | None = None) -> None:
        self.channels: dict[str, InputChannel] = {}
        # Called each time the task has nothing left to process and starts waiting (see
        # WorkerProcess.caught_up: background work runs when every task here has run dry).
        self.on_dry = on_dry
        self._ready: deque[InputChannel] = deque()
        self._in_ready: set[str] = set()
        self._blocked: set[str] = set()
        self._control: deque[Callable[[], None]] = deque()
        self._wakeup = asyncio.Event()
        self._error: BaseException | None = None

    def add(self, channel: InputChannel) -> None:
        channel.gate = self
        self.channels[channel.key] = channel
        if channel.items:
            self.notify(channel)

    def remove(self, key: str) -> InputChannel:
        channel = self.channels.pop(key)
        self._blocked.discard(key)
        self._in_ready.discard(key)
        channel.gate = None
        return channel

    def notify(self, channel: InputChannel) -> None:
        key = channel.key
        if key not in self._in_ready and key not in self._blocked:
            self._in_ready.add(key)
            self._ready.append(channel)
            self._wakeup.set()

    def fail(self, error: BaseException) -> None:
        """Make the task's next :meth:`next` raise ``error`` (a peer went away)."""
        self._error = error
        self._wakeup.set()

    def post(self, call: Callable[[], None]) -> None:
        """Have the task run ``call`` in its loop, ahead of any input and whatever alignment
        has blocked (key-group state that arrived, see :meth:`StreamTask.call_soon`)."""
        self._control.append(call)
        self._wakeup.set()

    def block(self, key: str) -> None:
        self._blocked.add(key)

    def unblock_all(self) -> None:
        blocked, self._blocked = self._blocked, set()
        for key in blocked:
            ch = self.channels.get(key)
            if ch is not None and ch.items:
                self.notify(ch)

    def has_ready(self) -> bool:
        return bool(self._ready or self._control)

    def queued(self) -> dict[str, int]:
        return {ch.upstream: ch.queued for ch in self.channels.values()}

    async def next(self, deadline: float | None = None) -> tuple[InputChannel | None, Any] | None:
        """The next item of a non-blocked channel, round-robin; waits while there is none.
        A posted call comes first, as ``(None, call)``.

        With ``deadline`` (event-loop time), returns ``None`` if nothing arrived by then.
        """
        ready = self._ready
        timer = None
        try:
            while True:
                if self._error is not None:
                    raise self._error
                if self._control:
                    return None, self._control.popleft()
                while ready:
                    ch = ready.popleft()
                    if ch.key in self._blocked or ch.gate is not self:
                        self._in_ready.discard(ch.key)
                        continue
                    item, credit_to = ch.items.popleft()
                    if ch.items:
                        ready.append(ch)
                    else:
                        self._in_ready.discard(ch.key)
                    if type(item) is Batch:
                        ch.queued -= len(item.values)
                    if credit_to is not None:
                        credit_to(1)
                    return ch, item
                if deadline is not None:
                    loop = asyncio.get_running_loop()
                    if loop.time() >= deadline:
                        return None
                    if timer is None:
                        timer = loop.call_at(deadline, self._wakeup.set)
                self._wakeup.clear()
                if self.on_dry is not None:
                    self.on_dry()
                await self._wakeup.wait()
        finally:
            if timer is not None:
                timer.cancel()


class OutputChannel:
    """The sending end of one channel, with its pending (not yet batched) records."""

    def __init__(self, key: str, target: str, credits: int) -> None:
        self.key = key
        self.target = target
        self.buf_v: list = []
        self.buf_t: list = []
        self.credits = asyncio.Semaphore(credits)
        self.records_sent = 0
        self.bytes_sent = 0.0
        self.backpressure_s = 0.0

    def grant(self, n: int) -> None:
        for _ in range(n):
            self.credits.release()

    async def _acquire(self) -> None:
        sem = self.credits
        if sem.locked():
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await sem.acquire()
            self.backpressure_s += loop.time() - t0
        else:
            await sem.acquire()

    async def flush(self, batch_size: int, whole_batches_only: bool = False) -> None:
        """Send pending records in batches of at most ``batch_size``.

        With ``whole_batches_only``, a remainder smaller than ``batch_size`` stays pending.
        The pending lists keep their identity (edges append to them directly).
        """
        buf_v, buf_t = self.buf_v, self.buf_t
        n = len(buf_v)
        if not n or (whole_batches_only and n < batch_size):
            return
        if n <= batch_size:
            values, stamps = buf_v.copy(), buf_t.copy()
            buf_v.clear()
            buf_t.clear()
            await self._acquire()
            self._deliver_batch(values, stamps)
            self.records_sent += n
            return
        end = n - n % batch_size if whole_batches_only else n
        values, stamps = buf_v[:end], buf_t[:end]
        del buf_v[:end], buf_t[:end]
        for i in range(0, end, batch_size):
            await self._acquire()
            self._deliver_batch(values[i : i + batch_size], stamps[i : i + batch_size])
        self.records_sent += end

    async def send_control(self, item: Barrier | Watermark | EndOfStream, batch_size: int) -> None:
        """Flush pending records, then send ``item`` (in order after them)."""
        await self.flush(batch_size)
        await self._acquire()
        self._deliver_control(item)

    def detach(self) -> None:
        """Its sending task left this worker (a reconfiguration moved or removed it): the
        channel goes on from elsewhere, if at all. Call once the task has stopped."""

    def _deliver_batch(self, values: list, stamps: list) -> None:
        raise NotImplementedError

    def _deliver_control(self, item: Barrier | Watermark | EndOfStream) -> None:
        raise NotImplementedError


class LocalOutputChannel(OutputChannel):
    """A channel to a task on the same worker: objects handed over, no serialization."""

    def __init__(self, key: str, target: str, credits: int, receiver: InputChannel) -> None:
        super().__init__(key, target, credits)
        self.receiver = receiver
        self._batches = 0
        self._bytes_per_record = 0.0

    def _deliver_batch(self, values: list, stamps: list) -> None:
        if self._batches % BYTES_SAMPLE_EVERY == 0:
            try:
                self._bytes_per_record = (len(packb(values)) + 9 * len(stamps)) / max(
                    len(values), 1
                )
            except Exception:  # an unencodable record only matters if it crosses workers
                self._bytes_per_record = 0.0
        self._batches += 1
        self.bytes_sent += self._bytes_per_record * len(values)
        self.receiver.push(Batch(values, stamps), self.grant)

    def _deliver_control(self, item: Barrier | Watermark | EndOfStream) -> None:
        self.receiver.push(item, self.grant)
