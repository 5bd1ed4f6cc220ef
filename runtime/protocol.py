"""Frames on the wire between the coordinator and workers, and between workers; the data
plane.

Every TCP connection (TLS when the cluster has certificates) starts with the handshake
of :mod:`runtime.handshake`: raw bytes in which both ends prove they hold the key of
what the connection is for, derived from the cluster secret, which itself never travels.
Nothing a peer sends is decoded before it has proved itself: a stranger gets the
server's greeting and a closed connection, after at most ``handshake.MAX_PROOF`` bytes
or ``handshake.HANDSHAKE_TIMEOUT_S``. Then the connection carries length-prefixed
frames: a 4-byte big-endian length, then a msgpack body (in which extension type 1 is a
pickle: only authenticated peers' frames are decoded).

Control and heartbeat connections (a worker dials the coordinator; handshake context
``"control"``, or ``"heartbeat:<worker id>"``, with the control key) carry control
messages, one per frame: :mod:`runtime.messages` lists and documents them all. When
the control connection closes, the worker stops its tasks and exits.

Data connection (the sending worker dials the receiving worker's data address, one per
job and direction, and one more for the job's key-group state; context
``"data:<job id>@<attempt>"``, that job's data key, and the deployment of the job whose
tasks send, which a receiver running a later one refuses): it carries that job's frames
only (a frame on
a channel of another job, or state for another job's reconfiguration, closes it and
fails its own job). The first frame is ``[HELLO, worker_id]`` (who the peer is, for
messages); then ``[DATA, channel, values, timestamps]``,
``[BARRIER, channel, kind, id]``, ``[WATERMARK, channel, time, idle]``, ``[END, channel]``
and ``[DETACH, channel]`` (the
sending task left that worker in a reconfiguration: the channel goes on, fed from its new
worker, and this connection carries nothing more of it) flow to the receiver and
``[CREDIT, [[channel, n], ...]]`` flows back on the same connection (credits returned
in one event-loop iteration travel together; a reconfiguration's id, an integer, in place
of a channel counts copies of key-group state made ahead for it that were read, and a
third element ``[[rid, seconds], ...]``, when there is one, says how long reading them
took). During a reconfiguration, state moves on the same links: ``[STATE, rid, task,
part, seq, total, raw, nbytes]`` followed by ``nbytes`` raw bytes, outside any frame (a
chunk of a key group's exported state, or of a source position; see
:class:`FrameReader`). ``channel``
is ``"<job>/<upstream task>><downstream task>"`` (see :func:`channel_key`).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from .codec import CodecError, packb, unpackb
from .errors import StreamRuntimeError

__all__ = [
    "BARRIER",
    "CREDIT",
    "DATA",
    "DETACH",
    "END",
    "HELLO",
    "MAX_FRAME",
    "STATE",
    "WATERMARK",
    "FrameError",
    "FrameReader",
    "PayloadPool",
    "channel_key",
    "encode",
    "read_frame",
    "state_owner",
    "write_frame",
]

# Data-plane frame tags.
DATA, BARRIER, END, CREDIT, STATE, DETACH, WATERMARK, HELLO = 0, 1, 2, 3, 4, 5, 6, 9

MAX_FRAME = 256 * 1024 * 1024  # refuse absurd lengths from a corrupt or hostile peer
_LEN = struct.Struct(">I")


class FrameError(StreamRuntimeError, ConnectionError):
    """A frame that is too long or does not decode; the connection cannot go on."""


def channel_key(job_id: str, upstream_task: str, downstream_task: str) -> str:
    """A channel's name on the wire and in a worker's registry: unique across jobs."""
    return f"{job_id}/{upstream_task}>{downstream_task}"


def state_owner(job_id: str, task: str) -> str:
    """Task ``task``'s name in a worker's state inbox (``runtime.handover.StateInbox``):
    unique across jobs, so state that came on one job's connection is only that job's."""
    return f"{job_id}/{task}"


def encode(obj: Any) -> bytes:
    """One frame: length prefix + msgpack body."""
    body = packb(obj)
    return _LEN.pack(len(body)) + body


def write_frame(writer: asyncio.StreamWriter | asyncio.WriteTransport, obj: Any) -> int:
    """Queue one frame on ``writer`` (call ``drain`` to respect the transport's buffer)."""
    frame = encode(obj)
    writer.write(frame)
    return len(frame)


async def read_frame(reader: asyncio.StreamReader, peer: str) -> Any:
    """The next frame from ``reader``; raises EOFError at a clean end of stream.

    Raises :class:`FrameError` naming ``peer`` for an oversize or undecodable frame.
    """
    try:
        header = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError(f"{peer}: connection closed inside a frame header") from exc
        raise EOFError(peer) from exc
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"{peer}: frame of {length} bytes exceeds the {MAX_FRAME} byte limit")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"{peer}: connection closed inside a {length}-byte frame") from exc
    try:
        return unpackb(body)
    except CodecError as exc:
        raise FrameError(f"{peer}: {exc}") from exc


