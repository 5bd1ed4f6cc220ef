"""The Nexmark event generator: each event a pure function of (config, event number).

Follows the standard generator (Beam's ``NexmarkGenerator`` / ``GeneratorConfig`` and the
``Person`` / ``Auction`` / ``Bid`` generators, ported by nexmark-flink): the same
proportions, id spaces, hot ratios, active people and in-flight auctions, auction
lengths, string sizes and event times. What differs is the randomness (see below).

Event numbers and ids
    The stream is a sequence of *event numbers* (positions) 0, 1, 2, ... Position ``k``
    carries the event of *id* ``event_id(k)``: ``k`` itself, or with an out-of-order group
    size ``n > 1`` a permutation within each group of ``n`` consecutive positions (the
    standard's ``base + (k * 953) % n``; in a bounded stream the last, partial group of
    ``m`` positions is permuted within itself, so that the ids are exactly 0..events-1).
    As in the standard, a group size that divides 952 (2, 4, 7, 8, 14, 17...) leaves
    the stream in order, 953 being 1 modulo it.
    An id's residue modulo 50 makes it a person (0), an auction (1-3) or a bid (4-49):
    1 person : 3 auctions : 46 bids. Person ``i`` (base 0) has id ``1000 + i``, auction
    ``j`` id ``1000 + j``; they are numbered in id order.

Event time
    ``date_time = base_time_ms + event_id * 1000 // event_rate`` (``event_rate``: the
    standard's first event rate, events per second of event time), whatever the
    wall-clock pacing. With groups of ``n`` a position's event time is at most
    ``(n - 1)`` inter-event delays away from its in-order time, and
    :meth:`GeneratorConfig.watermark_ms` (the event time of its group's first id) is a
    lower bound on the event time of the position and of every later one.

References between events (as the standard)
    An auction's seller is, with probability ``1 - 1/hot_sellers_ratio``, the first person
    of the last batch of 100 people, else one of the last ``num_active_people`` people (or
    up to 10 yet to come). A bid is for, with probability ``1 - 1/hot_auction_ratio``, the
    first auction of the last batch of 100, else one of the last
    ``num_in_flight_auctions`` auctions (or up to 10 yet to come); its bidder is the second
    person of the last batch of 100 with probability ``1 - 1/hot_bidders_ratio``, else an
    active person. An auction lasts ``1 + uniform[0, 2h)`` ms, ``h`` the event time it
    takes to generate ``num_in_flight_auctions`` more auctions. Prices are
    ``round(100 * 10 ** uniform[0, 6))`` cents; a bid's channel is one of 4 hot ones half of
    the time, else one of 10,000 ``channel-N`` (each with its own URL).

Randomness
    The standard seeds ``java.util.Random`` with the event id (no seed of its own). Here an
    event's draws are 64-bit words of SHAKE-256 over ``seed`` and its id (more if needed),
    each taken modulo the range drawn from: uniform within 2**-11 for every range used,
    independent across events, identical on every platform and Python version, and
    cheap. Random strings are slices at random offsets of fixed pseudo-random texts
    (SHAKE-256 of a constant): letters for ``extra``, letters with about 1 in 13
    characters a space (an underscore in URLs) for names, descriptions and e-mail
    addresses, trimmed, as the standard's. So events differ from Beam's byte for byte,
    not in distribution.

Errors: :class:`ValueError` naming the field for an invalid configuration.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from .model import Auction, Bid, Event, Person

__all__ = [
    "AUCTION_PROPORTION",
    "BID_PROPORTION",
    "FIRST_AUCTION_ID",
    "FIRST_CATEGORY_ID",
    "FIRST_PERSON_ID",
    "NUM_CATEGORIES",
    "PERSON_PROPORTION",
    "PROPORTION_DENOMINATOR",
    "GeneratorConfig",
    "last_base0_auction_id",
    "last_base0_person_id",
]

# The standard's constants (GeneratorConfig, PersonGenerator, AuctionGenerator, BidGenerator).
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_PROPORTION = 1
AUCTION_PROPORTION = 3
BID_PROPORTION = 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
PERSON_ID_LEAD = 10  # ids of people not generated yet that auctions and bids may name
AUCTION_ID_LEAD = 10  # likewise for auctions named by bids
HOT_SELLER_RATIO = 100  # hot sellers, bidders and auctions: the first of each batch of 100
HOT_BIDDER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_CHANNELS_RATIO = 2
CHANNELS_NUMBER = 10_000
OUT_OF_ORDER_STRIDE = 953  # the standard's permutation within an out-of-order group
MIN_STRING_LENGTH = 3

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES = (
    "Peter",
    "Paul",
    "Luke",
    "John",
    "Saul",
    "Vicky",
    "Kate",
    "Julie",
    "Sarah",
    "Deiter",
    "Walter",
)
LAST_NAMES = (
    "Shultz",
    "Abrams",
    "Spencer",
    "White",
    "Bartels",
    "Walton",
    "Smith",
    "Jones",
    "Noris",
)
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

_TEXT_SIZE = 1 << 20
"""Characters of each fixed text random strings are sliced from."""
MAX_AVG_BYTES = _TEXT_SIZE // 4
"""Largest ``avg_*_bytes``: an ``extra`` (up to 1.2 times it) must fit in the text."""


def _texts() -> tuple[str, str, str]:
    raw = hashlib.shake_256(b"streampilot nexmark text").digest(_TEXT_SIZE)
    letters = bytes(97 + b % 26 for b in range(256))
    spaced = bytes(32 if b < 20 else 97 + b % 26 for b in range(256))  # 20/256 ~ 1/13
    words = raw.translate(spaced).decode("ascii")
    return raw.translate(letters).decode("ascii"), words, words.replace(" ", "_")


_LETTERS, _WORDS, _URL_WORDS = _texts()


class _Draws:
    """Uniform draws for one event: 64-bit words of the keyed hash of its id.

    ``below(n)`` is the next word modulo ``n`` (uniform within ``n / 2**64``); 16 words a
    block, a new block (the hash of the id and the block's number) when they run out.
    """

    __slots__ = ("_block", "_hasher", "_id", "_words")

    def __init__(self, hasher: Any, event_id: int) -> None:
        self._hasher = hasher
        self._id = event_id
        self._block = 0
        self._words: list[int] = []

    def _refill(self) -> None:
        h = self._hasher.copy()
        h.update(b"%d:%d" % (self._id, self._block))
        self._block += 1
        self._words = list(_WORDS_OF_BLOCK(h.digest(_BLOCK_BYTES)))

    def below(self, n: int) -> int:
        """A uniform int in ``[0, n)``, ``n <= 2**53``."""
        if not self._words:
            self._refill()
        return self._words.pop() % n

    def unit(self) -> float:
        """A uniform float in ``[0, 1)`` (53 bits, as Java's ``nextDouble``)."""
        return self.below(1 << 53) / (1 << 53)


_BLOCK_BYTES = 128
_WORDS_OF_BLOCK = struct.Struct(f"<{_BLOCK_BYTES // 8}Q").unpack


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)  # Java's Math.round


def _next_string(d: _Draws, max_length: int, text: str = _WORDS) -> str:
    n = MIN_STRING_LENGTH + d.below(max_length - MIN_STRING_LENGTH)
    start = d.below(_TEXT_SIZE - n)
    return text[start : start + n].strip()


def _next_extra(d: _Draws, current_size: int, average_size: int) -> str:
    """Letters making ``current_size + len(extra)`` ``average_size`` on average (0.8x to 1.2x)."""
    if current_size > average_size:
        return ""
    wanted = average_size - current_size
    delta = _round_half_up(wanted * 0.2)
    size = wanted - delta + (d.below(2 * delta) if delta else 0)
    start = d.below(_TEXT_SIZE - size)
    return _LETTERS[start : start + size]


def _next_price(d: _Draws) -> int:
    return _round_half_up(10.0 ** (d.unit() * 6.0) * 100.0)


def last_base0_person_id(event_id: int) -> int:
    """The last person generated at or before ``event_id`` (base 0)."""
    epoch, offset = divmod(event_id, PROPORTION_DENOMINATOR)
    return epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION - 1)


