"""Per-task metrics, reported every second, and a mergeable latency histogram.

Each task keeps cumulative counters (:class:`TaskMetrics`); the worker's reporter takes a
:meth:`TaskMetrics.snapshot` every second, which returns what happened since the previous
snapshot as a msgpack-able dict:

``span_s`` (the seconds since the previous snapshot: what rates are per), ``records_in``,
``records_out``, ``busy_s``, ``idle_s``, ``backpressure_s`` (time spent processing,
waiting for input, waiting for output credit; their sum falls short of ``span_s`` by the
time the task waited for its worker's other tasks), ``queued`` (records waiting per
input channel), ``key_groups`` (records per key group, keyed tasks), ``hot_keys`` (keyed
tasks: the heaviest keys, see below), ``channels`` (per output channel: records and bytes;
the traffic matrix), and at sinks ``latency`` (a sparse :class:`LatencyHistogram` of
end-to-end latency from the source timestamps).

``hot_keys`` (absent when the task was made with ``hot_keys=False``: the control plane's
``hot_keys`` setting) lists up to ``HOT_KEYS_REPORTED`` keys, heaviest first, each
``{"key", "group", "count", "error"}``: its estimated records since the last snapshot (a
:class:`~runtime.hotkeys.HotKeySampler` fed a sample of each input batch, reset at each
snapshot), the most that estimate may be over, and its key group. A key travels as itself
when JSON and msgpack both carry it (``str``, ``bool``, ``None``, a 64-bit ``int``, a
finite ``float``, tuples of those, which JSON writes as arrays) and its ``repr`` fits
``HOT_KEY_MAX_CHARS``; otherwise ``key`` is its ``repr`` (cut at that length) and the entry
has ``"repr": true``.

Bytes on a channel between workers are the frame sizes actually written; on a channel
inside one worker (no serialization) they are estimated from a sampled encoding, so the
traffic matrix is comparable whatever the placement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from .hotkeys import HotKey, HotKeySampler
from .keygroups import key_group

__all__ = [
    "HOT_KEYS_REPORTED",
    "HOT_KEY_COUNTERS",
    "HOT_KEY_SAMPLES",
    "LatencyHistogram",
    "TaskMetrics",
    "covered",
    "summarize_latency",
]

_SUB = 16  # sub-buckets per power of two: about 6% precision
_SIZE = 40 * _SUB
_FLUSH_AT = 16384  # records queued before binning

HOT_KEY_COUNTERS = 64  # counters of a keyed task's sketch: a key above 1/64 of its input is seen
HOT_KEY_SAMPLES = 8  # records counted per input batch (its cost: bench/hotkeys_overhead.py)
HOT_KEYS_REPORTED = 8  # heaviest keys in each snapshot
HOT_KEY_MAX_CHARS = 200  # a key whose repr is longer is reported as that repr, cut
_INT64 = range(-(1 << 63), 1 << 63)  # ints msgpack carries


class LatencyHistogram:
    """A log-linear histogram of latencies in microseconds (HdrHistogram-like, ~6%)."""

    __slots__ = ("_pending", "_pending_n", "counts", "max_us", "total")

    def __init__(self) -> None:
        self.counts = [0] * _SIZE
        self.total = 0
        self.max_us = 0
        self._pending: list[tuple[float, Sequence[float]]] = []
        self._pending_n = 0

    @staticmethod
    def bucket(us: int) -> int:
        if us < 2 * _SUB:
            return max(us, 0)
        shift = us.bit_length() - 5
        return min(shift * _SUB + (us >> shift), _SIZE - 1)

    @staticmethod
    def bucket_floor(idx: int) -> int:
        """The smallest latency (us) that falls into bucket ``idx``."""
        if idx < 2 * _SUB:
            return idx
        shift = idx // _SUB - 1
        return (idx - shift * _SUB) << shift

    def record(self, now: float, timestamps: Sequence[float]) -> None:
        """Record ``now - t`` for each source timestamp ``t`` (per-batch hot path).

        Batches are queued and binned together with numpy once enough have gathered (or
        when the histogram is read), which costs tens of nanoseconds per record.
        """
        self._pending.append((now, timestamps))
        self._pending_n += len(timestamps)
        if self._pending_n >= _FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        nows = np.fromiter((n for n, _ in self._pending), np.float64, len(self._pending))
        lens = np.fromiter((len(t) for _, t in self._pending), np.int64, len(self._pending))
        ts = np.fromiter(chain.from_iterable(t for _, t in self._pending), np.float64)
        self._pending.clear()
        self._pending_n = 0
        if not len(ts):
            return
        us = ((np.repeat(nows, lens) - ts) * 1e6).astype(np.int64)
        np.maximum(us, 0, out=us)
        shift = np.maximum(np.frexp(us.astype(np.float64))[1] - 5, 0)
        idx = np.where(us < 2 * _SUB, us, shift * _SUB + (us >> shift))
        np.minimum(idx, _SIZE - 1, out=idx)
        binned = np.bincount(idx, minlength=_SIZE)
        counts = self.counts
        for i in np.flatnonzero(binned).tolist():
            counts[i] += int(binned[i])
        self.total += len(us)
        self.max_us = max(self.max_us, int(us.max()))

    def record_us(self, us: int, count: int = 1) -> None:
        self.counts[self.bucket(us)] += count
        self.total += count
        self.max_us = max(self.max_us, us)

    def merge(self, other: LatencyHistogram) -> None:
        other._flush()
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c
        self.total += other.total
        self.max_us = max(self.max_us, other.max_us)

    def percentile(self, q: float) -> float:
        """Latency in milliseconds below which a fraction ``q`` (0..1) of records fall."""
        self._flush()
        if not self.total:
            return 0.0
        rank = max(1, int(q * self.total + 0.999999))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                upper = self.bucket_floor(i + 1) if i + 1 < _SIZE else self.max_us
                return min(upper, max(self.max_us, self.bucket_floor(i))) / 1000.0
        return self.max_us / 1000.0

    def to_dict(self) -> dict[str, Any]:
        self._flush()
        return {
            "buckets": {i: c for i, c in enumerate(self.counts) if c},
            "max_us": self.max_us,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyHistogram:
        h = cls()
        for i, c in dict(data.get("buckets", {})).items():
            h.counts[int(i)] += int(c)
            h.total += int(c)
        h.max_us = int(data.get("max_us", 0))
        return h

    def clear(self) -> None:
        self._pending.clear()
        self._pending_n = 0
        self.counts = [0] * _SIZE
        self.total = 0
        self.max_us = 0


def summarize_latency(h: LatencyHistogram) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds."""
    return {
        "p50_ms": round(h.percentile(0.50), 3),
        "p95_ms": round(h.percentile(0.95), 3),
        "p99_ms": round(h.percentile(0.99), 3),
        "max_ms": round(h.max_us / 1000.0, 3),
        "count": h.total,
    }


