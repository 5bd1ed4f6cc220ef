"""The partial side of a combinable aggregation (:mod:`runtime.aggregate`): accumulators
per key and part, emitted once per key and batch, split keys spread over tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..aggregate import SplitPart, snapshot
from ..state import KeyGroupNotOwnedError
from .basic import KeyedProcessor, UserCodeError, _short

__all__ = ["AggregateProcessor"]

_MISSING = object()


class AggregateProcessor(KeyedProcessor):
    """Folds each batch into the accumulators of its keys and emits ``(key, part, acc)``
    once per key and part touched, stamped with the oldest of the key's records in the
    batch (so the sinks' latency counts from the first record an update includes).

    A record of a split key (:attr:`splits`) is folded into the part this task holds
    (:meth:`split_part`). The upstream edge spread the key's records over the owners of
    those groups (:class:`runtime.partitioning.KeyGroupEdge`).
    """

    def process(self, key_fn: Any, values: Sequence, stamps: Sequence[float]) -> None:
        kg_of = self.key_group
        cached = kg_of.cache.get
        splits = self.splits
        groups = self.state.groups()
        awaiting = self.awaiting
        batch: list[tuple[Any, int, Any, Any, float]] = []
        v = k = None
        try:
            for v, t in zip(values, stamps, strict=True):
                k = key_fn(v)
                try:
                    g = cached(k)
                except TypeError:  # unhashable: the hasher names the key type
                    g = None
                if g is None:
                    g = kg_of(k)
                sk = k
                if splits:
                    parts = splits.get(k)
                    if parts is not None:
                        g, sk = self.split_part(k, g, parts)
                if g not in groups:
                    waiting = awaiting.get(g)
                    if waiting is None:
                        raise KeyGroupNotOwnedError(self.task_id, g)
                    waiting.append((k, v, t))  # its state is on its way
                    continue
                batch.append((k, g, sk, v, t))
        except KeyGroupNotOwnedError as exc:
            raise UserCodeError(f"{exc.args[0]} (record {_short(v)}, key {_short(k)})") from exc
        except Exception as exc:
            raise self._fail(exc, v, k, keyed=True) from exc
        self._fold(batch)

    def arrive(self, group: int, data: Any) -> None:
        """The state of an awaited ``group`` arrived: own it, then fold its waiting records."""
        self.state.take_in(group, data)
        waiting = self.awaiting.pop(group, None)
        if waiting:
            kg_of = self.key_group
            self._fold(
                [(k, group, k if kg_of(k) == group else SplitPart(k), v, t) for k, v, t in waiting]
            )

    def _fold(self, batch: list[tuple[Any, int, Any, Any, float]]) -> None:
        """Fold ``(key, group, state key, record, stamp)`` in order, then emit each touched
        accumulator once."""
        agg = self.fn.agg
        create, add = agg.create, agg.add
        groups = self.state.groups()
        counts = self.metrics.key_group_counts
        touched = self.touched or None
        changed = self.changed
        first: dict[tuple[int, Any], tuple[Any, float]] = {}
        k = v = None
        try:
            for k, g, sk, v, t in batch:
                store = groups[g]
                counts[g] += 1
                if touched is not None and g in touched:
                    touched[g].add(sk)
                if changed is not None:
                    changed[g].add(sk)
                acc = store.get(sk, _MISSING)
                store[sk] = add(create() if acc is _MISSING else acc, v)
                if (g, sk) not in first:
                    first[(g, sk)] = (k, t)
        except Exception as exc:
            raise self._fail(exc, v, k, keyed=True) from exc
        if first:
            self.outputs.emit(
                [(k, g, snapshot(groups[g][sk])) for (g, sk), (k, _t) in first.items()],
                [t for _k, t in first.values()],
            )
