"""The Nexmark queries in plain Python over a finite list of events: the references the
streampilot jobs are checked against.

Semantics are nexmark-flink's SQL definitions (``nexmark-flink/.../queries/q*.sql``),
evaluated over the whole bounded stream, so the result is what a streaming job emits once
every window has closed and every join has seen both sides. Event time is each event's
``date_time`` (epoch ms); windows are aligned on the epoch, as Flink's ``TUMBLE`` /
``HOP`` with no offset, and half-open, ``[window_start, window_end)``, as streampilot's
(:mod:`runtime.windows`) and Flink's windows: a bid at ``window_end`` is in the next
window. Each function returns its rows as a sorted list of tuples (JSON arrays in a
``Collect`` sink), so that outputs compare exactly. Where the SQL's output leaves out the
window, the rows here lead with ``window_start, window_end`` (q5, q7) so that they
identify what they summarise.

- q0 pass-through: every bid as ``(auction, bidder, price, date_time, extra)``.
- q1 currency conversion: the same with ``price * 0.908`` (dollars to euros).
- q2 selection: ``(auction, price)`` of the bids on auctions with ``auction % 123 == 0``.
- q3 local item suggestion: ``(name, city, state, auction id)`` for the auctions of
  category 10 whose seller lives in OR, ID or CA.
- q4 average closing price per category: per auction, its highest bid among the bids
  placed within its lifetime (``date_time <= bid <= expires``), then per category the
  mean of those: ``(category, mean)``; auctions without such a bid do not count. The
  mean is exact (a float); Flink's ``AVG`` over ``BIGINT`` truncates it to an integer.
- q5 hot items: per sliding window (``size_ms`` 10 s every ``slide_ms`` 2 s), the
  auctions with the most bids: ``(window_start, window_end, auction, bids)``.
- q7 highest bid: per tumbling window (10 s), the bids at its highest price placed in
  it, ``[window_start, window_end)``:
  ``(window_start, window_end, auction, bidder, price, date_time, extra)``. The SQL's
  ``BETWEEN window_end - 10 s AND window_end`` also takes a bid placed exactly at
  ``window_end`` (in two windows); here, as in the streampilot job, it is in the next
  window only.
- q8 new users: people who registered and opened an auction in the same tumbling window
  (10 s): ``(id, name, window_start)``, once each.
- q11 user sessions: per bidder, bids grouped in session windows: a bid opens
  ``[date_time, date_time + gap_ms)`` (10 s), and sessions that overlap merge, so that a
  session ends when ``gap_ms`` passes without a bid (half-open, as streampilot's session
  windows: bids exactly ``gap_ms`` apart are in two sessions; Flink merges them):
  ``(bidder, bids, session_start, session_end)``, the end being the last bid's time plus
  the gap.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from .model import Auction, Bid, Event, Person

__all__ = [
    "DOLLARS_TO_EUROS",
    "Q2_MODULUS",
    "Q3_CATEGORY",
    "Q3_STATES",
    "REFERENCES",
    "q0",
    "q1",
    "q2",
    "q3",
    "q4",
    "q5",
    "q7",
    "q8",
    "q11",
]

DOLLARS_TO_EUROS = 0.908
Q2_MODULUS = 123
Q3_STATES = frozenset({"OR", "ID", "CA"})
Q3_CATEGORY = 10
WINDOW_MS = 10_000
SLIDE_MS = 2_000
GAP_MS = 10_000

Row = tuple


def _bids(events: Iterable[Event]) -> list[Bid]:
    return [e for e in events if type(e) is Bid]


def _check_ms(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (milliseconds), got {value!r}")


def q0(events: Iterable[Event]) -> list[Row]:
    return sorted((b.auction, b.bidder, b.price, b.date_time, b.extra) for b in _bids(events))


def q1(events: Iterable[Event]) -> list[Row]:
    return sorted(
        (b.auction, b.bidder, b.price * DOLLARS_TO_EUROS, b.date_time, b.extra)
        for b in _bids(events)
    )


def q2(events: Iterable[Event]) -> list[Row]:
    return sorted((b.auction, b.price) for b in _bids(events) if b.auction % Q2_MODULUS == 0)


def q3(events: Iterable[Event]) -> list[Row]:
    events = list(events)
    sellers = {e.id: e for e in events if type(e) is Person and e.state in Q3_STATES}
    return sorted(
        (p.name, p.city, p.state, a.id)
        for a in events
        if type(a) is Auction and a.category == Q3_CATEGORY and (p := sellers.get(a.seller))
    )


def q4(events: Iterable[Event]) -> list[Row]:
    events = list(events)
    auctions = {e.id: e for e in events if type(e) is Auction}
    final: dict[int, int] = {}
    for b in _bids(events):
        a = auctions.get(b.auction)
        if a is not None and a.date_time <= b.date_time <= a.expires:
            final[a.id] = max(final.get(a.id, b.price), b.price)
    prices: dict[int, list[int]] = defaultdict(list)
    for auction_id, price in final.items():
        prices[auctions[auction_id].category].append(price)
    return sorted((category, sum(p) / len(p)) for category, p in prices.items())


def q5(events: Iterable[Event], size_ms: int = WINDOW_MS, slide_ms: int = SLIDE_MS) -> list[Row]:
    _check_ms("size_ms", size_ms)
    _check_ms("slide_ms", slide_ms)
    counts: Counter[tuple[int, int]] = Counter()
    for b in _bids(events):
        start = b.date_time - b.date_time % slide_ms  # the last window holding the bid
        while start > b.date_time - size_ms:
            counts[start, b.auction] += 1
            start -= slide_ms
    most: dict[int, int] = {}
    for (start, _auction), n in counts.items():
        most[start] = max(most.get(start, n), n)
    return sorted(
        (start, start + size_ms, auction, n)
        for (start, auction), n in counts.items()
        if n == most[start]
    )


def q7(events: Iterable[Event], size_ms: int = WINDOW_MS) -> list[Row]:
    _check_ms("size_ms", size_ms)
    windows: dict[int, list[Bid]] = defaultdict(list)
    for b in _bids(events):
        windows[b.date_time - b.date_time % size_ms].append(b)
    rows = []
    for start, bids in windows.items():
        top = max(b.price for b in bids)
        rows.extend(
            (start, start + size_ms, b.auction, b.bidder, b.price, b.date_time, b.extra)
            for b in bids
            if b.price == top
        )
    return sorted(rows)


def q8(events: Iterable[Event], size_ms: int = WINDOW_MS) -> list[Row]:
    _check_ms("size_ms", size_ms)
    events = list(events)
    opened = {(e.seller, e.date_time - e.date_time % size_ms) for e in events if type(e) is Auction}
    return sorted(
        {
            (p.id, p.name, start)
            for p in events
            if type(p) is Person
            and (p.id, (start := p.date_time - p.date_time % size_ms)) in opened
        }
    )


def q11(events: Iterable[Event], gap_ms: int = GAP_MS) -> list[Row]:
    _check_ms("gap_ms", gap_ms)
    times: dict[int, list[int]] = defaultdict(list)
    for b in _bids(events):
        times[b.bidder].append(b.date_time)
    rows = []
    for bidder, ts in times.items():
        ts.sort()
        first = last = ts[0]
        count = 0
        for t in ts:
            if t - last >= gap_ms:  # [last, last + gap) and [t, t + gap) do not overlap
                rows.append((bidder, count, first, last + gap_ms))
                first, count = t, 0
            last = t
            count += 1
        rows.append((bidder, count, first, last + gap_ms))
    return sorted(rows)


REFERENCES: dict[str, Callable[..., list[Row]]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q4": q4,
    "q5": q5,
    "q7": q7,
    "q8": q8,
    "q11": q11,
}
"""Each query's reference, by name; the windowed ones take their window sizes in ms."""
