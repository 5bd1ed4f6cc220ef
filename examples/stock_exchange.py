"""Stock exchange: orders -> per-stock order book matching -> per-stock statistics -> alerts
(the second workload of Trisk).

Operators::

    orders (Orders source, ``sources`` tasks)
      -> key_by(symbol) -> match (keyed: limit order book)  -> trades sink
      -> key_by(symbol) -> stats (keyed: count, volume, VWAP, moving average) -> stats sink
      -> alerts (flat_map: price far from the moving average) -> alerts sink
      -> key_by(symbol) -> bars (window: ``bar_s`` of event time, when set) -> bars sink

Records (tuples, so that they survive msgpack unchanged):

- order ``(order_id, symbol, side, price, qty)``: ``order_id`` is the record's global
  index, ``side`` is ``"B"`` or ``"S"``, ``price`` is in cents (two decimals).
- trade ``(symbol, buy_order_id, sell_order_id, price, qty)``, at the resting order's price.
- stats ``(symbol, trades, volume, vwap, moving_avg, last_price)``, one per trade.
- alert ``(symbol, trades, last_price, moving_avg, deviation_pct)``.
- bar ``(symbol, start, end, (open, high, low, close, volume, trades))``: a stock's trades
  in ``[start, end)`` of event time (a :class:`~runtime.windows.WindowResult`).

``build(params)`` parameters (all optional; ``streampilot run examples.stock_exchange:build
--param records=100000``):

- ``records`` (int, 200000): orders to generate; 0 = unbounded.
- ``rate`` (float, 0): orders per second over all sources; 0 = as fast as possible.
- ``schedule`` (str, ""): rate steps/ramps, ``"time_s:rate, ..."`` (see Generator).
- ``keys`` (int, 500): number of stocks (symbols ``S00000``, ``S00001``, ...).
- ``zipf`` (float, 1.0): skew of stock popularity (0 = uniform).
- ``omega`` (float, 2.0): reshuffles of stock popularity per minute of logical time, so
  that stocks go through bursts of popularity (Elasticutor's omega; 0 = never).
- ``seed`` (int, 42): the stream's seed.
- ``sources`` (int, 1): tasks of the order source. See *Determinism* below.
- ``parallelism`` (int, 2): tasks of match, stats and alerts (and of their sinks).
- ``max_parallelism`` (int, 128): key groups of match and stats.
- ``depth`` (int, 100): resting orders kept per side of a book; beyond it the worst
  (lowest bid / highest ask, latest first among equal prices) are dropped.
- ``work_us`` (float, 0): simulated compute cost of matching one order, in microseconds:
  the match task busy-waits this long per order (a loop on the clock, no sleep, so it
  holds a core as real work would), on top of matching. Results do not depend on it; it
  makes match the operator that limits throughput, as in Trisk's and eSault's evaluations.
- ``window`` (int, 20): trades in the moving average of each stock's price.
- ``alert_pct`` (float, 2.0): alert when a trade's price is more than this many percent
  away from the moving average (which includes that trade).
- ``bar_s`` (float, 0): when above 0, the job runs on event time (order ``n`` happens at
  ``EPOCH + n / event_rate``; a trade at its incoming order's time) and emits each
  stock's OHLC bars over tumbling windows of ``bar_s`` seconds of that time. Its sink
  latency is then measured from the event time (see docs/dataflow.md), which is why it is
  off by default: the controllers' benchmark scales this job on latency.
- ``event_rate`` (float, 1000): orders per second of event time.
- ``output`` (str, ""): directory for results, in ``trades/``, ``stats/`` (the latest per
  stock), ``alerts/`` and ``bars/`` part files; empty = discard.

Determinism: matching depends on the order in which a stock's orders arrive. Records of
one source task reach the task owning their key group in order (channels are FIFO), so with
``sources=1`` the trades, stats and alerts (:func:`read_results`) are equal to
:func:`reference` for the same params, whatever ``parallelism``. With several source tasks
a stock's orders interleave nondeterministically and results vary from run to run.
"""

from __future__ import annotations

import math
import os
import random
import time
import zlib
from bisect import insort
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.eventtime import EventTime
from runtime.params import parse_params
from runtime.sinks import Collect, Null, read_parts
from runtime.sources import Generator
from runtime.windows import Aggregate, Tumbling

__all__ = [
    "Alerts",
    "Bar",
    "Match",
    "OrderTime",
    "Orders",
    "Params",
    "Stats",
    "base_price",
    "build",
    "busy_wait",
    "match_order",
    "read_results",
    "reference",
    "update_stats",
]

Order = tuple[int, str, str, float, int]
Trade = tuple[str, int, int, float, int]
StatsRecord = tuple[str, int, int, float, float, float]
Alert = tuple[str, int, float, float, float]


