"""The Nexmark generator and source: events as a pure function of (seed, position), the
standard's proportions, ids, references and times, bounded out-of-orderness, partitions
that replay from any position whoever reads them, pacing, and the codec."""

from __future__ import annotations

import math
import pickle
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.nexmark import Auction, Bid, GeneratorConfig, Nexmark, Person
from examples.nexmark.generator import (
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    HOT_CHANNELS,
    last_base0_auction_id,
    last_base0_person_id,
)
from examples.nexmark.model import kind_of
from examples.nexmark.queries import Params, q1
from runtime.codec import packb, unpackb
from runtime.params import ParamError

N = 20_000
SOURCE = Nexmark(events=N, seed=7, partitions_count=4)
STREAM = [SOURCE.event_at(k) for k in range(N)]


def read_all(source: Nexmark, partition: str, chunk: int, start: int = 0) -> list:
    reader = source.open_partition(partition, 0.0)
    reader.seek(start)
    out: list = []
    while (polled := reader.poll(math.inf, chunk)) is not None:
        out.extend(polled[0])
    return out


# --- Determinism and partitions ----------------------------------------------------------


def test_the_same_seed_gives_the_same_events_and_another_seed_others() -> None:
    again = Nexmark(events=N, seed=7, partitions_count=1)  # another partitioning, too
    assert [again.event_at(k) for k in range(N)] == STREAM
    other = Nexmark(events=N, seed=8)
    assert sum(other.event_at(k) != STREAM[k] for k in range(1000)) > 900


@pytest.mark.parametrize("partitions", [1, 3, 4, 7])
def test_partitions_together_are_the_stream_whatever_their_count(partitions: int) -> None:
    source = Nexmark(events=N, seed=7, partitions_count=partitions)
    for i, name in enumerate(source.partitions()):
        assert read_all(source, name, 1000) == STREAM[i::partitions]


def test_a_partition_is_the_same_whatever_the_size_of_the_polls() -> None:
    assert read_all(SOURCE, "p1", 1) == read_all(SOURCE, "p1", 333) == STREAM[1::4]


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 9),
    data=st.data(),
    events=st.integers(0, 400),
    group=st.integers(1, 12),
)
def test_any_partition_replays_from_any_position(
    partitions: int, data: st.DataObject, events: int, group: int
) -> None:
    source = Nexmark(
        events=events, seed=3, partitions_count=partitions, out_of_order_group_size=group
    )
    index = data.draw(st.integers(0, partitions - 1), label="partition")
    name = f"p{index}"
    reader = source.open_partition(name, 0.0)
    # Read a while, in polls of any size; the position is the next owned position.
    read: list = []
    for size in data.draw(st.lists(st.integers(1, 50), max_size=5), label="polls"):
        polled = reader.poll(math.inf, size)
        if polled is None:
            break
        read.extend(polled[0])
    position = reader.position()
    assert position % partitions == index
    assert read == [source.event_at(k) for k in range(index, min(position, events), partitions)]
    # A new reader sought there (another task, after a move) continues exactly.
    rest = read_all(source, name, data.draw(st.integers(1, 64), label="chunk"), position)
    assert read + rest == [source.event_at(k) for k in range(index, events, partitions)]
    # Seeking anywhere starts at the first owned position at or after it.
    start = data.draw(st.integers(0, events + 5), label="seek")
    first = start + (index - start) % partitions
    assert read_all(source, name, 17, start) == [
        source.event_at(k) for k in range(first, events, partitions)
    ]


def test_an_exhausted_partition_stays_exhausted_at_its_end_position() -> None:
    reader = Nexmark(events=10, partitions_count=4).open_partition("p2", 0.0)
    assert len(reader.poll(math.inf, 100)[0]) == 2  # positions 2 and 6
    assert reader.poll(math.inf, 100) is None
    assert reader.position() == 10
    with pytest.raises(ValueError, match="position must be an int >= 0"):
        reader.seek(-1)


# --- The standard's proportions, ids and references --------------------------------------


def test_fifty_events_are_one_person_three_auctions_and_forty_six_bids() -> None:
    kinds = Counter(kind_of(e) for e in STREAM)
    assert kinds == {"person": N // 50, "auction": 3 * N // 50, "bid": 46 * N // 50}
    for k in range(0, N, 50):
        assert [kind_of(e) for e in STREAM[k : k + 4]] == ["person", *["auction"] * 3]


def test_people_and_auctions_are_numbered_in_order_from_1000() -> None:
    people = [e.id for e in STREAM if type(e) is Person]
    auctions = [e.id for e in STREAM if type(e) is Auction]
    assert people == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + len(people)))
    assert auctions == list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + len(auctions)))