def last_base0_auction_id(event_id: int) -> int:
    """The last auction generated at or before ``event_id`` (base 0; -1 before the first)."""
    epoch, offset = divmod(event_id, PROPORTION_DENOMINATOR)
    if offset < PERSON_PROPORTION:  # a person: the last auction of the previous epoch
        epoch -= 1
        offset = AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:  # a bid: this epoch's last one
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _base_url(d: _Draws) -> str:
    parts = [_next_string(d, 5, _URL_WORDS) for _ in range(3)]
    return f"https://www.nexmark.com/{parts[0]}/{parts[1]}/{parts[2]}/item.htm?query=1"


@cache
def _channel_url(number: int) -> str:
    """The URL of cold channel ``channel-<number>`` (fixed per channel, as the standard's
    cache of them): 9 in 10 carry the channel id (Java's ``|Integer.reverse(number)|``)."""
    d = _Draws(hashlib.shake_256(b"nexmark-channel:"), number)
    url = _base_url(d)
    if d.below(10) > 0:
        reversed_bits = int(f"{number:032b}"[::-1], 2)
        if reversed_bits >= 1 << 31:
            reversed_bits -= 1 << 32
        url += f"&channel_id={abs(reversed_bits)}"
    return url


HOT_URLS = tuple(_base_url(_Draws(hashlib.shake_256(b"nexmark-hot-channel:"), i)) for i in range(4))


