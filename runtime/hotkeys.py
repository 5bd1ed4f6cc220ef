"""A keyed task's heaviest keys: the Space-Saving sketch (Metwally, Agrawal and El Abbadi,
2005), as TAG's time-aware key grouping measures hot keys, fed a batch at a time.

:class:`SpaceSaving` counts a stream of weighted keys in bounded memory. With ``N`` the
weight offered since it was created or cleared, ``capacity`` its number of counters and
:attr:`~SpaceSaving.floor` at most ``N / capacity``, it guarantees:

- a key it holds has ``estimate - error <= true count <= estimate``;
- a key it does not hold has a true count of at most ``floor``: every key heavier than
  ``N / capacity`` is held.

It is the mergeable form of Space-Saving (Agarwal et al., *Mergeable summaries*, 2012):
a key not held starts at ``floor`` with ``floor`` as its error, a held key adds its
weight, and once the sketch holds ``capacity + slack`` keys it keeps the ``capacity``
largest and raises ``floor`` to the smallest of those. With ``slack`` 0 it evicts on every
new key of a full sketch as the classic algorithm does, but a new key starts at ``floor``
(at most the smallest counter) rather than at the smallest counter, which only tightens
the bounds. A slack lets a batch's new keys in at a dict update each and prunes once per
``slack`` new keys, with the same guarantees (pruning a sketch grown by exact counts is
merging the two summaries).

:class:`HotKeySampler` is what a keyed task feeds per input batch: it offers the keys of a
systematic sample of the batch, every ``stride``-th record from a random offset with
``stride = len(batch) // samples`` (at least 1), each with weight ``stride``. Every record
is thus counted with probability ``1 / stride`` wherever it sits in the batch, so the
counts are unbiased estimates of the whole input; a batch costs about ``samples`` dict
updates whatever its size, and a batch smaller than ``2 * samples`` is counted exactly.
The guarantees above hold for the weighted sample: a key ``n`` of whose records were
sampled is off by about ``stride * sqrt(n)`` on top of the sketch's error.

Keys equal in Python (``1``, ``1.0``, ``True``) share a counter.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from operator import itemgetter
from typing import NamedTuple

__all__ = ["HotKey", "HotKeySampler", "SpaceSaving"]


class HotKey(NamedTuple):
    """A key the sketch holds: its estimated count and the most that overcounts it by."""

    key: Hashable
    count: int
    error: int


class SpaceSaving:
    """The Space-Saving sketch of the heaviest keys (see the module docstring). Holds at
    most ``capacity + slack`` keys (``slack`` defaults to ``capacity``); :meth:`top`
    prunes to ``capacity``."""

    __slots__ = ("_counts", "_errors", "capacity", "floor", "slack", "total")

    def __init__(self, capacity: int, slack: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a Space-Saving sketch needs at least 1 counter, got {capacity}")
        self.capacity = capacity
        self.slack = capacity if slack is None else slack
        if self.slack < 0:
            raise ValueError(f"slack must be >= 0, got {self.slack}")
        self.total = 0  # N: the weight offered since the last clear
        self.floor = 0  # the most a key not held can have been offered
        self._counts: dict[Hashable, int] = {}
        self._errors: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    def estimate(self, key: Hashable) -> HotKey:
        """The key's counter; for a key not held, its bound: count and error both ``floor``
        (its true count is between 0 and ``floor``)."""
        if key in self._counts:
            return HotKey(key, self._counts[key], self._errors[key])
        return HotKey(key, self.floor, self.floor)

    def offer(self, key: Hashable, weight: int = 1) -> None:
        """Count ``weight`` (> 0) more of ``key``."""
        self.offer_each((key,), weight)

    def offer_each(self, keys: Iterable[Hashable], weight: int = 1) -> None:
        """Count ``weight`` (> 0) for each of ``keys`` (a key may come several times)."""
        counts, errors = self._counts, self._errors
        floor = self.floor
        get = counts.get
        n = 0
        for key in keys:
            n += 1
            c = get(key)
            if c is None:
                counts[key] = floor + weight
                errors[key] = floor
            else:
                counts[key] = c + weight
        self.total += n * weight
        if len(counts) > self.capacity + self.slack:
            self._keep_largest()

    def _keep_largest(self) -> None:
        """Keep the ``capacity`` largest counters (any of those tied at the cut); ``floor``
        becomes the smallest kept. (C-level sorting and copying: no loop per key here.)"""
        ranked = sorted(self._counts.items(), key=itemgetter(1), reverse=True)
        kept = dict(ranked[: self.capacity])
        self._errors = dict(zip(kept, map(self._errors.__getitem__, kept), strict=True))
        self._counts = kept
        self.floor = ranked[self.capacity - 1][1]

    def top(self, n: int) -> list[HotKey]:
        """The ``n`` (at most ``capacity``) largest counters, largest first (ties: smaller
        error first); prunes the sketch to ``capacity`` keys."""
        if len(self._counts) > self.capacity:
            self._keep_largest()
        errors = self._errors
        ranked = sorted(self._counts.items(), key=lambda kc: (-kc[1], errors[kc[0]]))
        return [HotKey(k, c, errors[k]) for k, c in ranked[:n]]

    def clear(self) -> None:
        """Forget everything: a new window starts."""
        self.total = 0
        self.floor = 0
        self._counts = {}
        self._errors = {}


class HotKeySampler:
    """A keyed task's hot keys since the last :meth:`take`, fed once per input batch with
    about ``samples`` of its records (see the module docstring)."""

    __slots__ = ("_random", "samples", "sketch")

    def __init__(self, capacity: int, samples: int, seed: int | None = None) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.sketch = SpaceSaving(capacity)
        self.samples = samples
        self._random = random.Random(seed).random

    def feed(self, key_fn: Callable, values: Sequence) -> None:
        """Count the keys (``key_fn`` of each record) of a batch's sample."""
        stride = len(values) // self.samples
        if stride > 1:
            values = values[int(self._random() * stride) :: stride]
        else:
            stride = 1
        self.sketch.offer_each(map(key_fn, values), stride)

    def take(self, n: int) -> list[HotKey]:
        """The ``n`` heaviest keys since the last call, heaviest first; then the sketch
        starts afresh."""
        top = self.sketch.top(n)
        self.sketch.clear()
        return top