def test_references_stay_among_the_active_people_and_in_flight_auctions() -> None:
    config = SOURCE
    for k, e in enumerate(STREAM):
        last_person = last_base0_person_id(k) + FIRST_PERSON_ID
        first_active = max(last_person + 1 - config.num_active_people, FIRST_PERSON_ID)
        if type(e) is Auction:
            assert first_active <= e.seller <= last_person + 10
            assert 10 <= e.category <= 14
            assert e.reserve >= e.initial_bid >= 100
            assert e.expires > e.date_time
        elif type(e) is Bid:
            last_auction = last_base0_auction_id(k) + FIRST_AUCTION_ID
            first_in_flight = max(last_auction - config.num_in_flight_auctions, FIRST_AUCTION_ID)
            assert first_in_flight <= e.auction <= last_auction + 10
            assert first_active <= e.bidder <= last_person + 10
            assert 100 <= e.price <= 100_000_000
            assert e.channel in HOT_CHANNELS or e.channel.startswith("channel-")


def test_hot_auctions_bidders_and_sellers_come_in_the_standard_s_ratios() -> None:
    bids = [(k, e) for k, e in enumerate(STREAM) if type(e) is Bid]
    auctions = [(k, e) for k, e in enumerate(STREAM) if type(e) is Auction]

    def share(pairs: list, hot: object) -> float:
        return sum(hot(k, e) for k, e in pairs) / len(pairs)  # type: ignore[operator]

    # Hot with probability 1 - 1/ratio (2, 4, 4), plus the cold draws that land on them.
    on_hot_auction = share(
        bids, lambda k, b: b.auction - 1000 == last_base0_auction_id(k) // 100 * 100
    )
    assert 0.48 < on_hot_auction < 0.56
    by_hot_bidder = share(
        bids, lambda k, b: b.bidder - 1000 == last_base0_person_id(k) // 100 * 100 + 1
    )
    assert 0.73 < by_hot_bidder < 0.79
    by_hot_seller = share(
        auctions, lambda k, a: a.seller - 1000 == last_base0_person_id(k) // 100 * 100
    )
    assert 0.70 < by_hot_seller < 0.80
    channels = Counter(b.channel in HOT_CHANNELS for _k, b in bids)
    assert 0.47 < channels[True] / len(bids) < 0.53


def test_events_average_the_standard_s_sizes() -> None:
    def mean_size(kind: type, fields: tuple[str, ...], fixed: int) -> float:
        sized = [fixed + sum(len(getattr(e, f)) for f in fields) for e in STREAM if type(e) is kind]
        return sum(sized) / len(sized)

    assert 90 < mean_size(Bid, ("extra",), 32) < 110
    assert (
        180
        < mean_size(Person, ("name", "email_address", "credit_card", "city", "state", "extra"), 8)
        < 220
    )
    assert 450 < mean_size(Auction, ("item_name", "description", "extra"), 48) < 550