@dataclass(frozen=True)
class Params:
    records: int = 200_000
    rate: float = 0.0
    schedule: str = ""
    keys: int = 500
    zipf: float = 1.0
    omega: float = 2.0
    seed: int = 42
    sources: int = 1
    parallelism: int = 2
    max_parallelism: int = 128
    depth: int = 100
    work_us: float = 0.0
    window: int = 20
    alert_pct: float = 2.0
    bar_s: float = 0.0
    event_rate: float = 1000.0
    output: str = ""

    def __post_init__(self) -> None:
        for name in ("keys", "sources", "parallelism", "max_parallelism", "depth", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"param {name!r} must be >= 1, got {getattr(self, name)}")
        if self.records < 0:
            raise ValueError(f"param 'records' must be >= 0 (0 = unbounded), got {self.records}")
        if not (math.isfinite(self.work_us) and self.work_us >= 0):
            raise ValueError(f"param 'work_us' must be a number >= 0, got {self.work_us}")
        if not (math.isfinite(self.alert_pct) and self.alert_pct >= 0):
            raise ValueError(f"param 'alert_pct' must be a number >= 0, got {self.alert_pct}")
        if not (math.isfinite(self.bar_s) and self.bar_s >= 0):
            raise ValueError(f"param 'bar_s' must be a number >= 0 (0 = no bars), got {self.bar_s}")
        if not (math.isfinite(self.event_rate) and self.event_rate > 0):
            raise ValueError(f"param 'event_rate' must be a number > 0, got {self.event_rate}")


# --- Source -------------------------------------------------------------------------------


def base_price(symbol: str) -> float:
    """The price a stock's orders scatter around: 10.00 to 499.99, fixed by the symbol."""
    return 10.0 + zlib.crc32(symbol.encode()) % 49_000 / 100


@dataclass(frozen=True)
class Orders(Generator):
    """Limit orders ``(order_id, symbol, side, price, qty)`` for the generator's sampled keys.

    Key ``k00042`` becomes symbol ``S00042``. Side is buy or sell with equal odds, the
    price is uniform within ``spread`` (a fraction) around :func:`base_price`, rounded to
    cents, and the quantity is uniform in 1..100. Buy and sell prices overlap, so about
    half of the incoming orders cross the book and trade.
    """

    spread: float = 0.02

    def make_records(self, rng: random.Random, keys: list[str], start_index: int) -> list:
        rand = rng.random
        spread = self.spread
        bases: dict[str, tuple[str, float]] = {}
        records = []
        for i, key in enumerate(keys):
            known = bases.get(key)
            if known is None:
                symbol = "S" + key[1:]
                known = bases[key] = (symbol, base_price(symbol))
            symbol, base = known
            side = "B" if rand() < 0.5 else "S"
            price = round(base * (1.0 + spread * (2.0 * rand() - 1.0)), 2)
            records.append((start_index + i, symbol, side, price, 1 + int(100 * rand())))
        return records


EPOCH = 1_700_000_000.0  # event time of order 0 (seconds since the epoch)


@dataclass(frozen=True)
class OrderTime:
    """The event time of an order: ``EPOCH + order_id / event_rate``."""

    event_rate: float

    def __call__(self, order: Order) -> float:
        return self.of(order[0])

    def of(self, order_id: int) -> float:
        return EPOCH + order_id / self.event_rate


@dataclass(frozen=True)
class Bar(Aggregate):
    """A stock's OHLC bar: ``(open, high, low, close, volume, trades)`` of the trades in a
    window, open and close in the order they were matched."""

    def create(self) -> tuple | None:
        return None

    def add(self, acc: tuple | None, trade: Trade) -> tuple:
        price, qty = trade[3], trade[4]
        if acc is None:
            return (price, price, price, price, qty, 1)
        o, h, low, _c, volume, n = acc
        return (o, max(h, price), min(low, price), price, volume + qty, n + 1)

    def merge(self, a: tuple | None, b: tuple | None) -> tuple | None:
        if a is None or b is None:
            return a or b
        return (a[0], max(a[1], b[1]), min(a[2], b[2]), b[3], a[4] + b[4], a[5] + b[5])


def order_symbol(order: Order) -> str:
    return order[1]


def symbol_of(record: tuple) -> str:
    """The key of trades and stats records (their first field)."""
    return record[0]


# --- Matching -----------------------------------------------------------------------------


