"""Metrics: the latency histogram's percentiles stay within its bucket precision of the
exact ones, histograms merge and serialize losslessly, snapshots reset the counters."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.codec import packb, unpackb
from runtime.metrics import LatencyHistogram, TaskMetrics, summarize_latency

NOW = 1_700_000_000.0
QUANTILES = (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
# Latencies in microseconds, up to about 3 hours (the histogram covers ~100 days).
latencies_us = st.integers(0, 10**10)


def exact_percentile_us(samples: list[int], q: float) -> int:
    """Nearest-rank percentile: the smallest sample with at least q of all at or below it."""
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def assert_close_to_exact(h: LatencyHistogram, samples: list[int]) -> None:
    """A percentile is the upper end of the exact sample's bucket: never below the exact
    value, at most 1/16 above it (or 1 us above, for latencies under 32 us)."""
    for q in QUANTILES:
        exact = exact_percentile_us(samples, q)
        got_us = h.percentile(q) * 1000.0
        assert got_us >= exact - 1e-6, (q, exact, got_us)
        assert got_us <= max(exact * 1.07, exact + 1) + 1e-6, (q, exact, got_us)


def histogram_of(samples: list[int]) -> LatencyHistogram:
    h = LatencyHistogram()
    for us in samples:
        h.record_us(us)
    return h


def test_percentiles_of_seeded_lognormal_latencies() -> None:
    rng = random.Random(20240601)
    for _ in range(20):
        samples = [int(rng.lognormvariate(8, 2)) for _ in range(rng.randint(1, 5000))]
        h = histogram_of(samples)
        assert_close_to_exact(h, samples)
        assert h.max_us == max(samples)
        assert h.percentile(1.0) == max(samples) / 1000.0


@settings(max_examples=150, deadline=None)
@given(st.lists(latencies_us, min_size=1, max_size=300))
def test_percentiles_within_bucket_precision(samples: list[int]) -> None:
    assert_close_to_exact(histogram_of(samples), samples)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1e4, allow_nan=False), max_size=50), max_size=10))
def test_batched_record_bins_like_record_us(batches: list[list[float]]) -> None:
    """record(now, source timestamps) queues batches and bins them with numpy; the result
    is the one record_us gives for each ``int((now - t) * 1e6)``."""
    batched, single = LatencyHistogram(), LatencyHistogram()
    for ages in batches:
        stamps = [NOW - age for age in ages]
        batched.record(NOW, stamps)
        for t in stamps:
            single.record_us(max(int((NOW - t) * 1e6), 0))
    assert batched.to_dict() == single.to_dict()
    assert batched.total == single.total


def test_record_clamps_future_timestamps_to_zero() -> None:
    h = LatencyHistogram()
    h.record(NOW, [NOW + 5.0, NOW - 0.5])  # NOW - 0.5 is exact in binary
    assert h.to_dict() == {
        "buckets": {0: 1, LatencyHistogram.bucket(500_000): 1},
        "max_us": 500_000,
    }


def test_record_bins_on_its_own_past_the_queue_limit() -> None:
    h = LatencyHistogram()
    for _ in range(40):
        h.record(NOW, [NOW - 0.002] * 1000)
    assert h._pending_n < 40_000  # binned along the way, not all kept pending
    assert h.total + h._pending_n == 40_000
    assert h.percentile(0.5) == pytest.approx(2.0, rel=0.07)
    assert h.total == 40_000


def test_bucket_floor_inverts_bucket() -> None:
    for idx in range(len(LatencyHistogram().counts) - 1):
        lo, next_lo = LatencyHistogram.bucket_floor(idx), LatencyHistogram.bucket_floor(idx + 1)
        assert LatencyHistogram.bucket(lo) == idx
        assert LatencyHistogram.bucket(next_lo - 1) == idx
        assert next_lo - lo <= max(1, lo / 16)


@settings(max_examples=100, deadline=None)
@given(st.lists(latencies_us, max_size=100), st.lists(latencies_us, max_size=100))
def test_merge_equals_recording_all(a: list[int], b: list[int]) -> None:
    merged = histogram_of(a)
    other = LatencyHistogram()
    other.record(NOW, [NOW - us / 1e6 for us in b])  # pending in other until merged
    expected = histogram_of(a)
    for t in [NOW - us / 1e6 for us in b]:
        expected.record_us(max(int((NOW - t) * 1e6), 0))
    merged.merge(other)
    assert merged.to_dict() == expected.to_dict()
    assert merged.total == len(a) + len(b)
    assert merged.max_us == expected.max_us


@settings(max_examples=100, deadline=None)
@given(st.lists(latencies_us, max_size=200))
def test_to_dict_from_dict_round_trip(samples: list[int]) -> None:
    h = histogram_of(samples)
    data = h.to_dict()
    for copy in (
        LatencyHistogram.from_dict(data),
        LatencyHistogram.from_dict(json.loads(json.dumps(data))),  # keys become strings
        LatencyHistogram.from_dict(unpackb(packb(data))),
    ):
        assert copy.to_dict() == data
        assert copy.total == h.total == len(samples)
        assert copy.max_us == h.max_us
        assert [copy.percentile(q) for q in QUANTILES] == [h.percentile(q) for q in QUANTILES]


def test_empty_histogram() -> None:
    h = LatencyHistogram()
    assert h.percentile(0.99) == 0.0
    assert h.to_dict() == {"buckets": {}, "max_us": 0}
    assert summarize_latency(h) == {
        "p50_ms": 0.0,
        "p95_ms": 0.0,
        "p99_ms": 0.0,
        "max_ms": 0.0,
        "count": 0,
    }


def test_summarize_latency_and_clear() -> None:
    h = histogram_of([1000] * 98 + [50_000, 250_000])
    summary = summarize_latency(h)
    assert summary["count"] == 100
    assert summary["max_ms"] == 250.0
    assert summary["p50_ms"] == pytest.approx(1.0, rel=0.07)
    assert summary["p99_ms"] == pytest.approx(50.0, rel=0.07)
    h.record(NOW, [NOW - 1.0])
    h.clear()
    assert h.total == 0 and h.max_us == 0 and h.to_dict()["buckets"] == {}


# ---------------------------------------------------------------- TaskMetrics


def test_snapshot_reports_since_last_and_resets() -> None:
    m = TaskMetrics(max_parallelism=8, sink=True)
    m.records_in, m.records_out = 10, 7
    m.busy_s, m.idle_s, m.backpressure_s = 0.25, 0.5, 0.125
    m.channel_records["count-0->out-1"] = 7
    m.channel_bytes["count-0->out-1"] = 123.9
    m.key_group_counts[3] += 4
    m.key_group_counts[5] += 6
    m.latency.record(NOW, [NOW - 0.002, NOW - 0.004])

    snap = m.snapshot({"src-0": 12})
    latency = snap.pop("latency")
    span = snap.pop("span_s")  # the seconds since the TaskMetrics was made
    assert 0 <= span < 60
    assert snap == {
        "records_in": 10,
        "records_out": 7,
        "busy_s": 0.25,
        "idle_s": 0.5,
        "backpressure_s": 0.125,
        "queued": {"src-0": 12},
        "channels": {"count-0->out-1": {"records": 7, "bytes": 123}},
        "key_groups": {3: 4, 5: 6},
        "hot_keys": (),  # none fed (tests/test_hotkeys.py feeds them)
    }
    assert LatencyHistogram.from_dict(latency).total == 2
    assert unpackb(packb(snap)) == snap  # msgpack-able as it is

    again = m.snapshot({})
    assert 0 <= again.pop("span_s") < 60  # since the snapshot before
    assert again == {
        "records_in": 0,
        "records_out": 0,
        "busy_s": 0.0,
        "idle_s": 0.0,
        "backpressure_s": 0.0,
        "queued": {},
        "channels": {"count-0->out-1": {"records": 0, "bytes": 0}},
        "key_groups": {},
        "hot_keys": (),
        "latency": {"buckets": {}, "max_us": 0},
    }
    assert m.key_group_counts == [0] * 8


def test_snapshot_of_a_plain_task_has_no_key_groups_or_latency() -> None:
    m = TaskMetrics()
    m.records_in = 3
    snap = m.snapshot({})
    assert "key_groups" not in snap and "hot_keys" not in snap and "latency" not in snap
    assert snap["records_in"] == 3
    assert m.snapshot({})["records_in"] == 0


def test_snapshot_does_not_alias_the_queued_mapping() -> None:
    queued = {"src-0": 1}
    snap = TaskMetrics().snapshot(queued)
    queued["src-0"] = 99
    assert snap["queued"] == {"src-0": 1}


def test_rates_are_per_second_that_passed_not_per_second_a_task_accounted_for() -> None:
    """A task waiting for its worker's other tasks accounts for none of that wait: its
    reports' spans, not busy + idle + backpressured, are what its counts are per."""
    from runtime.metrics import covered

    waited = {"span_s": 2.0, "busy_s": 0.1, "idle_s": 0.1, "backpressure_s": 0.05}
    assert covered(waited, 10.0) == 2.0
    assert covered({"busy_s": 0.5, "idle_s": 0.25}, 10.0) == 0.75  # a worker that does not say
    assert covered({}, 10.0) == 10.0