def test_event_time_is_base_time_plus_the_event_number_times_the_inter_event_delay() -> None:
    assert [e.date_time for e in STREAM] == [1_700_000_000_000 + k // 10 for k in range(N)]
    slow = Nexmark(events=100, base_time_ms=5_000, event_rate=3)
    assert [slow.event_at(k).date_time for k in range(7)] == [
        5000,
        5333,
        5666,
        6000,
        6333,
        6666,
        7000,
    ]


# --- Out of order ------------------------------------------------------------------------


@pytest.mark.parametrize("group", [3, 5, 50, 1000])
def test_out_of_order_groups_shuffle_ids_within_a_bounded_lateness(group: int) -> None:
    events = 10_007  # a partial last group
    source = Nexmark(events=events, seed=7, out_of_order_group_size=group, event_rate=1000)
    ids = [source.event_id(k) for k in range(events)]
    assert sorted(ids) == list(range(events))  # every event once, the partial group too
    assert ids != list(range(events))
    assert all(k - k % group <= i < k - k % group + group for k, i in enumerate(ids))
    times = [source.event_at(k).date_time for k in range(events)]
    assert times == [source.timestamp_ms(i) for i in ids]
    latest = -1
    for k, t in enumerate(times):
        latest = max(latest, t)
        assert latest - t <= source.max_out_of_orderness_ms
        assert source.watermark_ms(k) <= min(times[k : k + 2 * group])
    assert max(m - t for m, t in zip(_running_max(times), times, strict=True)) > 0


def test_groups_whose_size_divides_952_stay_in_order_as_in_the_standard() -> None:
    for group in (2, 4, 7, 8, 14, 17, 952):  # 953 = 1 (mod group): (i * 953) % group == i
        source = Nexmark(events=5000, out_of_order_group_size=group)
        assert [source.event_id(k) for k in range(4000)] == list(range(4000))


def _running_max(xs: list[int]) -> list[int]:
    out, top = [], -1
    for x in xs:
        top = max(top, x)
        out.append(top)
    return out


def test_out_of_order_content_follows_the_id_not_the_position() -> None:
    shuffled = Nexmark(events=N, seed=7, out_of_order_group_size=5)
    for k in range(0, 500):
        assert shuffled.event_at(k) == STREAM[shuffled.event_id(k)]


# --- Pacing ------------------------------------------------------------------------------


def test_a_paced_partition_emits_what_is_due_stamped_when_it_was_due() -> None:
    source = Nexmark(events=1000, rate=100.0, partitions_count=2)  # 50/s per partition
    reader = source.open_partition("p1", 1000.0)
    assert reader.poll(1000.01, 100) == ([], [])
    assert reader.next_due(1000.0) == pytest.approx(1000.02)  # position 1 due at 2/100 s
    values, stamps = reader.poll(1000.1, 100)  # positions 1, 3, 5, 7, 9 are due
    assert values == [source.event_at(k) for k in (1, 3, 5, 7, 9)]
    assert stamps == pytest.approx([1000.02, 1000.04, 1000.06, 1000.08, 1000.10])
    assert reader.position() == 11
    assert reader.poll(1e12, 10_000)[0] == [source.event_at(k) for k in range(11, 1000, 2)]
    assert reader.poll(1e12, 10) is None


def test_an_unpaced_partition_stamps_records_with_the_poll_s_time() -> None:
    reader = Nexmark(events=100, partitions_count=1).open_partition("p0", 0.0)
    values, stamps = reader.poll(5.0, 10)
    assert len(values) == 10 and stamps == [5.0] * 10
    assert reader.next_due(5.0) == 5.0 and reader.lag() is None


# --- Records and descriptions cross processes --------------------------------------------


def test_events_and_the_source_survive_the_codec_and_pickle() -> None:
    sample = [STREAM[0], STREAM[1], STREAM[10]]
    assert [type(e) for e in sample] == [Person, Auction, Bid]
    assert list(unpackb(packb(sample))) == sample
    assert pickle.loads(pickle.dumps(sample)) == sample
    SOURCE.event_at(3)  # its hash object is made: the description still pickles
    copy = pickle.loads(pickle.dumps(SOURCE))
    assert copy == SOURCE and copy.event_at(3) == STREAM[3]


# --- Bad descriptions and params ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0}, r"Nexmark.rate must be a number > 0"),
        ({"partitions_count": 0}, r"Nexmark.partitions_count must be an int >= 1"),
        ({"events": -1}, r"Nexmark.events must be an int >= 0"),
        ({"out_of_order_group_size": 1906}, r"must not be a multiple of 953"),
        ({"seed": "x"}, r"Nexmark.seed must be an int"),
        ({"event_rate": 0}, r"Nexmark.event_rate must be an int >= 1"),
        ({"avg_bid_bytes": 10**9}, r"Nexmark.avg_bid_bytes must be <="),
    ],
)
def test_a_bad_description_is_refused_naming_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Nexmark(**kwargs)


def test_a_bad_partition_is_refused_naming_the_partitions() -> None:
    with pytest.raises(ValueError, match=r"has no partition 'p9'"):
        SOURCE.open_partition("p9", 0.0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"events": "lots"}, r"param 'events' must be an int"),
        ({"partitions": 0}, r"param 'partitions' must be >= 1"),
        ({"rate": -1}, r"param 'rate' must be >= 0"),
        ({"out_of_order_group_size": 953}, r"param 'out_of_order_group_size'"),
        ({"colour": "blue"}, r"unknown param\(s\) colour"),
    ],
)
def test_bad_job_params_are_refused_naming_the_param(params: dict, message: str) -> None:
    with pytest.raises(ParamError, match=message):
        q1(params)


def test_default_params_build() -> None:
    assert Params().events == 100_000
    assert isinstance(GeneratorConfig().event_at(0), Person)