class PayloadPool:
    """Buffers for received payloads, given back once what they hold has been read, so
    that receiving state reuses memory instead of faulting in fresh pages.

    A process that receives 100 MB of key-group state into new buffers spends about as
    much CPU in page faults for them as in the receiving itself (measured by
    ``bench/state_transfer.py``). A payload of at least :attr:`MIN_BYTES` gets a buffer
    whose size is the next power of two, as a view of its first bytes; :meth:`give`
    takes the view back once nothing reads it any more, and keeps at most
    :attr:`KEEP` free buffers of each size. Smaller payloads are plain bytearrays.
    """

    MIN_BYTES = 64 * 1024
    KEEP = 2

    def __init__(self) -> None:
        self._free: dict[int, list[bytearray]] = {}

    def take(self, n: int) -> bytearray | memoryview:
        """A writable buffer of exactly ``n`` bytes (its content is whatever was there)."""
        if n < self.MIN_BYTES:
            return bytearray(n)
        size = 1 << (n - 1).bit_length()
        free = self._free.get(size)
        return memoryview(free.pop() if free else bytearray(size))[:n]

    def give(self, data: object) -> None:
        """Take back a buffer from :meth:`take` whose bytes nothing reads any more (the
        caller's view of it is released); anything else is left alone."""
        if not isinstance(data, memoryview):
            return
        try:
            buf = data.obj
        except ValueError:  # given back already (released)
            return
        if type(buf) is not bytearray:
            return
        try:
            data.release()
        except BufferError:  # something still holds a view of it: it is not free
            return
        size = len(buf)
        if size < self.MIN_BYTES or size & (size - 1):
            return
        free = self._free.setdefault(size, [])
        if len(free) < self.KEEP and all(b is not buf for b in free):
            free.append(buf)


class FrameReader:
    """Frames parsed in place from the bytes of a connection, as asyncio's
    :class:`~asyncio.BufferedProtocol` receives them (pure: no I/O).

    :meth:`buffer` is where the next bytes go; :meth:`received` parses what arrived and
    returns the frames it completed, in order, each with the raw payload that follows it
    (``payload_of(frame)`` says how many bytes, or None: none; a ValueError from it is a
    bad frame). A payload is received straight into a buffer of its own (from ``pool``,
    if given), with no copy but the socket's. Raises :class:`FrameError` naming ``peer``
    for an oversize or undecodable frame.
    """

    MIN_FREE = 64 * 1024  # the socket is offered at least this much room per read

    def __init__(
        self,
        peer: str,
        payload_of: Callable[[Any], int | None],
        pool: PayloadPool | None = None,
    ) -> None:
        self.peer = peer
        self._payload_of = payload_of
        self._take = pool.take if pool is not None else bytearray
        self._buf = bytearray(4 * self.MIN_FREE)
        self._start = 0  # first byte not parsed yet
        self._end = 0  # end of the bytes received
        self._want = 0  # bytes the frame being received needs in all (header + body)
        self._payload: bytearray | memoryview | None = None  # a payload received in place
        self._payload_got = 0
        self._payload_frame: Any = None

    def buffer(self) -> memoryview:
        if self._payload is not None:
            return memoryview(self._payload)[self._payload_got :]  # type: ignore[arg-type]
        unread = self._end - self._start
        room = max(self._want, unread + self.MIN_FREE)
        if len(self._buf) - self._start < room:  # move the unread bytes to the front
            buf = self._buf if len(self._buf) >= room else bytearray(room)
            buf[:unread] = self._buf[self._start : self._end]  # same length: no resize
            self._buf, self._start, self._end = buf, 0, unread
        return memoryview(self._buf)[self._end :]

    def received(self, n: int) -> list[tuple[Any, bytearray | memoryview | None]]:
        done: list[tuple[Any, bytearray | memoryview | None]] = []
        if self._payload is not None:
            self._payload_got += n
            if self._payload_got == len(self._payload):
                done.append((self._payload_frame, self._payload))
                self._payload = self._payload_frame = None
            return done
        self._end += n
        buf = self._buf
        while self._end - self._start >= 4:
            (length,) = _LEN.unpack_from(buf, self._start)
            if length > MAX_FRAME:
                raise FrameError(
                    f"{self.peer}: frame of {length} bytes exceeds the {MAX_FRAME} byte limit"
                )
            begin, end = self._start + 4, self._start + 4 + length
            if end > self._end:
                self._want = 4 + length
                break
            self._want = 0
            with memoryview(buf) as view, view[begin:end] as body:
                try:
                    frame = unpackb(body)
                except CodecError as exc:
                    raise FrameError(f"{self.peer}: {exc}") from exc
            self._start = end
            try:
                size = self._payload_of(frame)
            except ValueError as exc:
                raise FrameError(f"{self.peer}: {exc}") from exc
            if size is None:
                done.append((frame, None))
                continue
            payload = self._take(size)
            have = min(size, self._end - self._start)
            payload[:have] = buf[self._start : self._start + have]
            self._start += have
            if have == size:
                done.append((frame, payload))
                continue
            self._payload, self._payload_got, self._payload_frame = payload, have, frame
            break  # everything buffered is consumed; the rest comes straight into it
        if self._start == self._end:
            self._start = self._end = 0
        return done