def _check_int(owner: str, name: str, value: Any, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an int >= {minimum} ({hint}), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """What the events are: every field but ``seed`` is the standard's knob of that name
    (``NexmarkConfiguration``), with its default.

    ``seed``: the stream's seed (the standard has none). ``base_time_ms``: the event time
    of event 0, epoch ms (the standard takes the wall clock; fixed here to stay
    replayable). ``event_rate``: events per second of event time (``firstEventRate``).
    ``out_of_order_group_size``: positions whose events are shuffled among themselves (1:
    in order). ``events``: the stream's length, or None for an unbounded stream.
    """

    events: int | None = None
    seed: int = 0
    base_time_ms: int = 1_700_000_000_000
    event_rate: int = 10_000
    out_of_order_group_size: int = 1
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.events is not None:
            _check_int(owner, "events", self.events, 0, "None = unbounded")
        _check_int(owner, "seed", self.seed, -(2**63), "a 64-bit int")
        if self.seed >= 2**63:
            raise ValueError(
                f"{owner}.seed must be an int < 2**63 (a 64-bit int), got {self.seed!r}"
            )
        _check_int(owner, "base_time_ms", self.base_time_ms, 0, "epoch milliseconds")
        _check_int(owner, "event_rate", self.event_rate, 1, "events per second of event time")
        _check_int(
            owner, "out_of_order_group_size", self.out_of_order_group_size, 1, "1 = in order"
        )
        if self.out_of_order_group_size % OUT_OF_ORDER_STRIDE == 0:
            raise ValueError(
                f"{owner}.out_of_order_group_size must not be a multiple of "
                f"{OUT_OF_ORDER_STRIDE} (the standard's stride would repeat events), "
                f"got {self.out_of_order_group_size}"
            )
        for name in (
            "num_active_people",
            "num_in_flight_auctions",
            "hot_auction_ratio",
            "hot_sellers_ratio",
            "hot_bidders_ratio",
        ):
            _check_int(owner, name, getattr(self, name), 1, "the standard's knob")
        for name in ("avg_person_bytes", "avg_auction_bytes", "avg_bid_bytes"):
            _check_int(owner, name, getattr(self, name), 0, "average bytes of an event")
            if getattr(self, name) > MAX_AVG_BYTES:
                raise ValueError(
                    f"{owner}.{name} must be <= {MAX_AVG_BYTES}, got {getattr(self, name)}"
                )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hasher", None)  # a hash object does not pickle; it is made again
        return state

    @cached_property
    def _hasher(self) -> Any:
        return hashlib.shake_256(b"nexmark:%d:" % self.seed)

    # -- positions, ids and times ------------------------------------------------------

    def event_id(self, position: int) -> int:
        """The id of the event at ``position`` (the standard's adjusted event number)."""
        n = self.out_of_order_group_size
        if n == 1:
            return position
        base = position - position % n
        if self.events is not None and base + n > self.events:
            n = self.events - base  # the last, partial group: permuted within itself
            if n % OUT_OF_ORDER_STRIDE == 0:
                return position
        return base + (position - base) * OUT_OF_ORDER_STRIDE % n

    def timestamp_ms(self, event_id: int) -> int:
        """Event time of event ``event_id``, epoch ms."""
        return self.base_time_ms + event_id * 1000 // self.event_rate

    def watermark_ms(self, position: int) -> int:
        """A lower bound on the event time at ``position`` and every later position (the
        standard's watermark: the time of the first id of the position's group)."""
        n = self.out_of_order_group_size
        return self.timestamp_ms(position - position % n)

    @property
    def max_out_of_orderness_ms(self) -> int:
        """How far behind the latest event time seen an event's time can be."""
        return -(-(self.out_of_order_group_size - 1) * 1000 // self.event_rate)

    # -- events ------------------------------------------------------------------------

    def event_at(self, position: int) -> Event:
        """The event at ``position`` (a pure function of the config and ``position``)."""
        return self.event(self.event_id(position))

    def event(self, event_id: int) -> Event:
        """The event of id ``event_id``."""
        d = _Draws(self._hasher, event_id)
        rem = event_id % PROPORTION_DENOMINATOR
        if rem >= PERSON_PROPORTION + AUCTION_PROPORTION:
            return self._bid(event_id, d)
        if rem >= PERSON_PROPORTION:
            return self._auction(event_id, d)
        return self._person(event_id, d)

    def _next_base0_person_id(self, event_id: int, d: _Draws) -> int:
        people = last_base0_person_id(event_id) + 1
        active = min(people, self.num_active_people)
        return people - active + d.below(active + PERSON_ID_LEAD)

    def _next_base0_auction_id(self, event_id: int, d: _Draws) -> int:
        last = last_base0_auction_id(event_id)
        first = max(last - self.num_in_flight_auctions, 0)
        return first + d.below(last - first + 1 + AUCTION_ID_LEAD)

    def _person(self, event_id: int, d: _Draws) -> Person:
        name = f"{FIRST_NAMES[d.below(len(FIRST_NAMES))]} {LAST_NAMES[d.below(len(LAST_NAMES))]}"
        email = f"{_next_string(d, 7)}@{_next_string(d, 5)}.com"
        card = " ".join([f"{d.below(10_000):04d}" for _ in range(4)])
        city = US_CITIES[d.below(len(US_CITIES))]
        state = US_STATES[d.below(len(US_STATES))]
        size = 8 + len(name) + len(email) + len(card) + len(city) + len(state)
        extra = _next_extra(d, size, self.avg_person_bytes)
        person_id = last_base0_person_id(event_id) + FIRST_PERSON_ID
        return Person(person_id, name, email, card, city, state, self.timestamp_ms(event_id), extra)

    def _auction(self, event_id: int, d: _Draws) -> Auction:
        if d.below(self.hot_sellers_ratio) > 0:
            seller = last_base0_person_id(event_id) // HOT_SELLER_RATIO * HOT_SELLER_RATIO
        else:
            seller = self._next_base0_person_id(event_id, d)
        category = FIRST_CATEGORY_ID + d.below(NUM_CATEGORIES)
        initial_bid = _next_price(d)
        timestamp = self.timestamp_ms(event_id)
        # The auction lasts about as long as it takes num_in_flight_auctions more to come.
        ahead = self.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION
        horizon = self.timestamp_ms(event_id + ahead) - timestamp
        expires = timestamp + 1 + d.below(max(horizon * 2, 1))
        name = _next_string(d, 20)
        description = _next_string(d, 100)
        reserve = initial_bid + _next_price(d)
        size = 8 + len(name) + len(description) + 8 + 8 + 8 + 8 + 8
        extra = _next_extra(d, size, self.avg_auction_bytes)
        return Auction(
            last_base0_auction_id(event_id) + FIRST_AUCTION_ID,
            name,
            description,
            initial_bid,
            reserve,
            timestamp,
            expires,
            seller + FIRST_PERSON_ID,
            category,
            extra,
        )

    def _bid(self, event_id: int, d: _Draws) -> Bid:
        if d.below(self.hot_auction_ratio) > 0:
            auction = last_base0_auction_id(event_id) // HOT_AUCTION_RATIO * HOT_AUCTION_RATIO
        else:
            auction = self._next_base0_auction_id(event_id, d)
        if d.below(self.hot_bidders_ratio) > 0:
            # The second person of the batch, so that hot bidders are not hot sellers.
            bidder = last_base0_person_id(event_id) // HOT_BIDDER_RATIO * HOT_BIDDER_RATIO + 1
        else:
            bidder = self._next_base0_person_id(event_id, d)
        price = _next_price(d)
        if d.below(HOT_CHANNELS_RATIO) > 0:
            i = d.below(len(HOT_CHANNELS))
            channel, url = HOT_CHANNELS[i], HOT_URLS[i]
        else:
            number = d.below(CHANNELS_NUMBER)
            channel, url = f"channel-{number}", _channel_url(number)
        extra = _next_extra(d, 8 + 8 + 8 + 8, self.avg_bid_bytes)
        return Bid(
            auction + FIRST_AUCTION_ID,
            bidder + FIRST_PERSON_ID,
            price,
            channel,
            url,
            self.timestamp_ms(event_id),
            extra,
        )
