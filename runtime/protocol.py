"""The wire protocol between the coordinator and workers, and between workers.

This is the one module the control plane uses to talk to workers. Every connection
carries length-prefixed frames: a 4-byte big-endian length, then a msgpack body.

Control connection (worker dials the coordinator). Messages are msgpack maps with a
``type`` field; the worker speaks first:

1. worker -> ``register`` {secret, host, pid, cpus, memory_mb, data_host, data_port, name}
2. coordinator -> ``registered`` {worker_id, heartbeat_s} or ``refused`` {reason}, then closes.
3. coordinator -> ``deploy`` {job_id, graph (pickled JobGraph), layout (see
   :class:`runtime.layout.Layout`), workers {worker: [host, port]}, config {batch_size,
   linger_s, credits}, code {module: source} (uploaded modules the pickles name, see
   :mod:`runtime.codeload`; installed before unpickling)}
   worker -> ``deployed`` {job_id} or ``deploy_failed`` {job_id, error}
4. coordinator -> ``start`` {job_id}; worker -> ``started`` {job_id}
5. worker -> ``metrics`` {worker_id, time, cpu_percent, rss_mb, jobs {job: {task: snapshot}}}
   every second; worker -> ``task_finished`` {job_id, task} and
   ``task_failed`` {job_id, task, error}; coordinator -> ``stop`` {job_id}.
   coordinator -> ``inject_barrier`` {job_id, kind, id}; worker -> ``barrier_ack``
   {job_id, task, kind, id} for checkpoint barriers.
6. Reconfiguration (see :mod:`runtime.deployment`): coordinator -> ``prepare`` {job_id,
   rid, barrier_id, layout, affected, workers, code}; worker -> ``prepared`` / ``prepare_failed``
   {job_id, rid, error}; the reconfiguration barrier is injected; worker -> ``paused``
   {job_id, rid, task} per affected task; coordinator -> ``update`` {job_id, rid};
   worker -> ``updated`` {job_id, rid, task, pause_ms, update_ms} per task, or
   ``update_failed`` {job_id, rid, error}; coordinator -> ``abort`` {job_id, rid}.
7. When the control connection closes, the worker stops its tasks and exits.

Data connection (the sending worker dials the receiving worker's data address): the first
frame is ``[HELLO, worker_id, secret]``; then ``[DATA, channel, values, timestamps]``,
``[BARRIER, channel, kind, id]``, ``[END, channel]`` flow to the receiver and
``[CREDIT, [[channel, n], ...]]`` flows back on the same connection (credits returned
in one event-loop iteration travel together). During a reconfiguration, state moves on
the same links: ``[STATE, rid, task, part, seq, total, raw, nbytes]`` followed by
``nbytes`` raw bytes, outside any frame (a chunk of a key group's exported state, or of
a source position; see :func:`read_payload`). ``channel`` is
``"<job>/<upstream task>><downstream task>"`` (see :func:`channel_key`).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from .codec import CodecError, packb, unpackb

__all__ = [
    "BARRIER",
    "CREDIT",
    "DATA",
    "END",
    "HELLO",
    "MAX_FRAME",
    "STATE",
    "FrameError",
    "channel_key",
    "encode",
    "read_frame",
    "read_payload",
    "write_frame",
]

# Data-plane frame tags.
DATA, BARRIER, END, CREDIT, STATE, HELLO = 0, 1, 2, 3, 4, 9

MAX_FRAME = 256 * 1024 * 1024  # refuse absurd lengths from a corrupt or hostile peer
_LEN = struct.Struct(">I")


class FrameError(ConnectionError):
    """A frame that is too long or does not decode; the connection cannot go on."""


def channel_key(job_id: str, upstream_task: str, downstream_task: str) -> str:
    """A channel's name on the wire and in a worker's registry: unique across jobs."""
    return f"{job_id}/{upstream_task}>{downstream_task}"


def encode(obj: Any) -> bytes:
    """One frame: length prefix + msgpack body."""
    body = packb(obj)
    return _LEN.pack(len(body)) + body


def write_frame(writer: asyncio.StreamWriter, obj: Any) -> int:
    """Queue one frame on ``writer`` (call ``drain`` to respect the transport's buffer)."""
    frame = encode(obj)
    writer.write(frame)
    return len(frame)


async def read_payload(reader: asyncio.StreamReader, peer: str, length: Any) -> bytes:
    """The ``length`` raw bytes that follow a frame announcing them (a state chunk)."""
    if type(length) is not int or not 0 <= length <= MAX_FRAME:
        raise FrameError(f"{peer}: a frame announced a payload of {length!r} bytes")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"{peer}: connection closed inside a {length}-byte payload") from exc


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
