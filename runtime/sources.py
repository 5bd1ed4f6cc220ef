"""Replayable, deterministic sources: a seeded record generator (and file replay).

Both follow :mod:`runtime.io`. Every record has a *global index* 0, 1, 2, ... that does
not depend on the parallelism, and a reader's :meth:`~runtime.io.SourceReader.position`
is the global index of the next record it would emit; :meth:`seek` moves a reader to the
first record it owns at or after a given global index.

:class:`Generator`
    The stream is cut into chunks of :data:`CHUNK` records. Chunk ``c`` is generated from
    its own RNG, seeded from ``(seed, c)``, and emitted by task ``c % parallelism``, so
    the multiset of all records is the same for any parallelism and a chunk can be
    regenerated from its index alone.

    Keys are ``"k00000"``, ``"k00001"``, ... ranked by popularity: rank ``r`` has weight
    ``1 / (r + 1) ** zipf`` (``zipf=0`` is uniform). Every ``60 / omega`` seconds of
    logical time a new *epoch* starts and the mapping from rank to key is re-permuted
    from ``(seed, epoch)``, as Elasticutor's ω; epoch 0 is the identity (``k00000`` is
    the hottest key). A chunk's epoch is that of its first record. The keys are turned
    into records by the overridable hook :meth:`Generator.make_records`.

    Rates: the rate (records per second, over all tasks together) is a piecewise-linear
    function of logical time through ``(0, rate)`` and the ``schedule`` points; the
    logical time of global record ``j`` is when the cumulative count reaches ``j + 1``.
    Each task paces its own records evenly at its share of that rate (a task holding
    share ``s`` of the records emits its ``m``-th record when the cumulative count
    reaches ``(m + 1) / s``), so the tasks together follow the schedule and each task's
    output is smooth. A record's timestamp is ``start_time`` plus its due time. With
    ``rate=0`` and no schedule the generator is unthrottled: timestamps are ``now`` and
    logical time (for epochs only) runs at :data:`NOMINAL_RATE` records per second.

:class:`~runtime.replay.FileReplay` (in :mod:`runtime.replay`)
    Replays a JSON-lines or CSV file, with the same position semantics.

Errors: descriptions raise :class:`ValueError` naming the field on invalid parameters;
readers raise :class:`ValueError` naming the file (and line) for a missing file or an
unparsable line, and for an invalid seek position.
"""

from __future__ import annotations

import logging
import math
import random
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

from .io import PartitionedSource, Source, SourceReader

__all__ = [
    "CHUNK",
    "NOMINAL_RATE",
    "Generator",
    "GeneratorReader",
    "PartitionedGenerator",
    "key_names",
    "parse_schedule",
]

logger = logging.getLogger(__name__)

CHUNK = 1024
"""Records per generator chunk: the unit of generation, seeding and task ownership."""

NOMINAL_RATE = 100_000.0
"""Logical records per second of an unthrottled generator (used for reshuffle epochs only)."""

_MANY = 2.0**62
"""More records than any stream holds: caps due counts so ``poll(now=inf)`` stays finite."""

Schedule = tuple[tuple[float, float], ...]


def parse_schedule(text: str) -> Schedule:
    """Parse ``"30:1000, 30:4000, 60:8000"`` into ``((30.0, 1000.0), (30.0, 4000.0), ...)``.

    Each item is ``time_s:rate``; raises :class:`ValueError` naming the bad item.
    """
    points = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        time_s, sep, rate = item.partition(":")
        try:
            if not sep:
                raise ValueError
            points.append((float(time_s), float(rate)))
        except ValueError:
            raise ValueError(
                f"schedule item {item!r} is not time_s:rate (e.g. '30:1000, 30:4000')"
            ) from None
    return tuple(points)


def key_names(count: int) -> list[str]:
    """The generator's key names ``k00000`` ... ``k{count-1}`` (wider when count > 10**5)."""
    width = max(5, len(str(count - 1)))
    return [f"k{r:0{width}d}" for r in range(count)]


