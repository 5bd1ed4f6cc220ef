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
- Across workers, :class:`RemoteOutputChannel` writes msgpack frames on a
  :class:`PeerLink` (one TCP connection per job and pair of workers, per direction, and
  one more for key-group state); the receiving worker's :class:`DataServer` routes frames
  to input channels and writes credits back on the same connection. A connection starts
  with the handshake of :mod:`runtime.handshake` with the job's data key, and carries that
  job's frames only.

A task reads all its input channels through one :class:`InputGate`, round-robin, skipping
channels that barrier alignment has blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from . import handshake, protocol
from .codec import packb
from .records import Barrier, BarrierKind, Batch, EndOfStream

__all__ = [
    "ChannelError",
    "DataServer",
    "InputChannel",
    "InputGate",
    "LocalOutputChannel",
    "OutputChannel",
    "PeerLink",
    "RemoteOutputChannel",
]

logger = logging.getLogger(__name__)

DRAIN_ABOVE = 1 << 20  # bytes queued in a transport before a sender awaits drain()
BYTES_SAMPLE_EVERY = 32  # local channels estimate bytes/record from one batch in this many
# A link no longer needed is closed once its peer has read it, or after this.
LINK_FINISH_TIMEOUT_S = 5.0


class ChannelError(ConnectionError):
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
        # Worker.caught_up: background work runs when every task here has run dry).
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

    async def send_control(self, item: Barrier | EndOfStream, batch_size: int) -> None:
        """Flush pending records, then send ``item`` (in order after them)."""
        await self.flush(batch_size)
        await self._acquire()
        self._deliver_control(item)

    def detach(self) -> None:
        """Its sending task left this worker (a reconfiguration moved or removed it): the
        channel goes on from elsewhere, if at all. Call once the task has stopped."""

    def _deliver_batch(self, values: list, stamps: list) -> None:
        raise NotImplementedError

    def _deliver_control(self, item: Barrier | EndOfStream) -> None:
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

    def _deliver_control(self, item: Barrier | EndOfStream) -> None:
        self.receiver.push(item, self.grant)


class RemoteOutputChannel(OutputChannel):
    """A channel to a task on another worker, over that worker's :class:`PeerLink`."""

    def __init__(self, key: str, target: str, credits: int, link: PeerLink) -> None:
        super().__init__(key, target, credits)
        self.link = link
        link.channels[key] = self

    def _deliver_batch(self, values: list, stamps: list) -> None:
        self.bytes_sent += self.link.send([protocol.DATA, self.key, values, stamps])

    def detach(self) -> None:
        """Tell the receiver that this connection carries nothing more of the channel, so
        that the connection closing later (this worker retired, say) is not taken for the
        channel's sender failing; the link forgets it."""
        if self.link.channels.get(self.key) is self:
            del self.link.channels[self.key]
        if not self.link.writer.transport.is_closing():
            self.link.send([protocol.DETACH, self.key])

    def _deliver_control(self, item: Barrier | EndOfStream) -> None:
        if type(item) is Barrier:
            self.link.send([protocol.BARRIER, self.key, item.kind.value, item.id])
        else:
            self.link.send([protocol.END, self.key])
            if self.link.channels.get(self.key) is self:  # it needs no credits after its end
                del self.link.channels[self.key]

    async def flush(self, batch_size: int, whole_batches_only: bool = False) -> None:
        await super().flush(batch_size, whole_batches_only)
        await self.link.drain_if_needed()


