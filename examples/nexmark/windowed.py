"""The Nexmark queries that need event time, as streampilot jobs: q3, q4, q5, q7, q8, q11.

Each job reads one :class:`~examples.nexmark.source.Nexmark` source on event time (its
records stamped with their ``date_time``, the watermark trailing the highest time seen
by the generator's bound on out-of-orderness, :func:`event_time`), splits the kinds of
event it needs with a ``flat_map`` per kind, and runs the query on the runtime's keyed
operators: windows (:mod:`runtime.windows`), window joins and co-process functions with
event-time timers (:mod:`runtime.joins`). Records cross workers on every keyed edge.

Operators (``events`` is the source; each keyed operator has ``parallelism`` tasks):

- q3 local item suggestion: ``persons`` (in OR, ID, CA) and ``auctions`` (category 10)
  -> ``join`` (:class:`LocalItems`, keyed by person id = seller) -> rows.
- q4 average closing price per category: ``auctions`` and ``bids`` -> ``closing``
  (:class:`ClosingPrice`, keyed by auction id: each auction's best bid within its
  lifetime, emitted when its expiry timer fires) -> ``average`` (keyed by category, the
  running mean) -> rows ``(category, mean, auctions)``, one per auction closed: the
  last of a category (the one over the most auctions) is the query's
  (:func:`final_averages`).
- q5 hot items: ``bids`` -> ``counts`` (sliding windows, bids per auction) -> ``hot``
  (tumbling windows of the slide keyed by the first stage's window: its results are
  stamped just before their window's end, so each lands in the window of the slide that
  ends with it; :class:`MostBids`) -> rows. With ``two_phase``, ``counts`` is a
  ``window_aggregate`` (``counts`` and ``counts.merge``, :mod:`runtime.window_aggregate`):
  the same rows, and a hot auction's bids can be split over several tasks
  (``splitKey``, or the load balancer).
- q7 highest bid: ``bids`` -> ``partial`` (tumbling windows, keyed by the bid's
  millisecond modulo :data:`Q7_PARTIALS`: the highest bids of a share of the bids, so
  that no one task sees every bid) -> ``highest`` (the same windows keyed by window,
  :class:`HighestOf`) -> rows.
- q8 new users: ``persons`` and ``auctions`` -> ``sellers`` (tumbling windows, one
  result per seller and window, as the SQL's ``GROUP BY seller, TUMBLE(...)``) ->
  ``join`` (a tumbling window join of persons on id with sellers) -> rows.
- q11 user sessions: ``bids`` -> ``sessions`` (session windows per bidder, a count)
  -> rows.

The rows are those of :mod:`examples.nexmark.reference`, whose windows are the runtime's
(half-open, sessions that meet merge). :data:`READS` names, per query, an operator that
reads every event (its input rate is the query's throughput), :data:`STATEFUL` the
operator that holds its state (what a live plan rescales or moves).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from runtime import Dataflow
from runtime.eventtime import EventTime
from runtime.io import Sink
from runtime.joins import CoProcessFunction
from runtime.timers import KeyContext
from runtime.windows import RESOLUTION_S, Aggregate, Count, Session, Sliding, Tumbling

from . import reference as ref
from .model import Auction, Bid, Event, Person
from .source import Nexmark

__all__ = [
    "BUILDERS",
    "Q7_PARTIALS",
    "READS",
    "STATEFUL",
    "ClosingPrice",
    "HighestOf",
    "LocalItems",
    "MostBids",
    "build",
    "event_time",
    "final_averages",
]

Q7_PARTIALS = 61
"""q7's first stage: keys (a prime, so that bids a whole number of ms apart still spread)."""
CLOSED = "closed"
"""q4's state of an auction whose closing price was emitted: later bids are past its expiry."""


