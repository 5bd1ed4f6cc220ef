"""State handed over between tasks during a reconfiguration (worker to worker).

A key group's exported state (bytes) or a source's replay position leaves its old owner
in chunks of at most ``STATE_CHUNK_BYTES`` on the data link to the new owner's worker,
never through the control plane; between tasks of one worker it is handed over as an
object. Each chunk is a ``[STATE, rid, task, part, seq, total, raw, nbytes]`` frame
followed by ``nbytes`` of the payload as they are (not msgpack-encoded: state is copied
as little as possible on its way). The receiving worker's :class:`StateInbox` collects
the parts until the new owner's update takes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from . import protocol
from .channels import PeerLink
from .codec import packb, unpackb

__all__ = ["STATE_CHUNK_BYTES", "StateInbox", "send_state"]

# Key-group state travels in chunks of at most this size: data frames on the same link
# wait behind at most one chunk (a few ms), and most key groups are one chunk.
STATE_CHUNK_BYTES = 4 << 20


async def send_state(link: PeerLink, rid: int, dest: str, part: Any, data: Any, raw: bool) -> None:
    """Send ``data`` for task ``dest`` in chunks; ``raw`` bytes go as they are, anything
    else msgpack-encoded (decoded on arrival)."""
    payload = memoryview(data if raw else packb(data))
    total = max(1, -(-len(payload) // STATE_CHUNK_BYTES))
    for seq in range(total):
        chunk = payload[seq * STATE_CHUNK_BYTES : (seq + 1) * STATE_CHUNK_BYTES]
        link.send([protocol.STATE, rid, dest, part, seq, total, raw, len(chunk)])
        link.writer.write(chunk)
        await link.writer.drain()


class StateInbox:
    """Key-group state (and source positions) arriving for tasks on this worker.

    Parts arrive from other workers in chunks, or from tasks on this worker as objects; a
    task's update waits for the parts it expects with :meth:`take`.
    """

    def __init__(self) -> None:
        self._parts: dict[tuple[int, str], dict[Any, Any]] = {}
        self._chunks: dict[tuple[int, str, Any], list[bytes | bytearray | None]] = {}
        self._changed = asyncio.Event()

    def put(self, rid: int, task: str, part: Any, data: Any) -> None:
        self._parts.setdefault((rid, task), {})[part] = data
        self._changed.set()

    def put_frame(self, frame: tuple, chunk: bytes | bytearray) -> None:
        """A ``[STATE, rid, task, part, seq, total, raw, nbytes]`` frame from a peer and the
        ``chunk`` of payload that followed it."""
        _, rid, task, part, seq, total, raw, _nbytes = frame
        key = (rid, task, part)
        chunks = self._chunks.setdefault(key, [None] * total)
        chunks[seq] = chunk
        if all(c is not None for c in chunks):
            del self._chunks[key]
            data = chunks[0] if total == 1 else b"".join(chunks)  # type: ignore[arg-type]
            self.put(rid, task, part, data if raw else unpackb(data))

    async def take(self, rid: int, task: str, parts: set[Any]) -> dict[Any, Any]:
        """Wait until every part in ``parts`` arrived for ``task``; remove and return them."""
        return {part: data async for part, data in self.arrivals(rid, task, parts)}

    async def arrivals(
        self, rid: int, task: str, parts: set[Any]
    ) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(part, data)`` for every part in ``parts`` as soon as each has arrived
        (removed from the inbox), until all have."""
        left = set(parts)
        while left:
            got = self._parts.get((rid, task), {})
            ready = sorted(left & got.keys(), key=repr)
            if not ready:
                self._changed.clear()
                await self._changed.wait()
                continue
            for part in ready:
                left.discard(part)
                yield part, got.pop(part)

    def drop(self, rid: int) -> None:
        for key in [k for k in self._parts if k[0] == rid]:
            del self._parts[key]
        for key in [k for k in self._chunks if k[0] == rid]:
            del self._chunks[key]