class PeerLink:
    """The outgoing data connection from this worker to one peer worker.

    The peer resetting it is reported to ``on_error`` only while the link is ``in_use``:
    by default while it carries a channel that has not ended (neither sent its end of
    stream nor detached); a state link says when it carries a change's state. A reset
    after that (the peer retired once the tasks it read moved away, say) is logged only.
    """

    def __init__(
        self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.peer = peer
        self.reader = reader
        self.writer = writer
        self.channels: dict[str, OutputChannel] = {}
        self._reader_task: asyncio.Task | None = None
        self.on_error: Callable[[BaseException], None] | None = None
        self.in_use: Callable[[], bool] = lambda: bool(self.channels)
        # Copies made ahead sent here, by reconfiguration (see copy_room): the bytes of
        # those the peer has not read yet, in the order sent (it reads them in order, at
        # its idle moments, and says so with the seconds reading them took), and the
        # (bytes, seconds) of those read: the receiver's pace (see copies_read).
        self._unread: dict[int, deque[int]] = {}
        self._read: dict[int, tuple[int, float]] = {}
        self._copy_read = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        peer: str,
        host: str,
        port: int,
        worker_id: str,
        *,
        job_id: str,
        key: bytes,
        tls: ssl.SSLContext | None = None,
    ) -> PeerLink:
        """Dial worker ``peer``'s data server (over TLS with ``tls``) as worker
        ``worker_id``, for job ``job_id`` whose data key is ``key``
        (:func:`runtime.handshake.data_key`). Raises :class:`ChannelError` when the peer
        cannot be reached or does not complete the handshake."""
        try:
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=tls,
                ssl_handshake_timeout=handshake.CLIENT_TIMEOUT_S if tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ChannelError(f"cannot reach worker {peer} at {host}:{port}: {exc}") from exc
        try:
            await handshake.dial(reader, writer, key, handshake.data_context(job_id))
        except handshake.HandshakeError as exc:
            writer.close()
            raise ChannelError(
                f"worker {peer} at {host}:{port} did not take a data connection of job "
                f"{job_id}: {exc}"
            ) from exc
        protocol.write_frame(writer, [protocol.HELLO, worker_id])
        link = cls(peer, reader, writer)
        link._reader_task = asyncio.create_task(link._read_credits(), name=f"credits<{peer}")
        return link

    def send(self, frame: list) -> int:
        if self.writer.transport.is_closing():  # the peer closed or reset it, or we did
            raise ChannelError(
                f"the data connection to worker {self.peer} is closed (the worker stopped or died)"
            )
        return protocol.write_frame(self.writer, frame)

    def copy_sent(self, rid: int, nbytes: int) -> None:
        """A copy made ahead for reconfiguration ``rid``, of ``nbytes``, went on this link."""
        self._unread.setdefault(rid, deque()).append(nbytes)

    @property
    def copies_unread(self) -> dict[int, int]:
        """How many copies ahead sent here the peer has not read, by reconfiguration."""
        return {rid: len(sizes) for rid, sizes in self._unread.items() if sizes}

    def copies_read(self, rid: int) -> tuple[int, float]:
        """(bytes, seconds): the copies ahead of ``rid`` the peer has read so far, and the
        seconds it says reading them took."""
        return self._read.get(rid, (0, 0.0))

    def forget_copies(self, rid: int) -> None:
        """The copying ahead of ``rid`` is over: its counts go (the update reads the rest,
        and those reads are not counted)."""
        self._unread.pop(rid, None)
        self._read.pop(rid, None)

    async def copy_room(self, rid: int, window: int, most_s: float) -> bool:
        """Wait until fewer than ``window`` copies ahead of ``rid`` sent here are unread by
        the peer, but at most ``most_s``; False if they still are. The copying ahead goes
        at the receiver's idle pace too: copies it has no time to read would otherwise
        pile up in its memory, and taking them in off the socket costs it time its tasks
        need."""
        return await wait_while(
            lambda: len(self._unread.get(rid, ())) >= window, self._copy_read, most_s
        )

    def _copies_read(self, rid: int, n: int, seconds: float) -> None:
        sizes = self._unread.get(rid)
        if sizes is not None:
            nbytes = sum(sizes.popleft() for _ in range(min(n, len(sizes))))
            read, took = self._read.get(rid, (0, 0.0))
            self._read[rid] = (read + nbytes, took + seconds)
        self._copy_read.set()

    async def drain_if_needed(self) -> None:
        transport = self.writer.transport
        if transport.get_write_buffer_size() > DRAIN_ABOVE:
            await self.writer.drain()

    async def _read_credits(self) -> None:
        try:
            while True:
                frame = await protocol.read_frame(self.reader, f"worker {self.peer}")
                if frame[0] != protocol.CREDIT:
                    raise ChannelError(f"worker {self.peer} sent frame {frame[0]} on a data link")
                took = dict(frame[2]) if len(frame) > 2 else {}  # seconds, by reconfiguration
                for key, n in frame[1]:
                    if type(key) is int:  # copies ahead of reconfiguration ``key`` read
                        self._copies_read(key, n, took.get(key, 0.0))
                        continue
                    ch = self.channels.get(key)
                    if ch is not None:
                        ch.grant(n)
        except EOFError:
            return
        except (ConnectionError, OSError) as exc:
            if not self.in_use():
                logger.debug("data link to worker %s reset once unused: %s", self.peer, exc)
            elif self.on_error is not None:
                self.on_error(exc)

    async def finish(self, timeout_s: float = LINK_FINISH_TIMEOUT_S) -> None:
        """Close the link once the peer has read all of it: end our side of the stream,
        read what the peer still sends (credits) until it closes its side, then close.
        Closing with the peer's bytes unread would reset the connection, and a reset can
        throw away what the peer had not yet read; waiting at most ``timeout_s``."""
        transport = self.writer.transport
        if not transport.is_closing() and self.writer.can_write_eof():
            self.writer.write_eof()
            if self._reader_task is not None:
                await asyncio.wait({self._reader_task}, timeout=timeout_s)
        await self.close()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class _CreditReturn:
    """Credits owed to one sending worker, written back once per event-loop iteration; for
    copies ahead read (a reconfiguration's id in place of a channel), also the seconds
    reading them took."""

    def __init__(self, writer: asyncio.Transport) -> None:
        self.writer = writer
        self.owed: dict[str | int, int] = {}
        self.took: dict[str | int, float] = {}  # seconds, by reconfiguration id
        self.scheduled = False

    def for_channel(self, key: str | int) -> Callable[[int, float], None]:
        owed, took = self.owed, self.took

        def give(n: int, seconds: float = 0.0) -> None:
            owed[key] = owed.get(key, 0) + n
            if seconds:
                took[key] = took.get(key, 0.0) + seconds
            if not self.scheduled:
                self.scheduled = True
                asyncio.get_running_loop().call_soon(self.flush)

        return give

    def flush(self) -> None:
        self.scheduled = False
        if self.owed and not self.writer.is_closing():
            frame: list = [protocol.CREDIT, list(self.owed.items())]
            if self.took:
                frame.append(list(self.took.items()))
            protocol.write_frame(self.writer, frame)
        self.owed.clear()
        self.took.clear()