def _check_number(owner: str, name: str, value: Any, *, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number ({hint}), got {value!r}")
    if value < 0:
        raise ValueError(f"{owner}.{name} must be >= 0 ({hint}), got {value!r}")
    return float(value)


def _check_int(owner: str, name: str, value: Any, *, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an int >= {minimum} ({hint}), got {value!r}")
    return value


class _RateCurve:
    """A piecewise-linear rate r(t), its integral N(t) and the inverse of N.

    Built from points ``(t, r)`` with non-decreasing ``t`` starting at 0; the rate is
    linear between consecutive points (a repeated time is a step) and constant after the
    last one.
    """

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        self._t0: list[float] = []  # segment start times
        self._n0: list[float] = []  # N at segment starts
        self._r0: list[float] = []  # rate at segment starts
        self._a: list[float] = []  # slope of the rate within each segment
        count = 0.0
        for (ta, ra), (tb, rb) in pairwise(points):
            if tb > ta:
                self._add(ta, count, ra, (rb - ra) / (tb - ta))
                count += (ra + rb) / 2 * (tb - ta)
        t_last, r_last = points[-1]
        self._add(t_last, count, r_last, 0.0)

    def _add(self, t0: float, n0: float, r0: float, a: float) -> None:
        self._t0.append(t0)
        self._n0.append(n0)
        self._r0.append(r0)
        self._a.append(a)

    def count(self, t: float) -> float:
        """N(t): records due by logical time ``t``."""
        if t <= 0:
            return 0.0
        if t == math.inf:
            return math.inf  # the last rate is > 0
        k = bisect_right(self._t0, t) - 1
        dt = t - self._t0[k]
        return self._n0[k] + dt * (self._r0[k] + 0.5 * self._a[k] * dt)

    def time(self, x: float) -> float:
        """The earliest logical time at which N reaches ``x``."""
        if x <= 0:
            return 0.0
        k = max(bisect_left(self._n0, x) - 1, 0)
        d = x - self._n0[k]
        r0 = self._r0[k]
        # Root of a/2 dt² + r0 dt = d in the form that stays exact when a is 0 or tiny.
        return self._t0[k] + 2 * d / (r0 + math.sqrt(max(r0 * r0 + 2 * self._a[k] * d, 0.0)))

    def times(self, origin: float, x0: float, step: float, n: int) -> list[float]:
        """``origin + time(x0 + i * step)`` for ``i`` in ``range(n)``."""
        k = max(bisect_left(self._n0, x0) - 1, 0)
        r0 = self._r0[k]
        last = x0 + step * (n - 1)
        if self._a[k] == 0.0 and r0 > 0 and (k + 1 == len(self._n0) or last <= self._n0[k + 1]):
            base = origin + self._t0[k] + (x0 - self._n0[k]) / r0
            dt = step / r0
            return [base + i * dt for i in range(n)]
        time = self.time
        return [origin + time(x0 + i * step) for i in range(n)]


@dataclass(frozen=True, kw_only=True)
class Generator(Source):
    """A seeded generator of keys (or, through :meth:`make_records`, of richer records).

    ``records``: total count, or ``None`` for an unbounded stream. ``rate``: records per
    second over all tasks (0 with no ``schedule`` = as fast as possible). ``schedule``:
    ``(time_s, rate)`` points after the implicit ``(0, rate)``; the rate is linear between
    points and a repeated time is a step, so ``rate=1000, schedule=((30, 1000), (30,
    4000))`` steps to 4000/s at 30 s and ``((30, 1000), (60, 4000))`` ramps from 30 s to
    60 s; the rate after the last point holds. A string ``"30:1000, 30:4000"`` is
    accepted too (see :func:`parse_schedule`). ``keys``: distinct keys. ``zipf``: skew
    alpha (0 = uniform). ``omega``: key-popularity reshuffles per minute of logical time
    (0 = never). ``seed``: the stream's seed.

    Subclass to produce records other than key strings: override :meth:`make_records`
    and decorate the subclass with ``@dataclass(frozen=True)`` (it stays picklable and
    deterministic)::

        @dataclass(frozen=True)
        class Orders(Generator):
            max_price: float = 100.0

            def make_records(self, rng, keys, start_index):
                rand = rng.random
                return [
                    (start_index + i, sym, "B" if rand() < 0.5 else "S",
                     round(self.max_price * rand(), 2), 1 + int(100 * rand()))
                    for i, sym in enumerate(keys)
                ]
    """

    records: int | None = None
    rate: float = 0.0
    schedule: Schedule = ()
    keys: int = 1000
    zipf: float = 0.0
    omega: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.records is not None:
            _check_int(owner, "records", self.records, minimum=0, hint="None = unbounded")
        rate = _check_number(owner, "rate", self.rate, hint="records/s; 0 = as fast as possible")
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "schedule", self._checked_schedule(owner))
        _check_int(owner, "keys", self.keys, minimum=1, hint="number of distinct keys")
        zipf = _check_number(owner, "zipf", self.zipf, hint="Zipf alpha; 0 = uniform")
        object.__setattr__(self, "zipf", zipf)
        omega = _check_number(owner, "omega", self.omega, hint="reshuffles per minute")
        object.__setattr__(self, "omega", omega)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"{owner}.seed must be an int, got {self.seed!r}")

    def _checked_schedule(self, owner: str) -> Schedule:
        raw = parse_schedule(self.schedule) if isinstance(self.schedule, str) else self.schedule
        points = []
        for i, point in enumerate(raw):
            if not isinstance(point, Sequence) or len(point) != 2:
                raise ValueError(
                    f"{owner}.schedule[{i}] must be a (time_s, rate) pair, got {point!r}"
                )
            time_s = _check_number(owner, f"schedule[{i}] time", point[0], hint="seconds")
            rate = _check_number(owner, f"schedule[{i}] rate", point[1], hint="records/s")
            if points and time_s < points[-1][0]:
                raise ValueError(
                    f"{owner}.schedule times must not decrease: point {i} at {time_s} s "
                    f"comes after {points[-1][0]} s (repeat a time to make a step)"
                )
            points.append((time_s, rate))
        if points and points[-1][1] == 0:
            raise ValueError(
                f"{owner}.schedule must end with a rate > 0 (the stream would stop forever)"
            )
        return tuple(points)

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.records is not None

    @property
    def throttled(self) -> bool:
        """False when records are emitted as fast as they are polled."""
        return self.rate > 0 or bool(self.schedule)

    def make_records(self, rng: random.Random, keys: list[str], start_index: int) -> list:
        """Turn one chunk of sampled keys into records: exactly one record per key.

        Called once per chunk in the reader's process. ``rng`` is the chunk's own RNG
        (already used to sample ``keys``; draw from it, never from the global
        :mod:`random`, to stay deterministic). ``start_index`` is the global index of
        ``keys[0]``. The default returns the keys themselves.
        """
        return keys

    def open(self, index: int, parallelism: int, start_time: float) -> GeneratorReader:
        return GeneratorReader(self, index, parallelism, start_time)