class TaskMetrics:
    """Cumulative counters of one task; the task loop updates the fields directly."""

    __slots__ = (
        "_since",
        "backpressure_s",
        "busy_s",
        "channel_bytes",
        "channel_records",
        "hot_keys",
        "idle_s",
        "key_group_counts",
        "late_records",
        "latency",
        "records_in",
        "records_out",
        "watermark",
    )

    def __init__(self, max_parallelism: int = 0, sink: bool = False, hot_keys: bool = True) -> None:
        """Counters for a task; ``max_parallelism`` > 0 for a keyed task, which then counts
        records per key group and, with ``hot_keys``, sketches its heaviest keys."""
        self.records_in = 0
        self.records_out = 0
        self.busy_s = 0.0
        self.idle_s = 0.0
        self.backpressure_s = 0.0
        self.key_group_counts: list[int] | None = [0] * max_parallelism if max_parallelism else None
        # A keyed task's heaviest keys: the task feeds it each input batch.
        self.hot_keys = (
            HotKeySampler(HOT_KEY_COUNTERS, HOT_KEY_SAMPLES)
            if max_parallelism and hot_keys
            else None
        )
        self.channel_records: dict[str, int] = {}
        self.channel_bytes: dict[str, float] = {}
        self.latency = LatencyHistogram() if sink else None
        self.watermark: float | None = None  # the task's event-time watermark, once it has one
        self.late_records = 0  # records a window took as late (dropped or sent apart)
        self._since = time.perf_counter()  # when the counters started (the last snapshot)

    def snapshot(self, queued: Mapping[str, int]) -> dict[str, Any]:
        """What happened since the last snapshot; resets the counters."""
        now = time.perf_counter()
        span, self._since = now - self._since, now
        out: dict[str, Any] = {
            "span_s": round(span, 6),
            "records_in": self.records_in,
            "records_out": self.records_out,
            "busy_s": round(self.busy_s, 6),
            "idle_s": round(self.idle_s, 6),
            "backpressure_s": round(self.backpressure_s, 6),
            "queued": dict(queued),
            "channels": {
                k: {"records": n, "bytes": int(self.channel_bytes.get(k, 0))}
                for k, n in self.channel_records.items()
            },
        }
        self.records_in = self.records_out = 0
        self.busy_s = self.idle_s = self.backpressure_s = 0.0
        self.channel_records = dict.fromkeys(self.channel_records, 0)
        self.channel_bytes = dict.fromkeys(self.channel_bytes, 0.0)
        if self.key_group_counts is not None:
            kgc = self.key_group_counts
            out["key_groups"] = {g: c for g, c in enumerate(kgc) if c}
            self.key_group_counts = [0] * len(kgc)
            if self.hot_keys is not None:
                top = self.hot_keys.take(HOT_KEYS_REPORTED)
                out["hot_keys"] = tuple(hot_key_report(h, len(kgc)) for h in top)
        if self.latency is not None:
            out["latency"] = self.latency.to_dict()
            self.latency.clear()
        if self.watermark is not None:
            out["event_time"] = event_time_report(self.watermark, self.late_records)
            self.late_records = 0
        return out


