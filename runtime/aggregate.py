"""Running aggregations per key whose hot keys can be split over several tasks (TAG).

``stream.key_by(k).aggregate("count", Count())`` keeps one accumulator per key (any
:class:`~runtime.windows.Aggregate`: ``Count``, ``Sum``, ``Min``, ``Max``, ``Mean``,
``Reduce``, or one's own with an associative ``merge``) and emits ``(key, result)`` as
the key's value changes. It compiles to two keyed operators:

- ``count`` (the *partial* side, :class:`PartialAggregate`): each task folds the records
  of a batch into the accumulators of the keys they carry, then emits each key's
  accumulator once per batch as ``(key, part, acc)``;
- ``count.merge`` (:class:`MergeAggregate`): keeps, per key, the latest accumulator of
  each part and emits ``(key, result(merge of the parts))``.

A key lives in one part, its key group, until a plan **splits** it (the ``splitKey``
operation): its records are then spread round-robin over several tasks, each folding
them into a partial accumulator held in one of its own key groups (the key's home group
for the task that owns it, another group of the task for the others), and the merge
adds the parts up. Turning a split off routes the key to its home group again; the
other parts stay as they are in the merge (their values are final), so nothing is
counted twice or lost, and nothing moves when a split turns on or off: it is a change
of routing, made at a reconfiguration barrier like any other.

A partial accumulator is stored in its key group under :class:`SplitPart` ``(key)`` when
that group is not the key's home: it moves, is checkpointed and restored with the group.
Emitting once per key and batch is what makes a split pay: the merge task of a hot key
receives one update per part and batch, not one per record. The windowed equivalent,
which sends a part once per window, is :mod:`runtime.window_aggregate`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "MergeAggregate",
    "PartialAggregate",
    "SplitPart",
    "check_combinable",
    "merged",
    "part_key",
]

_IMMUTABLE = (int, float, str, bytes, bool, tuple, type(None))


class SplitPart(NamedTuple):
    """The state key of a split key's partial accumulator held outside its home group."""

    key: Any


def check_combinable(agg: Any) -> None:
    """Raise ValueError unless ``agg`` is an aggregate whose accumulators merge."""
    from .windows import Aggregate

    if not isinstance(agg, Aggregate):
        raise ValueError(
            f"aggregate must be an Aggregate (Count(), Sum(of), ...), got {type(agg).__name__}"
        )
    if type(agg).merge is Aggregate.merge:
        raise ValueError(
            f"{type(agg).__name__} has no merge(a, b): a split key's parts could not be "
            "combined; define merge (associative) to aggregate with it"
        )


def part_key(record: tuple) -> Any:
    """The key of a partial result ``(key, part, acc)``: what the merge is keyed by."""
    return record[0]


def snapshot(acc: Any) -> Any:
    """``acc`` as emitted downstream: a copy when it could be changed in place later."""
    return acc if type(acc) in _IMMUTABLE else copy.deepcopy(acc)


def merged(agg: Any, accs: Iterable[Any]) -> Any:
    """The merge of the parts' accumulators ``accs`` (one at least), none of them changed."""
    values = iter(accs)
    total = snapshot(next(values))  # merge may change its first argument in place
    for acc in values:
        total = agg.merge(total, acc)
    return total


@dataclass(frozen=True)
class PartialAggregate:
    """The partial side's logic: ``agg`` folded per key and part (see the module
    docstring; :class:`runtime.operators.aggregate.AggregateProcessor` runs it)."""

    agg: Any


@dataclass(frozen=True)
class MergeAggregate:
    """The merge side's logic: ``fn(key, (key, part, acc), state)`` keeps the latest
    accumulator of each part and returns ``(key, result)`` over all of them."""

    agg: Any

    def __call__(self, key: Any, record: tuple, state: Any) -> tuple[tuple[Any, Any]]:
        parts = state.get()
        if parts is None:
            parts = {}
        parts[record[1]] = record[2]
        state.set(parts)
        return ((key, self.agg.result(merged(self.agg, parts.values()))),)