def match_order(bids: list, asks: list, order: Order, depth: int) -> list[Trade]:
    """Match ``order`` against one stock's book, in place; return the trades, in fill order.

    The book is two sorted lists with the best resting order *last* (cheap to pop):
    ``bids`` holds ``(price, -order_id, qty)`` ascending, so the highest price and, among
    equal prices, the earliest order is last; ``asks`` holds ``(-price, -order_id, qty)``
    ascending, so the lowest price and then the earliest order is last. An incoming order
    fills against the opposite side's best order while the prices cross, one trade per fill
    at the resting order's price; what remains of it rests on its own side, which is then
    cut to ``depth`` orders by dropping the worst (the front of the list).
    """
    order_id, symbol, side, price, qty = order
    trades: list[Trade] = []
    if side == "B":
        while qty and asks:
            neg_price, neg_id, rest_qty = asks[-1]
            if -neg_price > price:
                break
            fill = min(qty, rest_qty)
            trades.append((symbol, order_id, -neg_id, -neg_price, fill))
            qty -= fill
            if fill == rest_qty:
                asks.pop()
            else:
                asks[-1] = (neg_price, neg_id, rest_qty - fill)
        if qty:
            insort(bids, (price, -order_id, qty))
            if len(bids) > depth:
                del bids[: len(bids) - depth]
    else:
        while qty and bids:
            bid_price, neg_id, rest_qty = bids[-1]
            if bid_price < price:
                break
            fill = min(qty, rest_qty)
            trades.append((symbol, -neg_id, order_id, bid_price, fill))
            qty -= fill
            if fill == rest_qty:
                bids.pop()
            else:
                bids[-1] = (bid_price, neg_id, rest_qty - fill)
        if qty:
            insort(asks, (-price, -order_id, qty))
            if len(asks) > depth:
                del asks[: len(asks) - depth]
    return trades


def busy_wait(us: float) -> None:
    """Hold the CPU for ``us`` microseconds of wall-clock time: spin on the clock."""
    deadline = time.perf_counter() + us / 1e6
    while time.perf_counter() < deadline:
        pass


@dataclass(frozen=True)
class Match:
    """The keyed ``match`` UDF: the state of a stock is its book ``[bids, asks]``.

    The book is plain lists of tuples so that it exports with msgpack; after an import
    (key group moved to another worker) its sides come back as tuples and are turned into
    lists again on first use. ``work_us`` > 0 busy-waits that many microseconds per order
    before matching (simulated compute cost; the trades are the same).
    """

    depth: int = 100
    work_us: float = 0.0

    def __call__(self, symbol: str, order: Order, state: Any) -> list[Trade]:
        if self.work_us:
            busy_wait(self.work_us)
        book = state.get()
        if book is None:
            bids: list = []
            asks: list = []
        else:
            bids, asks = book
            if type(bids) is not list or type(asks) is not list:
                bids, asks = list(bids), list(asks)
        trades = match_order(bids, asks, order, self.depth)
        state.set([bids, asks])
        return trades


# --- Statistics and alerts ----------------------------------------------------------------


def update_stats(stats: tuple | None, trade: Trade, window: int) -> tuple:
    """The statistics of a stock after ``trade``: ``(count, volume, notional, last_prices)``.

    ``last_prices`` is a tuple of at most ``window`` prices, oldest first. Pure: the input
    is not modified (it may be a tuple decoded from msgpack).
    """
    price, qty = trade[3], trade[4]
    if stats is None:
        return (1, qty, price * qty, (price,))
    count, volume, notional, prices = stats
    prices = (*prices, price)[-window:]
    return (count + 1, volume + qty, notional + price * qty, prices)


def stats_record(symbol: str, stats: tuple) -> StatsRecord:
    count, volume, notional, prices = stats
    return (
        symbol,
        count,
        volume,
        round(notional / volume, 4),
        round(sum(prices) / len(prices), 4),
        prices[-1],
    )


@dataclass(frozen=True)
class Stats:
    """The keyed ``stats`` UDF: one updated stats record per trade of the stock."""

    window: int = 20

    def __call__(self, symbol: str, trade: Trade, state: Any) -> tuple[StatsRecord]:
        stats = update_stats(state.get(), trade, self.window)
        state.set(stats)
        return (stats_record(symbol, stats),)


@dataclass(frozen=True)
class Alerts:
    """The ``alerts`` flat_map: an alert when the last price is more than ``pct`` percent
    away from the moving average."""

    pct: float = 2.0

    def __call__(self, stats: StatsRecord) -> tuple[Alert, ...]:
        symbol, count, _volume, _vwap, moving_avg, last = stats
        deviation = 100.0 * (last - moving_avg) / moving_avg
        if abs(deviation) <= self.pct:
            return ()
        return ((symbol, count, last, moving_avg, round(deviation, 2)),)


# --- Job ----------------------------------------------------------------------------------


def source_of(p: Params) -> Orders:
    return Orders(
        records=p.records or None,
        rate=p.rate,
        schedule=p.schedule,
        keys=p.keys,
        zipf=p.zipf,
        omega=p.omega,
        seed=p.seed,
    )