def hot_key_report(hot: HotKey, max_parallelism: int) -> dict[str, Any]:
    """A hot key as a snapshot carries it (see the module docstring)."""
    group = key_group(hot.key, max_parallelism)
    report = {"key": hot.key, "group": group, "count": hot.count, "error": hot.error}
    if not _portable(hot.key) or len(repr(hot.key)) > HOT_KEY_MAX_CHARS:
        report.update(key=repr(hot.key)[:HOT_KEY_MAX_CHARS], repr=True)
    return report


def _portable(key: object) -> bool:
    """Whether msgpack and JSON both carry ``key`` as it is (tuples as arrays)."""
    kind = type(key)
    if kind is str or kind is bool or key is None:
        return True
    if kind is int:
        return key in _INT64
    if kind is float:
        return math.isfinite(key)
    return kind is tuple and all(_portable(k) for k in key)


def covered(agg: Mapping[str, float], window_s: float) -> float:
    """The seconds a task's reports in a window cover (each report's ``span_s``: the time
    since the task's previous one; from workers that do not say, busy + idle +
    backpressured), or the window when they cover none. Reports are stamped when they
    arrive, so a window holds one, two or three of a task's per-second reports: dividing
    by the time they cover, not by the window, keeps its rates right; and by the time
    that passed, not the time the task accounted for, since a task waiting for its
    worker's other tasks accounts for none of that wait (a backpressured source's rate
    came out several times its real one)."""
    seconds = agg.get("span_s", 0.0) or (
        agg.get("busy_s", 0.0) + agg.get("idle_s", 0.0) + agg.get("backpressure_s", 0.0)
    )
    return seconds if seconds > 0 else window_s


def event_time_report(watermark: float, late: int) -> dict[str, Any]:
    """A task's event-time progress for its metrics: its watermark (None before the first
    and after the last, ``inf``), how far it trails the wall clock, and the late records
    since the last report."""
    finite = math.isfinite(watermark)
    return {
        "watermark": watermark if finite else None,
        "lag_s": round(max(time.time() - watermark, 0.0), 3) if finite else None,
        "late": late,
        "ended": watermark == math.inf,
    }
