"""State handed over between tasks during a reconfiguration (worker to worker).

A key group's exported state (bytes) or a source's replay position leaves its old owner
in chunks of at most ``STATE_CHUNK_BYTES`` on a data connection to the new owner's
worker that carries only state (records never wait behind it), never through the
control plane; between tasks of one worker it is handed over as an
object. Each chunk is a ``[STATE, rid, task, part, seq, total, raw, nbytes]`` frame
followed by ``nbytes`` of the payload as they are (not msgpack-encoded: state is copied
as little as possible on its way). The receiving worker's :class:`StateInbox` collects
the parts until the new owner's update takes them.

A key group copied ahead (:mod:`runtime.precopy`) arrives as two parts: its copy
(``base:<group>``, during the prepare), which the inbox reads at once if the worker's
tasks have no input waiting, else keeps aside until they have caught up
(:meth:`StateInbox.read_copies`, at idle priority); then what changed since
(``delta:<group>``, in the update), which the inbox applies to it (reading the copy first
if that has not happened yet); the update then takes the group as if it had come whole.

State from other workers comes in buffers of the worker's
:class:`~runtime.protocol.PayloadPool`: a part, once read, gives its buffer back
(:meth:`StateInbox.recycle`) for the next one, so receiving a task's state faults in
fresh memory only for the state itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from . import precopy, protocol
from .codec import packb, unpackb
from .peerlink import PeerLink

__all__ = [
    "PRECOPY_IDLE_BUDGET_S",
    "STATE_CHUNK_BYTES",
    "IdleBudget",
    "StateInbox",
    "send_state",
    "ships_within",
]

logger = logging.getLogger(__name__)

# Key-group state travels in chunks of at most this size: the receiver puts a part
# together from whole chunks, and most key groups are one chunk.
STATE_CHUNK_BYTES = 4 << 20
# Copies made ahead go at idle priority on each end (sent by runtime.copyahead, read by
# StateInbox.read_copies), but each end waits for idle moments at most this long in all
# per reconfiguration: a worker with none (saturated, or catching up; often the one a
# migration is to relieve) held each key group for the whole WorkerProcess.caught_up wait, and
# a sender waiting for a receiver's room with it: 3.4 s for 64 groups of 12 MB in a test,
# 1.3 s with this bound. Past it, a group goes per turn of the loop. At half load the
# waits came to 24-602 ms per copy ahead of 100 MB (bench/reconfig.py). Not a wait that
# ends early once the worker is found busy: copying at once then kept it busy, and at half
# load p99 after a change went from 15 to 86 ms (measured A/B against this bound).
PRECOPY_IDLE_BUDGET_S = 1.0


class IdleBudget:
    """What one end of one reconfiguration's copying ahead has waited for idle moments,
    and the wait for the next one while that is under ``PRECOPY_IDLE_BUDGET_S``."""

    def __init__(self, rid: int = 0) -> None:
        self.rid = rid
        self.spent = 0.0  # seconds waited so far

    async def wait(self, caught_up: Callable[[], Awaitable[None]]) -> None:
        """Await ``caught_up()`` unless the budget is spent (the last wait may end one
        wait past it)."""
        if self.spent < PRECOPY_IDLE_BUDGET_S:
            start = time.perf_counter()
            await caught_up()
            self.spent += time.perf_counter() - start


def ships_within(
    left: int, pause_s: float, sent: int, sending_s: float, read: int, reading_s: float
) -> bool:
    """Whether the ``left`` bytes not copied ahead would ship within ``pause_s`` at the
    pace the copies went: the sender's seconds per byte (``sending_s`` for the ``sent``
    bytes: pickling and writing) plus the receivers' (``reading_s`` for the ``read``
    bytes they have read so far; the sender's alone until they have read any). The two
    add up: in a swap each worker does both in the update, and counted alone the
    sender's share left pauses three times the budget (docs/design.md, "Pre-copy");
    where the ends overlap (one worker sending, another reading), the pause comes out
    under the budget instead."""
    if sent <= 0:
        return left <= 0
    per_byte = sending_s / sent + (reading_s / read if read > 0 else 0.0)
    return left * per_byte <= pause_s


async def send_state(link: PeerLink, rid: int, dest: str, part: Any, data: Any, raw: bool) -> None:
    """Send ``data`` for task ``dest`` in chunks; ``raw`` bytes go as they are (a list of
    bytes-like pieces goes as one payload, their concatenation, without joining them),
    anything else msgpack-encoded (decoded on arrival)."""
    if raw and isinstance(data, list):
        pieces = [memoryview(piece).cast("B") for piece in data]
    else:
        pieces = [memoryview(data if raw else packb(data)).cast("B")]
    size = sum(len(piece) for piece in pieces)
    total = max(1, -(-size // STATE_CHUNK_BYTES))
    chunks = _chunks(pieces, STATE_CHUNK_BYTES)
    for seq in range(total):
        chunk = next(chunks, [])
        link.send([protocol.STATE, rid, dest, part, seq, total, raw, sum(map(len, chunk))])
        link.writer.writelines(chunk)
        await link.writer.drain()


def _chunks(pieces: list[memoryview], most: int) -> Iterator[list[memoryview]]:
    """``pieces`` regrouped into runs of ``most`` bytes (the last may be shorter), each
    a list of views of them."""
    run: list[memoryview] = []
    room = most
    for piece in pieces:
        while len(piece) > 0:
            take = piece[:room]
            run.append(take)
            piece = piece[len(take) :]
            room -= len(take)
            if room == 0:
                yield run
                run, room = [], most
    if run:
        yield run


def _is_copy(part: Any) -> bool:
    """Whether handover ``part`` is a copy made ahead (see :func:`precopy.part_name`)."""
    named = precopy.parse_part(part)
    return named is not None and named[0] == "base"


class StateInbox:
    """Key-group state (and source positions) arriving for tasks on this worker.

    Parts arrive from other workers in chunks, or from tasks on this worker as objects; a
    task's update waits for the parts it expects with :meth:`take`.
    """

    def __init__(
        self,
        pool: protocol.PayloadPool | None = None,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        self._pool = pool or protocol.PayloadPool()  # the buffers received state came in
        # True while the worker's tasks have no input waiting: a copy ahead that comes
        # then is read at once, and its buffer takes the next one.
        self._idle = idle
        self._parts: dict[tuple[int, str], dict[Any, Any]] = {}
        self._chunks: dict[tuple[int, str, Any], list[bytes | bytearray | memoryview | None]] = {}
        # Copies ahead, by (rid, task, group): as they came, then read (store, memo).
        self._unread: dict[tuple[int, str, int], Any] = {}
        self._bases: dict[tuple[int, str, int], tuple[dict, Any]] = {}
        # Who to tell that an unread copy was read (its sender paces its copying by it), and
        # in how many seconds (its sender counts them in the pause the rest would take).
        self._on_read: dict[tuple[int, str, int], Callable[[int, float], None]] = {}
        self._copy_came = asyncio.Event()
        self._budget = IdleBudget()  # of the reconfiguration whose copies it last read
        self._dropped: set[int] = set()  # reconfigurations aborted here: late parts go
        self._changed = asyncio.Event()

    def put(
        self,
        rid: int,
        task: str,
        part: Any,
        data: Any,
        on_read: Callable[[int, float], None] | None = None,
    ) -> None:
        """A part of ``task``'s state for reconfiguration ``rid``; ``on_read(1, seconds)`` is
        called once a copy made ahead has been read, with the seconds reading it took (0.0
        when it was dropped unread)."""
        if rid in self._dropped:
            if on_read is not None and _is_copy(part):
                on_read(1, 0.0)
            return
        named = precopy.parse_part(part)
        if named is not None:  # a copy ahead, or a delta to it
            part, data = self._precopied(rid, task, *named, data, on_read)
            if part is None:
                return
        self._parts.setdefault((rid, task), {})[part] = data
        self._changed.set()

    def _precopied(
        self,
        rid: int,
        task: str,
        kind: str,
        group: int,
        data: Any,
        on_read: Callable[[int, float], None] | None,
    ) -> tuple:
        """Keep a copy ahead aside (nothing to take yet); apply a delta to its copy, giving
        the group's state (or the error a task's update raises when it takes it)."""
        key = (rid, task, group)
        if kind == "base":
            self._unread[key] = data
            if on_read is not None:
                self._on_read[key] = on_read
            if self._idle is not None and self._idle():
                self._read(key)
            else:
                self._copy_came.set()
            return None, None
        self._read(key)
        base = self._bases.pop(key, None)
        if base is None:
            return group, ValueError(
                f"the changes to key group {group} came without a readable copy made ahead"
            )
        try:
            return group, precopy.apply_delta(base[0], base[1], data)
        except Exception as exc:
            return group, ValueError(f"the changes to key group {group} do not apply: {exc}")
        finally:
            self.recycle(data)

    def _read(self, key: tuple[int, str, int]) -> None:
        data = self._unread.pop(key, None)
        if data is None:
            return
        t0 = time.perf_counter()
        try:
            self._bases[key] = precopy.load_base(data)
        except Exception:  # its delta will say so, to the task's update
            logger.exception("the copy ahead of key group %s of %s is unreadable", key[2], key[1])
        finally:
            self.recycle(data)
            self._told_read(key, time.perf_counter() - t0)

    def _told_read(self, key: tuple[int, str, int], seconds: float = 0.0) -> None:
        on_read = self._on_read.pop(key, None)
        if on_read is not None:
            on_read(1, seconds)

    def recycle(self, data: Any) -> None:
        """``data`` (a part taken from here) has been read and is referred to no more: the
        buffer it came in can take the next state that arrives."""
        self._pool.give(data)

    async def read_copies(self, caught_up: Callable[[], Awaitable[None]]) -> None:
        """Read the copies made ahead as they come, one at a time, each once ``caught_up``
        returns (the worker's tasks have no input waiting): receiving state ahead goes at
        idle priority, as sending it does, for ``PRECOPY_IDLE_BUDGET_S`` of waits per
        reconfiguration (the last may end one wait past it). Runs until cancelled."""
        while True:
            await self._copy_came.wait()
            self._copy_came.clear()
            while self._unread:
                rid = next(iter(self._unread))[0]
                if self._budget.rid != rid:
                    self._budget = IdleBudget(rid)
                await self._budget.wait(caught_up)
                if self._unread:
                    self._read(next(iter(self._unread)))
                    await asyncio.sleep(0)  # the tasks see the input that came meanwhile

    def put_frame(
        self,
        frame: tuple,
        chunk: bytes | bytearray | memoryview,
        on_read: Callable[[int, float], None] | None = None,
    ) -> None:
        """A ``[STATE, rid, task, part, seq, total, raw, nbytes]`` frame from a peer and the
        ``chunk`` of payload that followed it; ``on_read`` as for :meth:`put`."""
        _, rid, task, part, seq, total, raw, _nbytes = frame
        if rid in self._dropped:
            if on_read is not None and seq == total - 1 and _is_copy(part):
                on_read(1, 0.0)
            return
        key = (rid, task, part)
        chunks = self._chunks.setdefault(key, [None] * total)
        chunks[seq] = chunk
        if all(c is not None for c in chunks):
            del self._chunks[key]
            data = chunks[0] if total == 1 else b"".join(chunks)  # type: ignore[arg-type]
            if total > 1:
                for c in chunks:
                    self.recycle(c)
            if not raw:
                decoded = unpackb(data)
                self.recycle(data)
                data = decoded
            self.put(rid, task, part, data, on_read)

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
        """Forget what came for reconfiguration ``rid`` (aborted); parts of it still on
        their way are dropped as they arrive."""
        self._dropped.add(rid)
        for key in [k for k in self._parts if k[0] == rid]:
            del self._parts[key]
        for key in [k for k in self._chunks if k[0] == rid]:
            del self._chunks[key]
        for key in [k for k in self._bases if k[0] == rid]:
            del self._bases[key]
        for key in [k for k in self._unread if k[0] == rid]:
            del self._unread[key]
            self._told_read(key)