def _sink(p: Params, name: str, **kw: Any) -> Collect | Null:
    return Collect(os.path.join(p.output, name), **kw) if p.output else Null()


def build(params: dict[str, Any] | None = None) -> Dataflow:
    p = parse_params(Params, params)
    flow = Dataflow("stock_exchange")
    timed = EventTime(OrderTime(p.event_rate)) if p.bar_s else None
    orders = flow.source("orders", source_of(p), parallelism=p.sources, event_time=timed)
    trades = orders.key_by(order_symbol).process(
        "match",
        Match(p.depth, p.work_us),
        parallelism=p.parallelism,
        max_parallelism=p.max_parallelism,
    )
    stats = trades.key_by(symbol_of).process(
        "stats", Stats(p.window), parallelism=p.parallelism, max_parallelism=p.max_parallelism
    )
    alerts = stats.flat_map("alerts", Alerts(p.alert_pct))
    trades.sink("trades_sink", _sink(p, "trades"))
    stats.sink("stats_sink", _sink(p, "stats", mode="last", key=symbol_of))
    alerts.sink("alerts_sink", _sink(p, "alerts"))
    if p.bar_s:
        bars = trades.key_by(symbol_of).window(
            "bars",
            Tumbling(p.bar_s),
            aggregate=Bar(),
            parallelism=p.parallelism,
            max_parallelism=p.max_parallelism,
        )
        bars.sink("bars_sink", _sink(p, "bars"))
    return flow


def _final_stats(records: list) -> dict[str, StatsRecord]:
    final: dict[str, StatsRecord] = {}
    for record in records:
        record = tuple(record)
        if record[1] > final.get(record[0], (None, 0))[1]:
            final[record[0]] = record
    return final


def read_results(output: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's results from its ``output`` directory, as tuples.

    ``trades`` and ``alerts``: every record, sorted. ``stats``: symbol -> the stock's final
    stats record (the one with the most trades, whichever part file holds it).
    """
    results = {
        "trades": sorted(tuple(t) for t in read_parts(os.path.join(output, "trades"))),
        "stats": _final_stats(read_parts(os.path.join(output, "stats"))),
        "alerts": sorted(tuple(a) for a in read_parts(os.path.join(output, "alerts"))),
    }
    if os.path.isdir(os.path.join(output, "bars")):
        results["bars"] = sorted(_bar(b) for b in read_parts(os.path.join(output, "bars")))
    return results


def _bar(record: Any) -> tuple:
    symbol, start, end, value = record
    return (symbol, start, end, tuple(value))


class _LocalState:
    """Keyed state for :func:`reference`: a dict, bound to one key per UDF call."""

    def __init__(self) -> None:
        self.values: dict = {}
        self.key: Any = None

    def get(self, default: Any = None) -> Any:
        return self.values.get(self.key, default)

    def set(self, value: Any) -> None:
        self.values[self.key] = value

    def clear(self) -> None:
        self.values.pop(self.key, None)


def reference(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results of :func:`read_results` computed in this process with the job's own UDFs,
    without the runtime (bounded runs only; equal to a run's with ``sources=1``)."""
    p = parse_params(Params, params)
    if not p.records:
        raise ValueError("reference() needs a bounded run (records > 0)")
    match, stats, alerts = Match(p.depth), Stats(p.window), Alerts(p.alert_pct)
    books, stocks = _LocalState(), _LocalState()
    trades: list[Trade] = []
    stats_records: list[StatsRecord] = []
    alert_records: list[Alert] = []
    reader = source_of(p).open(0, 1, 0.0)
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        for order in polled[0]:
            books.key = order_symbol(order)
            for trade in match(books.key, order, books):
                trades.append(trade)
                stocks.key = symbol_of(trade)
                for record in stats(stocks.key, trade, stocks):
                    stats_records.append(record)
                    alert_records.extend(alerts(record))
    results = {
        "trades": sorted(trades),
        "stats": _final_stats(stats_records),
        "alerts": sorted(alert_records),
    }
    if p.bar_s:
        results["bars"] = _reference_bars(trades, p)
    return results


def _reference_bars(trades: list[Trade], p: Params) -> list[tuple]:
    """The bars of ``trades`` (in the order they were matched): each at its incoming
    order's time, the later of its two orders."""
    bar, tumbling, order_time = Bar(), Tumbling(p.bar_s), OrderTime(p.event_rate)
    bars: dict[tuple, Any] = {}
    for trade in trades:
        at = order_time.of(max(trade[1], trade[2]))
        ((start, end),) = tumbling.assign(at)
        key = (trade[0], start, end)
        bars[key] = bar.add(bars.get(key), trade)
    return sorted((*key, value) for key, value in bars.items())