def event_time(source: Nexmark) -> EventTime:
    """The events' time: ``date_time`` (ms), the watermark trailing by the generator's
    bound on out-of-orderness (its out-of-order groups), so that no event is late."""
    return EventTime(
        "date_time", per_second=1000, max_out_of_orderness_s=source.max_out_of_orderness_ms / 1000
    )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# -- splitting the events by kind ---------------------------------------------------------


def persons(event: Event) -> tuple:
    return (event,) if type(event) is Person else ()


def auctions(event: Event) -> tuple:
    return (event,) if type(event) is Auction else ()


def bids(event: Event) -> tuple:
    return (event,) if type(event) is Bid else ()


def local_persons(event: Event) -> tuple:
    return (event,) if type(event) is Person and event.state in ref.Q3_STATES else ()


def category_auctions(event: Event) -> tuple:
    return (event,) if type(event) is Auction and event.category == ref.Q3_CATEGORY else ()


def person_id(person: Person) -> int:
    return person.id


def seller(auction: Auction) -> int:
    return auction.seller


def auction_id(auction: Auction) -> int:
    return auction.id


def bid_auction(bid: Bid) -> int:
    return bid.auction


def bidder(bid: Bid) -> int:
    return bid.bidder


def window_of(result: Any) -> tuple[int, int]:
    """The window of a window result, ``(start_ms, end_ms)``: the key of second stages."""
    return _ms(result.start), _ms(result.end)


def result_key(result: Any) -> Any:
    return result.key


# -- q3 ------------------------------------------------------------------------------------


class LocalItems(CoProcessFunction):
    """q3's incremental join per person id: persons of OR, ID, CA on the left, auctions
    of category 10 on the right by seller. Key state ``[seller, waiting]``: the person's
    ``(name, city, state)`` once it came (kept for good: every later auction of theirs
    joins, as the SQL's unwindowed join) and the ids of the auctions that came before it.
    Each row is emitted once, when its second side comes."""

    def process_left(self, key: int, person: Person, ctx: KeyContext) -> list:
        state = ctx.get()
        who = (person.name, person.city, person.state)
        ctx.set([who, []])
        return [(*who, a) for a in state[1]] if state else []

    def process_right(self, key: int, auction: Auction, ctx: KeyContext) -> list | None:
        state = ctx.get()
        if state is not None and state[0] is not None:
            return [(*state[0], auction.id)]
        if state is None:
            state = [None, []]
        state[1].append(auction.id)
        ctx.set(state)
        return None


# -- q4 ------------------------------------------------------------------------------------


class ClosingPrice(CoProcessFunction):
    """q4's first stage per auction id: auctions on the left, bids on the right. Emits
    ``(category, price)``, the auction's highest bid placed within its lifetime
    (``date_time <= bid <= expires``), when the watermark passes its expiry: an
    event-time timer just after ``expires`` (a bid at ``expires`` counts, and a watermark
    at ``expires`` does not rule one out). Nothing for an auction without such a bid.

    Key state: ``[None, pending]`` while the auction has not come (``pending``: the
    ``(date_time, price)`` of its bids so far); ``[(date_time, expires, category), best]``
    while it is open; :data:`CLOSED` after (bids that come then are past its expiry)."""

    def process_left(self, key: int, auction: Auction, ctx: KeyContext) -> None:
        state = ctx.get()
        opened, expires = auction.date_time, auction.expires
        prices = [p for t, p in (state[1] if state else ()) if opened <= t <= expires]
        ctx.set([(opened, expires, auction.category), max(prices, default=None)])
        ctx.timers.register_event_time(expires / 1000 + RESOLUTION_S)

    def process_right(self, key: int, bid: Bid, ctx: KeyContext) -> None:
        state = ctx.get()
        if state == CLOSED:
            return
        if state is None:
            ctx.set([None, [(bid.date_time, bid.price)]])
            return
        auction, best = state
        if auction is None:
            best.append((bid.date_time, bid.price))
        elif auction[0] <= bid.date_time <= auction[1] and (best is None or bid.price > best):
            state[1] = bid.price
        ctx.set(state)

    def on_timer(self, key: int, time: float, ctx: KeyContext) -> list:
        (_opened, _expires, category), best = ctx.get()
        ctx.set(CLOSED)
        return [] if best is None else [(category, best)]


