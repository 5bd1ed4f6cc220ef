"""Routing of a task's output records to the channels of its downstream tasks.

One :class:`Edge` per downstream operator, by the partitioning of that input:

- ``forward``: to the downstream task with the same index.
- ``rebalance``: whole emitted batches spread over the downstream tasks by smooth weighted
  round-robin (weights from the abstraction's workload; equal by default).
- ``key_groups``: per record, to the task owning ``key_group(key(record))``, through an
  owner table that the reconfiguration protocol swaps atomically; the records of a split
  key (:mod:`runtime.aggregate`) turn by turn to the owners of its parts' groups.
- ``broadcast``: to every downstream task.

:class:`Outputs` holds the edges of one task, the pending records of each channel, and the
batching policy: a channel's records are sent when ``batch_size`` are pending, when the
oldest pending record is ``linger_s`` old, or when the task runs out of input.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .channels import OutputChannel
from .keygroups import KeyGroupHasher
from .records import Barrier, EndOfStream, Watermark

__all__ = ["BroadcastEdge", "Edge", "ForwardEdge", "KeyGroupEdge", "Outputs", "RebalanceEdge"]


class Edge:
    """Routes emitted records of one task to the channels of one downstream operator."""

    def __init__(self, operator: str, channels: Sequence[OutputChannel]) -> None:
        self.operator = operator
        self.channels = list(channels)

    def route(self, values: Sequence, stamps: Sequence[float]) -> None:
        raise NotImplementedError


class ForwardEdge(Edge):
    def route(self, values: Sequence, stamps: Sequence[float]) -> None:
        ch = self.channels[0]
        ch.buf_v.extend(values)
        ch.buf_t.extend(stamps)


class BroadcastEdge(Edge):
    def route(self, values: Sequence, stamps: Sequence[float]) -> None:
        for ch in self.channels:
            ch.buf_v.extend(values)
            ch.buf_t.extend(stamps)


class RebalanceEdge(Edge):
    """Smooth weighted round-robin (as in nginx) over channels, per emitted batch."""

    def __init__(
        self,
        operator: str,
        channels: Sequence[OutputChannel],
        weights: Sequence[float] | None = None,
    ) -> None:
        super().__init__(operator, channels)
        self.set_weights(weights or [1.0] * len(self.channels))

    def set_weights(self, weights: Sequence[float]) -> None:
        if (
            len(weights) != len(self.channels)
            or not all(math.isfinite(w) and w >= 0 for w in weights)
            or sum(weights) <= 0
        ):
            raise ValueError(f"edge to {self.operator!r}: bad weights {list(weights)}")
        self.weights = [float(w) for w in weights]
        self._current = [0.0] * len(self.weights)
        self._total = sum(self.weights)

    def route(self, values: Sequence, stamps: Sequence[float]) -> None:
        cur, w = self._current, self.weights
        best = 0
        for i in range(len(cur)):
            cur[i] += w[i]
            if cur[i] > cur[best]:
                best = i
        cur[best] -= self._total
        ch = self.channels[best]
        ch.buf_v.extend(values)
        ch.buf_t.extend(stamps)


class KeyGroupEdge(Edge):
    """Per-record routing by key group; ``owner[g]`` is the index of the owning channel."""

    def __init__(
        self,
        operator: str,
        channels: Sequence[OutputChannel],
        key_fn: Callable,
        key_group_fn: KeyGroupHasher,
        owner: Sequence[int],
        splits: Mapping[Any, Sequence[int]] | None = None,
    ) -> None:
        super().__init__(operator, channels)
        self.key_fn = key_fn
        self.key_group_fn = key_group_fn
        self.splits = dict(splits or {})
        self.set_owner(owner)

    def set_owner(self, owner: Sequence[int]) -> None:
        """Swap the routing table (one assignment: atomic for the single-threaded task)."""
        n = len(self.channels)
        expected = self.key_group_fn.max_parallelism
        if len(owner) != expected:
            raise ValueError(
                f"edge to {self.operator!r}: owner table has {len(owner)} entries, "
                f"expected one per key group ({expected})"
            )
        bad = [g for g, o in enumerate(owner) if not 0 <= o < n]
        if bad:
            raise ValueError(f"edge to {self.operator!r}: key groups {bad[:10]} have no owner")
        self._targets = [(self.channels[o].buf_v, self.channels[o].buf_t) for o in owner]
        self.owner = list(owner)
        # A split key's records go round-robin to the owners of its parts' groups.
        self._split: dict[Any, tuple[list, int]] = {}  # key -> (owners' buffers, next turn)
        for key, groups in self.splits.items():
            owners = {id(self._targets[g][0]): self._targets[g] for g in groups}
            self._split[key] = (list(owners.values()), 0)

    def route(self, values: Sequence, stamps: Sequence[float]) -> None:
        if self._split:
            self._route_split(values, stamps)
            return
        key_fn, kg, targets = self.key_fn, self.key_group_fn, self._targets
        cached = kg.cache.get
        for v, t in zip(values, stamps, strict=True):
            k = key_fn(v)
            try:
                g = cached(k)
            except TypeError:  # unhashable: the hasher names the key type
                g = None
            bv, bt = targets[kg(k) if g is None else g]
            bv.append(v)
            bt.append(t)

    def _route_split(self, values: Sequence, stamps: Sequence[float]) -> None:
        """:meth:`route` while some keys are split: theirs turn by turn to each owner."""
        key_fn, kg, targets, split = self.key_fn, self.key_group_fn, self._targets, self._split
        cached = kg.cache.get
        for v, t in zip(values, stamps, strict=True):
            k = key_fn(v)
            try:
                g = cached(k)
                spread = split.get(k)
            except TypeError:  # unhashable: the hasher names the key type
                g = spread = None
            if spread is None:
                bv, bt = targets[kg(k) if g is None else g]
            else:
                owners, turn = spread
                bv, bt = owners[turn]
                split[k] = (owners, (turn + 1) % len(owners))
            bv.append(v)
            bt.append(t)


class Outputs:
    """The output edges of one task and its batching policy."""

    def __init__(self, edges: Sequence[Edge], batch_size: int, linger_s: float) -> None:
        self.watermark: Watermark | None = None  # the last watermark (or idle mark) sent
        self.resend = False  # channels were added since: send it again
        self.set_edges(edges)
        self.batch_size = batch_size
        self.linger_s = linger_s
        self._since: float | None = None  # when the oldest pending record was emitted
        self.records_out = 0

    def set_edges(self, edges: Sequence[Edge]) -> None:
        """Swap the routing (between batches: nothing may be pending). Once a watermark
        was sent, the task sends it again (:meth:`resend_watermark`): new channels start
        without one."""
        before = set(getattr(self, "channels", ()))
        self.edges = list(edges)
        self.channels: list[OutputChannel] = list(
            {id(ch): ch for e in self.edges for ch in e.channels}.values()
        )
        if not set(self.channels) <= before:
            self.resend = self.watermark is not None

    def channel_map(self) -> dict[str, OutputChannel]:
        """Current channels by target task (reused when edges are rebuilt)."""
        return {ch.target: ch for ch in self.channels}

    def emit(self, values: Sequence, stamps: Sequence[float]) -> None:
        """Route records into the channels' pending buffers (no I/O)."""
        if not values:
            return
        self.records_out += len(values)
        if self._since is None:
            self._since = time.monotonic()
        for edge in self.edges:
            edge.route(values, stamps)

    async def flush(self, force: bool = False) -> None:
        """Send full batches; send everything if ``force`` or the linger time has passed."""
        if self._since is None:
            return
        if not force and time.monotonic() - self._since < self.linger_s:
            size = self.batch_size
            for ch in self.channels:
                if len(ch.buf_v) >= size:
                    await ch.flush(size, whole_batches_only=True)
            if not any(ch.buf_v for ch in self.channels):
                self._since = None
            return
        self._since = None
        for ch in self.channels:
            await ch.flush(self.batch_size)

    def flush_deadline(self) -> float | None:
        """When (``time.monotonic``) pending records must be sent, or None if none pend."""
        return None if self._since is None else self._since + self.linger_s

    async def broadcast(self, item: Barrier | Watermark | EndOfStream) -> None:
        """Flush all pending records, then send ``item`` on every channel, in order."""
        self._since = None
        if type(item) is Watermark:
            self.watermark = item
            self.resend = False
        for ch in self.channels:
            await ch.send_control(item, self.batch_size)

    async def resend_watermark(self) -> None:
        """Send the last watermark again on every channel (see :meth:`set_edges`); a
        receiver ignores what does not raise its own."""
        if self.resend and self.watermark is not None:
            await self.broadcast(self.watermark)
        self.resend = False

    def backpressure_s(self) -> float:
        return sum(ch.backpressure_s for ch in self.channels)
