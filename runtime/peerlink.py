"""The sending side of a data connection: :class:`PeerLink`, one TCP connection from this
worker to a peer worker for one job, and :class:`RemoteOutputChannel`, a channel to a task
on that worker written on it.

A link opens with the handshake of :mod:`runtime.handshake` with the job's data key (its
context names the job and the deployment of it whose tasks send: a peer running a later
one refuses it, see :class:`~runtime.dataserver.DataServer`), says which worker it comes
from (``[HELLO, worker]``) and then carries the job's frames:
batches, barriers, ends of stream and detaches on its channels, or, on a link of its own,
key-group state (see :mod:`runtime.handover`). The peer's
:class:`~runtime.dataserver.DataServer` writes credits back on it, also for the copies
made ahead that it has read (:meth:`PeerLink.copy_room`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable

from . import handshake, protocol
from .channels import ChannelError, OutputChannel, wait_while
from .records import Barrier, EndOfStream, Watermark

__all__ = ["PeerLink", "RemoteOutputChannel"]

logger = logging.getLogger(__name__)

DRAIN_ABOVE = 1 << 20  # bytes queued in a transport before a sender awaits drain()
# A link no longer needed is closed once its peer has read it, or after this.
LINK_FINISH_TIMEOUT_S = 5.0


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

    def _deliver_control(self, item: Barrier | Watermark | EndOfStream) -> None:
        if type(item) is Barrier:
            self.link.send([protocol.BARRIER, self.key, item.kind.value, item.id])
        elif type(item) is Watermark:
            self.link.send([protocol.WATERMARK, self.key, item.time, item.idle])
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
        attempt: int = handshake.FIRST_ATTEMPT,
        tls: ssl.SSLContext | None = None,
    ) -> PeerLink:
        """Dial worker ``peer``'s data server (over TLS with ``tls``) as worker
        ``worker_id``, for deployment ``attempt`` of job ``job_id`` whose data key is
        ``key`` (:func:`runtime.handshake.data_key`). Raises :class:`ChannelError` when
        the peer cannot be reached or does not complete the handshake."""
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
            await handshake.dial(reader, writer, key, handshake.data_context(job_id, attempt))
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

    def abort(self) -> None:
        """Drop the connection now, with what is queued on it unsent: nothing more of it
        reaches the peer, and sending on it raises :class:`ChannelError`."""
        if self._reader_task is not None:
            self._reader_task.cancel()
        self.writer.transport.abort()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
