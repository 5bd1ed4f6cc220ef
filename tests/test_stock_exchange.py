"""The stock exchange example: order book matching, statistics, alerts, and end-to-end runs
on real local workers compared with the in-process reference."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from controlplane.runner import run_local
from examples.stock_exchange import (
    Alerts,
    Match,
    Orders,
    Stats,
    base_price,
    build,
    match_order,
    read_results,
    reference,
)
from runtime.codec import packb, unpackb
from runtime.dataflow import load_job
from runtime.params import ParamError


class FakeState:
    """The keyed state of one key, as a keyed UDF sees it."""

    def __init__(self) -> None:
        self.value: Any = None

    def get(self, default: Any = None) -> Any:
        return default if self.value is None else self.value

    def set(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


def run_orders(orders: list[tuple], depth: int = 100) -> tuple[list, list, list]:
    bids: list = []
    asks: list = []
    trades = []
    for order in orders:
        trades.extend(match_order(bids, asks, order, depth))
    return bids, asks, trades


# --- Order book ---------------------------------------------------------------------------


def test_orders_that_do_not_cross_rest_best_last():
    bids, asks, trades = run_orders(
        [
            (0, "X", "B", 99.0, 10),
            (1, "X", "S", 101.0, 5),
            (2, "X", "B", 100.0, 7),
            (3, "X", "S", 100.5, 3),
            (4, "X", "B", 100.0, 2),
        ]
    )
    assert trades == []
    # Best last: highest bid, earliest first among equal prices; lowest ask.
    assert bids == [(99.0, 0, 10), (100.0, -4, 2), (100.0, -2, 7)]
    assert asks == [(-101.0, -1, 5), (-100.5, -3, 3)]


def test_price_time_priority_and_resting_price():
    _, asks, trades = run_orders(
        [
            (0, "X", "S", 101.0, 5),
            (1, "X", "S", 100.0, 5),
            (2, "X", "S", 100.0, 5),
            (3, "X", "B", 102.0, 12),  # best price first, then the earlier order at it
        ]
    )
    assert trades == [("X", 3, 1, 100.0, 5), ("X", 3, 2, 100.0, 5), ("X", 3, 0, 101.0, 2)]
    assert asks == [(-101.0, 0, 3)]


def test_sell_trades_at_the_resting_bid_price():
    bids, asks, trades = run_orders([(0, "X", "B", 100.0, 5), (1, "X", "S", 98.5, 5)])
    assert trades == [("X", 0, 1, 100.0, 5)]
    assert bids == asks == []


def test_partial_fills_rest_the_remainder():
    bids, asks, trades = run_orders(
        [
            (0, "X", "B", 100.0, 10),
            (1, "X", "S", 99.0, 4),  # resting bid partly filled
            (2, "X", "S", 100.0, 9),  # fills the bid's 6, rests 3
        ]
    )
    assert trades == [("X", 0, 1, 100.0, 4), ("X", 0, 2, 100.0, 6)]
    assert bids == []
    assert asks == [(-100.0, -2, 3)]


def test_matching_stops_when_prices_no_longer_cross():
    bids, asks, trades = run_orders(
        [(0, "X", "S", 100.0, 5), (1, "X", "S", 103.0, 5), (2, "X", "B", 102.0, 20)]
    )
    assert trades == [("X", 2, 0, 100.0, 5)]
    assert bids == [(102.0, -2, 15)]
    assert asks == [(-103.0, -1, 5)]


def test_depth_cap_drops_the_worst_resting_orders():
    orders = [
        (0, "X", "B", 97.0, 1),
        (1, "X", "B", 99.0, 1),
        (2, "X", "B", 98.0, 1),
        (3, "X", "B", 99.0, 1),
        (4, "X", "B", 96.0, 1),  # worst on arrival: dropped at once
        (5, "X", "S", 103.0, 1),
        (6, "X", "S", 101.0, 1),
        (7, "X", "S", 102.0, 1),
        (8, "X", "S", 101.0, 1),
    ]
    bids, asks, trades = run_orders(orders, depth=3)
    assert trades == []
    assert bids == [(98.0, -2, 1), (99.0, -3, 1), (99.0, -1, 1)]
    assert asks == [(-102.0, -7, 1), (-101.0, -8, 1), (-101.0, -6, 1)]


def test_match_udf_keeps_matching_after_the_book_crosses_msgpack():
    orders = [(i, "X", "B" if i % 3 else "S", 100.0 + (i * 7) % 5, 1 + i % 4) for i in range(60)]
    match, plain, shipped = Match(depth=8), FakeState(), FakeState()
    for order in orders:
        expected = match("X", order, plain)
        # A key group move exports the state as msgpack: lists come back as tuples.
        shipped.set(unpackb(packb(shipped.get())))
        assert match("X", order, shipped) == expected
    assert unpackb(packb(shipped.get())) == unpackb(packb(plain.get()))


# --- Statistics and alerts ----------------------------------------------------------------


def test_stats_count_volume_vwap_and_moving_average():
    stats, state = Stats(window=3), FakeState()
    trades = [
        ("X", 1, 2, 10.0, 1),
        ("X", 3, 4, 20.0, 3),
        ("X", 5, 6, 30.0, 1),
        ("X", 7, 8, 40.0, 5),
    ]
    records = [r for t in trades for r in stats("X", t, state)]
    assert records == [
        ("X", 1, 1, 10.0, 10.0, 10.0),
        ("X", 2, 4, 17.5, 15.0, 20.0),  # vwap (10 + 60) / 4
        ("X", 3, 5, 20.0, 20.0, 30.0),  # vwap 100 / 5
        ("X", 4, 10, 30.0, 30.0, 40.0),  # vwap 300 / 10; average of the last 3 prices
    ]
    # The state survives msgpack (a key group move) and goes on from there.
    state.set(unpackb(packb(state.get())))
    assert stats("X", ("X", 9, 10, 50.0, 10), state) == (("X", 5, 20, 40.0, 40.0, 50.0),)


def test_alerts_when_the_price_leaves_the_moving_average():
    alerts = Alerts(pct=2.0)
    assert alerts(("X", 7, 100, 50.0, 100.0, 102.0)) == ()
    assert alerts(("X", 8, 100, 50.0, 100.0, 97.5)) == (("X", 8, 97.5, 100.0, -2.5),)
    assert alerts(("X", 9, 100, 50.0, 100.0, 103.0)) == (("X", 9, 103.0, 100.0, 3.0),)


# --- Source and job -----------------------------------------------------------------------


def test_orders_are_deterministic_tuples_whatever_the_source_parallelism():
    source = Orders(records=5000, keys=50, zipf=1.0, omega=600.0, seed=7)

    def drain(index: int, parallelism: int) -> list:
        reader = source.open(index, parallelism, 0.0)
        out = []
        while (polled := reader.poll(float("inf"), 4096)) is not None:
            out.extend(polled[0])
        return out

    one = drain(0, 1)
    assert [o[0] for o in one] == list(range(5000))
    three = [o for i in range(3) for o in drain(i, 3)]
    assert sorted(three) == one
    _order_id, symbol, side, price, qty = one[0]
    assert symbol.startswith("S") and side in ("B", "S") and 1 <= qty <= 100
    assert price == round(price, 2)
    assert abs(price / base_price(symbol) - 1) <= 0.021
    assert len(Counter(o[1] for o in one)) <= 50


def test_params_are_checked():
    with pytest.raises(ParamError, match="sources"):
        build({"sources": 0})
    with pytest.raises(ParamError, match="unknown param"):
        build({"stocks": 10})
    graph = build({"parallelism": 3}).compile()
    assert graph.operator("orders").parallelism == 1
    assert graph.operator("match").parallelism == 3
    assert graph.operator("alerts").parallelism == 3


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", [2, 3])
def test_run_on_local_workers_equals_reference(tmp_path, parallelism):
    params = {
        "records": 30_000,
        "parallelism": parallelism,
        "omega": 600.0,  # a popularity reshuffle every 0.1 s of logical time
        "output": str(tmp_path),
    }
    graph = load_job("examples.stock_exchange:build", params)
    result = asyncio.run(run_local(graph, workers=2, timeout=60))
    assert result.status == "finished", result.error
    assert result.summary["source_records"] == 30_000
    expected = reference(params)
    assert len(expected["trades"]) > 10_000 and expected["alerts"]
    assert read_results(tmp_path) == expected


@pytest.mark.slow
def test_bars_on_event_time_equal_reference(tmp_path):
    """With ``bar_s``, the job runs on event time and each stock's OHLC bars (tumbling
    windows of trades) equal the reference's, as do the trades, stats and alerts."""
    params = {"records": 20_000, "parallelism": 2, "bar_s": 1.0, "output": str(tmp_path)}
    graph = load_job("examples.stock_exchange:build", params)
    assert graph.operator("orders").event_time is not None
    result = asyncio.run(run_local(graph, workers=2, timeout=60))
    assert result.status == "finished", result.error
    expected = reference(params)
    assert len(expected["bars"]) > 500
    assert read_results(tmp_path) == expected
    with pytest.raises(ParamError, match="bar_s"):
        build({"bar_s": -1.0})


def test_work_us_costs_time_but_changes_no_trade():
    orders = [(0, "S1", "S", 100.0, 10), (1, "S1", "B", 101.0, 4), (2, "S1", "B", 99.0, 8)]
    plain, plain_state = Match(), FakeState()
    expected = [plain("S1", order, plain_state) for order in orders]
    slow, slow_state = Match(work_us=2_000.0), FakeState()
    started = time.perf_counter()
    assert [slow("S1", order, slow_state) for order in orders] == expected
    assert time.perf_counter() - started >= 3 * 2_000.0 / 1e6
    with pytest.raises(ParamError, match="work_us"):
        build({"work_us": -1.0})


@pytest.mark.slow
def test_run_with_work_us_equals_reference(tmp_path):
    params = {"records": 5_000, "parallelism": 2, "work_us": 20.0, "output": str(tmp_path)}
    graph = load_job("examples.stock_exchange:build", params)
    result = asyncio.run(run_local(graph, workers=2, timeout=60))
    assert result.status == "finished", result.error
    assert read_results(tmp_path) == reference(params)
