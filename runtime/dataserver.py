"""The receiving side of data connections: :class:`DataServer` accepts them from peer
workers, and each (:class:`_DataConnection`) routes the frames it reads to the worker's
input channels and its key-group state to the worker, writing credits back.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from . import handshake, protocol
from .channels import ChannelError, InputChannel
from .records import Barrier, BarrierKind, Batch, EndOfStream, Watermark

__all__ = ["DataServer"]

logger = logging.getLogger(__name__)


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

    **Fencing.** The handshake's context also names the job's deployment (``attempt``)
    whose tasks made the connection. The worker tells :meth:`fence` which deployment of
    a job it runs as it learns of it (a deploy, or a prepare that makes it join the job);
    from then on a connection of an earlier one is closed without another byte of it
    decoded: those open now at once, later ones as soon as they have proved the key. So
    what tasks of a deployment that a recovery replaced still send (a worker declared
    lost that comes back, say) never reaches the tasks that replaced them, whose channels
    have the same names. A connection of a later deployment is taken: its peer may
    deploy, and dial here, before this worker has read its own deploy.

    ``inputs`` is the worker's live registry of input channels by key. A frame for another
    job, for an unknown channel of the job, an undecodable frame or a disconnect while
    channels of that peer are still open fails the reading tasks through their gates,
    naming the peer, and ``on_error(error, {job})`` is told (never another job).
    Connections are read in place (:class:`_DataConnection`): frames are parsed from the
    receive buffer, and key-group state is received straight into its own buffer (from
    ``pool``, reused once read), and handed to ``on_state(job, frame, payload, read)``:
    ``read(1)`` tells the sender that a copy made ahead has been read
    (:meth:`~runtime.peerlink.PeerLink.copy_room`).

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
        self._attempts: dict[str, int] = {}  # job -> the deployment of it that runs here

    def key_for(self, context: str) -> bytes | None:
        """The key of a data connection for ``context``: its job's data key. Any job: a
        peer's deploy of a job can dial here before this worker has read its own (the
        coordinator sends them at once), and frames of a job not here are dropped."""
        named = handshake.data_of_context(context)
        return None if named is None else handshake.data_key(self._secret, named[0])

    def fence(self, job: str, attempt: int) -> None:
        """Deployment ``attempt`` of ``job`` runs here from now on (see the class
        docstring): connections of its earlier deployments are closed now, unread, and
        refused from now on."""
        if attempt <= self._attempts.get(job, 0):
            return
        self._attempts[job] = attempt
        for conn in list(self._conns):
            if conn.job == job and self.superseded(job, conn.attempt):
                conn.fenced()

    def superseded(self, job: str, attempt: int) -> bool:
        """Whether a later deployment of ``job`` than ``attempt`` runs here."""
        return attempt < self._attempts.get(job, 0)

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


class _DataConnection(asyncio.BufferedProtocol):
    """One data connection from a peer worker: the handshake first (read in exactly the
    bytes it still needs, so nothing past it is buffered), then HELLO, then data,
    barriers, ends of stream and state of the job it proved the key of, each routed as
    it is parsed; credits go back on the same connection."""

    def __init__(self, server: DataServer) -> None:
        self.server = server
        self.peer = "an unknown worker"
        self.job = ""  # the job whose key the peer proved: it carries this job's frames only
        self.attempt = 0  # the deployment of the job whose tasks made it (see fence)
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
        if self.frames is not None:
            return self.frames.buffer()
        if self.handshake is None:  # fenced once proved (see fenced): bytes left unread
            return memoryview(self._proof)
        return memoryview(self._proof)[: self.handshake.wanted]

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
        self.job, self.attempt = handshake.data_of_context(hs.context or "") or ("", 0)
        self.handshake = None
        if self.server.superseded(self.job, self.attempt):
            self.fenced()  # unanswered: the peer's dial fails
            return
        self.transport.write(answer)
        self.frames = protocol.FrameReader(
            f"data connection of job {self.job}", _state_payload, self.server.pool
        )

    def fenced(self) -> None:
        """Close a connection of a deployment of its job that a later one replaced here
        (:meth:`DataServer.fence`), reading nothing more of it; no job hears of it."""
        if self.ended:
            return
        self.ended = True
        assert self.transport is not None
        logger.warning(
            "closed the data connection from %s (%s): it is of deployment %d of job %s, "
            "and deployment %d runs here",
            self.peer,
            self.transport.get_extra_info("peername"),
            self.attempt,
            self.job,
            self.server._attempts.get(self.job, 0),
        )
        self.transport.abort()

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
        elif tag == protocol.WATERMARK:
            ch.push(Watermark(float(frame[2]), bool(frame[3])), give)
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