def closing_category(closing: tuple[int, int]) -> int:
    return closing[0]


def running_average(category: int, closing: tuple[int, int], state: Any) -> tuple:
    """q4's second stage per category: the mean of the closing prices so far, with how
    many auctions it is over (the state: their sum and count)."""
    total, count = state.get((0, 0))
    total, count = total + closing[1], count + 1
    state.set((total, count))
    return ((category, total / count, count),)


def final_averages(rows: Iterable[tuple]) -> list[tuple]:
    """q4's result from its job's running rows ``(category, mean, auctions)``: each
    category's last mean (over the most auctions), as the reference's
    ``(category, mean)``, sorted."""
    last: dict[int, tuple] = {}
    for category, mean, count in rows:
        if category not in last or count > last[category][1]:
            last[category] = (mean, count)
    return sorted((category, mean) for category, (mean, _count) in last.items())


# -- q5 ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MostBids(Aggregate):
    """Of the window results ``(auction, start, end, bids)`` of one window: the most bids
    and the auctions that have them, ``(bids, [auction, ...])``."""

    def create(self) -> list:
        return [0, []]

    def add(self, acc: list, result: Any) -> list:
        if result.value > acc[0]:
            return [result.value, [result.key]]
        if result.value == acc[0]:
            acc[1].append(result.key)
        return acc

    def merge(self, a: list, b: list) -> list:
        if a[0] != b[0]:
            return a if a[0] > b[0] else b
        return [a[0], a[1] + b[1]]


def hot_rows(result: Any) -> list[tuple]:
    start, end = result.key
    most, hot = result.value
    return [(start, end, auction, most) for auction in hot]


# -- q7 ------------------------------------------------------------------------------------


def q7_partial(bid: Bid) -> int:
    return bid.date_time % Q7_PARTIALS


@dataclass(frozen=True)
class Highest(Aggregate):
    """The highest price of the bids and the bids at it, ``(price, [bid, ...])``."""

    def create(self) -> list:
        return [None, []]

    def add(self, acc: list, bid: Bid) -> list:
        if acc[0] is None or bid.price > acc[0]:
            return [bid.price, [bid]]
        if bid.price == acc[0]:
            acc[1].append(bid)
        return acc

    def merge(self, a: list, b: list) -> list:
        if a[0] is None or (b[0] is not None and b[0] > a[0]):
            return b
        if b[0] is None or a[0] > b[0]:
            return a
        return [a[0], a[1] + b[1]]


@dataclass(frozen=True)
class HighestOf(Aggregate):
    """:class:`Highest` over the results of a first stage of :class:`Highest` windows."""

    def create(self) -> list:
        return Highest().create()

    def add(self, acc: list, result: Any) -> list:
        return Highest().merge(acc, list(result.value))

    def merge(self, a: list, b: list) -> list:
        return Highest().merge(a, b)


def highest_rows(result: Any) -> list[tuple]:
    start, end = result.key
    return [
        (start, end, b.auction, b.bidder, b.price, b.date_time, b.extra) for b in result.value[1]
    ]


# -- q8 ------------------------------------------------------------------------------------


def new_user(person: Person, opened: Any) -> tuple:
    """A person of q8 and the seller's window result of the same window."""
    return (person.id, person.name, _ms(opened.start))


# -- q11 -----------------------------------------------------------------------------------


def session_row(result: Any) -> tuple:
    return (result.key, result.value, _ms(result.start), _ms(result.end))


# -- the jobs ------------------------------------------------------------------------------


def _q3(events: Any, p: int) -> Any:
    people = events.flat_map("persons", local_persons, parallelism=p).key_by(person_id)
    items = events.flat_map("auctions", category_auctions, parallelism=p).key_by(seller)
    return people.connect(items).process("join", LocalItems(), parallelism=p)