class DataServer:
    """Accepts data connections from peer workers and routes frames to input channels.

    Each connection first runs the server's side of :mod:`runtime.handshake`: the peer
    proves the data key of one job (derived from ``secret``, see
    :func:`~runtime.handshake.data_key`) within ``HANDSHAKE_TIMEOUT_S``, having sent at
    most ``MAX_PROOF`` bytes, before anything it sends is decoded. A connection that does
    not is closed, and nothing else happens (no job hears of it; refusals are logged at
    debug level and summed up in a warning now and then). The connection then carries that
    job's frames only: a ``[HELLO, worker]`` naming the peer, then frames on channels of
    the job (keys ``"<job>/..."``) and state for its reconfigurations.

    ``inputs`` is the worker's live registry of input channels by key. A frame for another
    job, for an unknown channel of the job, an undecodable frame or a disconnect while
    channels of that peer are still open fails the reading tasks through their gates,
    naming the peer, and ``on_error(error, {job})`` is told (never another job).
    Connections are read in place (:class:`_DataConnection`): frames are parsed from the
    receive buffer, and key-group state is received straight into its own buffer (from
    ``pool``, reused once read), and handed to ``on_state(job, frame, payload, read)``:
    ``read(1)`` tells the sender that a copy made ahead has been read
    (:meth:`PeerLink.copy_room`).

    ``has_job(job)`` says whether a job runs (or is being prepared) here: frames of a job
    that does not are dropped. State frames name a reconfiguration: ``changing(rids)``
    gives the jobs whose pending reconfiguration is one of ``rids``; state for another
    job's is refused, and a broken connection fails its job for its state only while the
    job's reconfiguration is pending. With ``tls`` (see :func:`runtime.handshake.server_tls`)
    connections are TLS, the handshake inside it.
    """

    def __init__(
        self,
        secret: str,
        inputs: dict[str, InputChannel],
        on_error: Callable[[str, set[str]], None] | None = None,
        on_state: Callable[[str, tuple, bytearray | memoryview, Callable[[int], None]], None]
        | None = None,
        has_job: Callable[[str], bool] | None = None,
        changing: Callable[[set[int]], set[str]] | None = None,
        pool: protocol.PayloadPool | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._secret = secret  # job data keys derive from it
        self.inputs = inputs
        self.on_error = on_error
        self.on_state = on_state
        self.has_job = has_job
        self.changing = changing
        self.pool = pool  # where state payloads are received (see protocol.PayloadPool)
        self.tls = tls
        self.server: asyncio.Server | None = None
        self.refusals = handshake.RefusalLog(logger, "the data server")
        self._conns: set[_DataConnection] = set()

    def key_for(self, context: str) -> bytes | None:
        """The key of a data connection for ``context``: its job's data key. Any job: a
        peer's deploy of a job can dial here before this worker has read its own (the
        coordinator sends them at once), and frames of a job not here are dropped."""
        job = handshake.job_of_context(context)
        return None if job is None else handshake.data_key(self._secret, job)

    async def start(self, host: str, port: int = 0) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _DataConnection(self),
            host,
            port,
            ssl=self.tls,
            ssl_handshake_timeout=handshake.HANDSHAKE_TIMEOUT_S if self.tls else None,
        )
        sock = self.server.sockets[0].getsockname()
        return sock[0], sock[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self._conns):
            conn.close()