class GeneratorReader(SourceReader):
    """Task ``index``'s share of a :class:`Generator`: chunks ``c`` with ``c % n == index``."""

    def __init__(self, gen: Generator, index: int, parallelism: int, start_time: float) -> None:
        if not 0 <= index < parallelism:
            raise ValueError(f"task index {index} is outside parallelism {parallelism}")
        self._gen = gen
        self._index = index
        self._n = parallelism
        self._start = start_time
        self._names = key_names(gen.keys)
        self._cum: list[float] | None = None
        if gen.zipf > 0:
            alpha = gen.zipf
            self._cum = list(accumulate(1.0 / (r + 1) ** alpha for r in range(gen.keys)))
        points = [(0.0, gen.rate), *gen.schedule]
        self._curve = _RateCurve(points if gen.throttled else [(0.0, NOMINAL_RATE)])
        self._epoch = 0
        self._population = self._names
        # This task's share of the records paces it: its m-th record is due when the
        # cumulative count reaches (m + 1) * scale.
        self._chunks: int | None = None  # chunks in the whole stream, None = unbounded
        self._share: int | None = None  # records this task owns, None = unbounded
        self._scale = float(parallelism)
        if gen.records is not None:
            self._chunks = -(-gen.records // CHUNK)
            self._share = self._owned_before(self._chunks)
            if self._share:
                self._scale = gen.records / self._share
        self._chunk = index  # the chunk holding the next record
        self._offset = 0  # the next record's offset within it
        self._emitted = 0  # this task's records before (chunk, offset)
        self._buffer: list | None = None  # the records of self._chunk, once generated

    def _owned_before(self, chunk: int) -> int:
        """Records in the chunks this task owns below ``chunk``."""
        if self._chunks is not None:
            chunk = min(chunk, self._chunks)
        count = max(0, -(-(chunk - self._index) // self._n)) * CHUNK
        if chunk == self._chunks and (chunk - 1) % self._n == self._index:
            count -= chunk * CHUNK - self._gen.records  # the last chunk is short
        return count

    def _exhausted(self) -> bool:
        return self._chunks is not None and self._chunk >= self._chunks

    def _generate(self, chunk: int) -> list:
        gen = self._gen
        size = CHUNK
        if gen.records is not None:
            size = min(CHUNK, gen.records - chunk * CHUNK)
        if gen.omega > 0:
            logical = self._curve.time(chunk * CHUNK + 1)
            epoch = math.floor(logical * gen.omega / 60.0)
            if epoch != self._epoch:
                self._epoch = epoch
                self._population = self._names
                if epoch:
                    self._population = self._names.copy()
                    random.Random(f"{gen.seed}:epoch:{epoch}").shuffle(self._population)
        rng = random.Random(f"{gen.seed}:{chunk}")
        if self._cum is None:
            keys = rng.choices(self._population, k=size)
        else:
            keys = rng.choices(self._population, cum_weights=self._cum, k=size)
        records = gen.make_records(rng, keys, chunk * CHUNK)
        if len(records) != size:
            raise ValueError(
                f"{type(gen).__name__}.make_records returned {len(records)} records for "
                f"{size} keys; it must return exactly one record per key"
            )
        return records

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._exhausted():
            return None
        want = max_records
        if self._gen.throttled:
            due = math.floor(min(self._curve.count(now - self._start) / self._scale, _MANY))
            if due <= self._emitted and now >= self._due_time():
                due = self._emitted + 1  # rounding must not starve a poll at next_due()
            want = min(max_records, due - self._emitted)
        if want <= 0:
            return [], []
        values: list = []
        while len(values) < want and not self._exhausted():
            if self._buffer is None:
                self._buffer = self._generate(self._chunk)
            end = self._offset + want - len(values)
            taken = self._buffer[self._offset : end]
            if values:
                values.extend(taken)
            else:
                values = taken  # a fresh slice
            self._offset += len(taken)
            if self._offset == len(self._buffer):
                self._chunk += self._n
                self._offset = 0
                self._buffer = None
        if not values:
            return None
        first = self._emitted
        self._emitted += len(values)
        if not self._gen.throttled:
            return values, [now] * len(values)
        scale = self._scale
        return values, self._curve.times(self._start, (first + 1) * scale, scale, len(values))

    def _due_time(self) -> float:
        return self._start + self._curve.time((self._emitted + 1) * self._scale)

    def next_due(self, now: float) -> float:
        if self._exhausted() or not self._gen.throttled:
            return now
        return max(now, self._due_time())

    def position(self) -> int:
        return self._chunk * CHUNK + self._offset

    def lag(self) -> int | None:
        """Records due by now by the rate schedule and not emitted yet (the backlog of a
        source that cannot keep up); None for an unthrottled generator (all are due)."""
        if not self._gen.throttled:
            return None
        due = math.floor(min(self._curve.count(time.time() - self._start) / self._scale, _MANY))
        if self._share is not None:
            due = min(due, self._share)
        return max(0, due - self._emitted)

    def seek(self, position: Any) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"generator position must be an int >= 0, got {position!r}")
        chunk, offset = divmod(position, CHUNK)
        if chunk % self._n != self._index:
            chunk += (self._index - chunk) % self._n
            offset = 0
        total = self._gen.records
        if total is not None and chunk * CHUNK + offset >= total:
            chunk = self._chunks + (self._index - self._chunks) % self._n  # exhausted
            offset = 0
        self._chunk, self._offset, self._buffer = chunk, offset, None
        self._emitted = self._owned_before(chunk) + offset


@dataclass(frozen=True, kw_only=True)
class PartitionedGenerator(Generator, PartitionedSource):
    """A :class:`Generator` split into ``partitions`` named ``p0``, ``p1``...: partition
    ``i`` is the share task ``i`` of ``partitions`` tasks would read, so the stream (its
    records, their order within a partition, the total rate) is the same whichever task
    reads which partition. The reference partitioned source, for tests and examples."""

    partitions_count: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int(type(self).__name__, "partitions_count", self.partitions_count, minimum=1,
                   hint="number of partitions")  # fmt: skip

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.records is not None

    def partitions(self) -> list[str]:
        return [f"p{i}" for i in range(self.partitions_count)]

    def open_partition(self, partition: str, start_time: float) -> GeneratorReader:
        names = self.partitions()
        if partition not in names:
            raise ValueError(f"{type(self).__name__} has no partition {partition!r}: {names}")
        return GeneratorReader(self, names.index(partition), self.partitions_count, start_time)