def _q4(events: Any, p: int) -> Any:
    opened = events.flat_map("auctions", auctions, parallelism=p).key_by(auction_id)
    placed = events.flat_map("bids", bids, parallelism=p).key_by(bid_auction)
    closing = opened.connect(placed).process("closing", ClosingPrice(), parallelism=p)
    return closing.key_by(closing_category).process("average", running_average, parallelism=p)


def _q5(events: Any, p: int, two_phase: bool = False) -> Any:
    size, slide = ref.WINDOW_MS / 1000, ref.SLIDE_MS / 1000
    placed = events.flat_map("bids", bids, parallelism=p).key_by(bid_auction)
    windows = Sliding(size, slide)
    if two_phase:
        counts = placed.window_aggregate("counts", windows, Count(), parallelism=p)
    else:
        counts = placed.window("counts", windows, aggregate=Count(), parallelism=p)
    hot = counts.key_by(window_of).window(
        "hot", Tumbling(slide), aggregate=MostBids(), parallelism=p
    )
    return hot.flat_map("rows", hot_rows, parallelism=p)


def _q7(events: Any, p: int) -> Any:
    size = Tumbling(ref.WINDOW_MS / 1000)
    placed = events.flat_map("bids", bids, parallelism=p).key_by(q7_partial)
    partial = placed.window("partial", size, aggregate=Highest(), parallelism=p)
    highest = partial.key_by(window_of).window(
        "highest", size, aggregate=HighestOf(), parallelism=p
    )
    return highest.flat_map("rows", highest_rows, parallelism=p)


def _q8(events: Any, p: int) -> Any:
    size = Tumbling(ref.WINDOW_MS / 1000)
    people = events.flat_map("persons", persons, parallelism=p).key_by(person_id)
    opened = events.flat_map("auctions", auctions, parallelism=p).key_by(seller)
    sellers = opened.window("sellers", size, aggregate=Count(), parallelism=p)
    both = people.connect(sellers.key_by(result_key))
    return both.window_join("join", size, new_user, parallelism=p)


def _q11(events: Any, p: int) -> Any:
    placed = events.flat_map("bids", bids, parallelism=p).key_by(bidder)
    gap = Session(ref.GAP_MS / 1000)
    sessions = placed.window("sessions", gap, aggregate=Count(), parallelism=p)
    return sessions.map("rows", session_row, parallelism=p)


BUILDERS = {"q3": _q3, "q4": _q4, "q5": _q5, "q7": _q7, "q8": _q8, "q11": _q11}
TWO_PHASE = {"q5": partial(_q5, two_phase=True)}
"""The queries that can count with a two-phase (splittable) windowed aggregation."""
READS = {
    "q3": "persons",
    "q4": "auctions",
    "q5": "bids",
    "q7": "bids",
    "q8": "persons",
    "q11": "bids",
}
STATEFUL = {
    "q3": "join",
    "q4": "closing",
    "q5": "counts",
    "q7": "partial",
    "q8": "join",
    "q11": "sessions",
}


def build(
    query: str, source: Nexmark, parallelism: int, sink: Sink, two_phase: bool = False
) -> Dataflow:
    """The job of ``query`` (a key of :data:`BUILDERS`) over ``source`` on event time,
    writing its rows to ``sink`` (see the module for its operators); ``two_phase`` only
    for a query of :data:`TWO_PHASE`."""
    if query not in BUILDERS:
        raise ValueError(f"no event-time job for query {query!r}; have {sorted(BUILDERS)}")
    if two_phase and query not in TWO_PHASE:
        raise ValueError(f"param 'two_phase' applies to {', '.join(TWO_PHASE)}, not {query}")
    flow = Dataflow(f"nexmark-{query}")
    events = flow.source("events", source, parallelism=parallelism, event_time=event_time(source))
    rows = (TWO_PHASE if two_phase else BUILDERS)[query](events, parallelism)
    rows.sink("sink", sink, parallelism=parallelism)
    return flow