def _state_payload(frame: Any) -> int | None:
    """The length of the raw payload after a ``STATE`` frame (None after any other)."""
    if type(frame) is tuple and len(frame) == 8 and frame[0] == protocol.STATE:
        length = frame[7]
        if type(length) is not int or not 0 <= length <= protocol.MAX_FRAME:
            raise ValueError(f"a frame announced a payload of {length!r} bytes")
        return length
    return None


class _DataConnection(asyncio.BufferedProtocol):
    """One data connection from a peer worker: the handshake first (read in exactly the
    bytes it still needs, so nothing past it is buffered), then HELLO, then data,
    barriers, ends of stream and state of the job it proved the key of, each routed as
    it is parsed; credits go back on the same connection."""

    def __init__(self, server: DataServer) -> None:
        self.server = server
        self.peer = "an unknown worker"
        self.job = ""  # the job whose key the peer proved: it carries this job's frames only
        self.handshake: handshake.ServerHandshake | None = handshake.ServerHandshake(server.key_for)
        self._proof = bytearray(handshake.MAX_PROOF)
        self._deadline: asyncio.TimerHandle | None = None
        self.frames: protocol.FrameReader | None = None  # once the handshake is done
        self.transport: asyncio.Transport | None = None
        self.credits: _CreditReturn | None = None
        self.givers: dict[str, Callable[[int], None]] = {}
        self.seen: dict[str, InputChannel] = {}  # channels this peer has sent on
        self.state_rids: set[int] = set()  # reconfigurations it has sent state for
        self.detached = False  # it has sent on channels that it no longer carries
        self.ended = False  # refused, failed or closed: nothing more is routed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.server._conns.add(self)
        assert self.handshake is not None
        self.transport.write(self.handshake.greeting())  # type: ignore[union-attr]
        self._deadline = asyncio.get_running_loop().call_later(
            handshake.HANDSHAKE_TIMEOUT_S,
            self._refuse,
            handshake.HandshakeError(f"no handshake within {handshake.HANDSHAKE_TIMEOUT_S:g}s"),
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.frames is None:
            assert self.handshake is not None
            return memoryview(self._proof)[: self.handshake.wanted]
        return self.frames.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.ended:
            return
        if self.frames is None:
            self._handshake_received(nbytes)
            return
        try:
            for frame, payload in self.frames.received(nbytes):
                self._route(frame, payload)
                if self.ended:
                    return
        except (ConnectionError, ValueError, TypeError, LookupError, AttributeError) as exc:
            if not isinstance(exc, ConnectionError):
                exc = ChannelError(f"{self.peer} sent a malformed frame: {exc}")
            self._failed(exc)

    def _handshake_received(self, nbytes: int) -> None:
        hs = self.handshake
        assert hs is not None and self.transport is not None
        try:
            answer = hs.receive(bytes(self._proof[:nbytes]))
        except handshake.HandshakeError as exc:
            self._refuse(exc)
            return
        if not answer:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self.transport.write(answer)
        self.job = handshake.job_of_context(hs.context or "") or ""
        self.handshake = None
        self.frames = protocol.FrameReader(
            f"data connection of job {self.job}", _state_payload, self.server.pool
        )

    def _refuse(self, exc: handshake.HandshakeError) -> None:
        """Close a connection whose peer did not prove itself; nothing else happens."""
        if self.ended:
            return
        self.ended = True
        assert self.transport is not None
        self.server.refusals.refused(self.transport.get_extra_info("peername"), exc)
        self.transport.abort()

    def eof_received(self) -> bool:
        return False  # close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        if self._deadline is not None:
            self._deadline.cancel()
        if self.ended or self.frames is None:  # done with, or a stranger that left
            self.ended = True
            return
        live = self._live_channels()
        if exc is not None and (
            live or self._changing() or not self._carried()
        ):  # a reset, a read error
            self._failed(ChannelError(f"data connection from {self.peer} broke: {exc}"))
            return
        # Closed, or reset once nothing it carried was still being read here (its streams
        # ended, or their jobs stopped here): a worker shutting down, nothing lost.
        self.ended = True
        if exc is not None:
            logger.debug("data connection from %s reset after its streams: %s", self.peer, exc)
        for ch in live:
            if ch.gate is not None:
                ch.gate.fail(ChannelError(f"{self.peer} disconnected before the end of {ch.key}"))

    def _live_channels(self) -> list[InputChannel]:
        """The channels this peer has sent on that are still open and read here, of jobs
        running here. A channel counts by identity: once the task reading it moved away,
        or the job was redeployed (a restart), a new channel of the same key is read, fed
        by a new connection, and this one's end is none of its business."""
        has_job = self.server.has_job
        inputs = self.server.inputs
        return [
            ch
            for key, ch in self.seen.items()
            if not ch.closed
            and inputs.get(key) is ch
            and (has_job is None or has_job(key.partition("/")[0]))
        ]

    def _carried(self) -> bool:
        """True once this peer has sent data on a channel or state for a reconfiguration."""
        return bool(self.seen or self.state_rids or self.detached)

    def _changing(self) -> set[str]:
        """Its job, while a pending reconfiguration of it is one this peer sent state for."""
        if not self.state_rids or self.server.changing is None:
            return set()
        return self.server.changing(self.state_rids) & {self.job}

    def close(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.close()

    def _route(self, frame: Any, payload: bytearray | memoryview | None) -> None:
        server = self.server
        if self.credits is None:  # the first frame: who is this?
            if (
                not isinstance(frame, tuple | list)
                or len(frame) != 2
                or frame[0] != protocol.HELLO
                or type(frame[1]) is not str
            ):
                raise ChannelError(f"a peer of job {self.job} sent no hello first")
            assert self.transport is not None and self.frames is not None
            self.peer = self.frames.peer = f"worker {frame[1]}"
            self.credits = _CreditReturn(self.transport)
            return
        tag, key = frame[0], frame[1]
        if tag == protocol.STATE:
            if server.on_state is None or payload is None or type(key) is not int:
                raise ChannelError(f"{self.peer} sent state, which this worker cannot take")
            others = server.changing({key}) - {self.job} if server.changing is not None else ()
            if others:
                raise ChannelError(
                    f"{self.peer} sent state for a reconfiguration of job {min(others)} on a "
                    f"connection of job {self.job}"
                )
            self.state_rids.add(key)
            server.on_state(self.job, frame, payload, self.credits.for_channel(key))
            return
        if type(key) is not str or key.partition("/")[0] != self.job:
            raise ChannelError(
                f"{self.peer} sent a frame on {key!r}, not a channel of job {self.job}, on a "
                f"connection of job {self.job}"
            )
        if tag == protocol.DETACH:  # its sender moved: the channel goes on without us
            self.seen.pop(key, None)
            self.givers.pop(key, None)
            self.detached = True
            return
        # Looked up per frame: a reconfiguration may have replaced the channel.
        ch = server.inputs.get(key)
        if ch is None:
            if server.has_job is not None and not server.has_job(key.partition("/")[0]):
                return  # a job stopped here while the peer still sends: drop
            raise ChannelError(f"{self.peer} sent data for unknown channel {key!r}")
        give = self.givers.get(key)
        if give is None:
            give = self.givers[key] = self.credits.for_channel(key)
        self.seen[key] = ch
        if tag == protocol.DATA:
            ch.push(Batch(frame[2], frame[3]), give)
        elif tag == protocol.BARRIER:
            ch.push(Barrier(BarrierKind(frame[2]), frame[3]), give)
        elif tag == protocol.END:
            ch.closed = True
            ch.push(EndOfStream(), give)
        else:
            raise ChannelError(f"{self.peer} sent an unknown frame tag {tag!r}")

    def _failed(self, exc: ConnectionError) -> None:
        """Fail the reading tasks of this peer's open channels, and the jobs it carried."""
        self.ended = True
        for ch in self.seen.values():
            if ch.gate is not None and not ch.closed:
                ch.gate.fail(exc)
        logger.warning("data connection from %s failed: %s", self.peer, exc)
        if self.server.on_error is not None:
            self.server.on_error(str(exc), {self.job})  # the one job it may carry
        if self.transport is not None:
            self.transport.close()
