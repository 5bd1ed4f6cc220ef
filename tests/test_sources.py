"""Sources: one contract suite run against every source, then each source's own behaviour.

The contract (see :mod:`runtime.io`): the multiset of records over all tasks is the same
for any parallelism; a reader rate-limits against the ``now`` it is given (the tests use
synthetic clock values and never sleep); ``position`` / ``seek`` replay the rest of a
reader's stream exactly; a bounded reader ends with ``None``.
"""

from __future__ import annotations

import csv
import json
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.io import Source, SourceReader
from runtime.replay import FileReplay
from runtime.sources import CHUNK, Generator, parse_schedule

START = 1_700_000_000.0  # a realistic epoch time, so rounding is exercised
FAR = START + 1e7


@dataclass(frozen=True)
class Indexed(Generator):
    """Records carry their global index, so ownership and order are visible."""

    tag: str = "x"

    def make_records(self, rng, keys, start_index):
        return [(start_index + i, key, self.tag) for i, key in enumerate(keys)]


@dataclass(frozen=True)
class WrongLength(Generator):
    def make_records(self, rng, keys, start_index):
        return keys[1:]


def drain(reader: SourceReader, now: float = FAR, batch: int = 700) -> tuple[list, list]:
    values: list = []
    stamps: list = []
    while (polled := reader.poll(now, batch)) is not None:
        assert polled[0], "a reader with everything due must not return an empty batch"
        values += polled[0]
        stamps += polled[1]
    return values, stamps


def everything(source: Source, parallelism: int) -> Counter:
    """The multiset of all records of all tasks."""
    out: Counter = Counter()
    for i in range(parallelism):
        values, _ = drain(source.open(i, parallelism, START))
        out.update(json.dumps(v, sort_keys=True) for v in values)
    return out


def write_jsonl(path: Path, count: int) -> None:
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps({"i": i, "word": f"w{i % 7}", "tags": [i, "a"]}) + "\n")


def write_csv(path: Path, count: int) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["i", "name", "note"])
        for i in range(count):
            out.writerow([i, f"n{i % 5}", "with, comma" if i % 3 == 0 else ""])


SourceFactory = Callable[[Path, int, float], Source]


def make_generator(tmp: Path, records: int, rate: float) -> Source:
    return Generator(records=records, rate=rate, keys=50, zipf=1.0, omega=30, seed=7)


def make_indexed(tmp: Path, records: int, rate: float) -> Source:
    return Indexed(records=records, rate=rate, keys=20, seed=1, tag="t")


def make_jsonl(tmp: Path, records: int, rate: float) -> Source:
    write_jsonl(tmp / "in.jsonl", records)
    return FileReplay(str(tmp / "in.jsonl"), rate=rate)


def make_csv(tmp: Path, records: int, rate: float) -> Source:
    write_csv(tmp / "in.csv", records)
    return FileReplay(tmp / "in.csv", rate=rate)


contract = pytest.mark.parametrize(
    "factory",
    [make_generator, make_indexed, make_jsonl, make_csv],
    ids=["generator", "generator-subclass", "jsonl", "csv"],
)


# --- the contract, for every source -------------------------------------------------------


@contract
def test_same_multiset_for_any_parallelism(factory: SourceFactory, tmp_path: Path) -> None:
    source = factory(tmp_path, 3 * CHUNK + 77, 0.0)
    one = everything(source, 1)
    assert sum(one.values()) == 3 * CHUNK + 77
    assert everything(source, 2) == one
    assert everything(source, 3) == one


@contract
def test_description_pickles(factory: SourceFactory, tmp_path: Path) -> None:
    source = factory(tmp_path, 100, 10.0)
    copy = pickle.loads(pickle.dumps(source))
    assert copy == source
    assert everything(copy, 2) == everything(source, 2)


@contract
def test_rate_limits_against_the_given_clock(factory: SourceFactory, tmp_path: Path) -> None:
    source = factory(tmp_path, 5000, 1000.0)
    readers = [source.open(i, 3, START) for i in range(3)]
    assert all(r.poll(START, 10_000) == ([], []) for r in readers)
    due = 0
    for now, expected in [(START + 1.0, 1000), (START + 2.5, 2500), (START + 4.0, 4000)]:
        for r in readers:
            values, stamps = r.poll(now, 10_000)
            due += len(values)
            assert all(START < t <= now + 1e-6 for t in stamps)
            assert stamps == sorted(stamps)
            assert r.next_due(now) > now
        assert expected - 3 <= due <= expected, f"at {now - START} s"
    rest = sum(len(drain(r, now=float("inf"))[0]) for r in readers)
    assert rest in range(1000, 1004)


@contract
def test_poll_at_next_due_yields_a_record(factory: SourceFactory, tmp_path: Path) -> None:
    source = factory(tmp_path, 3000, 7777.0)
    reader = source.open(1, 2, START)
    now, count = START, 0
    while (polled := reader.poll(now, 10)) is not None:
        count += len(polled[0])
        due = reader.next_due(now)
        assert polled[0] or due > now
        now = due
    assert count == len(drain(source.open(1, 2, START))[0]) > 900


@contract
def test_seek_replays_the_rest(factory: SourceFactory, tmp_path: Path) -> None:
    source = factory(tmp_path, 2 * CHUNK + 500, 400.0)
    reader = source.open(1, 2, START)
    reader.poll(START + 3.0, 200)
    reader.poll(START + 4.2, 10_000)
    position = reader.position()
    rest = drain(reader)
    other = source.open(1, 2, START)
    other.seek(position)
    assert drain(other) == rest
    reader.seek(position)  # rewinding the same reader works too
    assert drain(reader) == rest


@contract
def test_bounded_reader_ends(factory: SourceFactory, tmp_path: Path) -> None:
    reader = factory(tmp_path, 10, 0.0).open(0, 1, START)
    values, stamps = reader.poll(START + 5, 100)
    assert len(values) == 10
    assert stamps == [START + 5] * 10  # unthrottled: stamped with now
    assert reader.poll(START + 6, 100) is None
    assert reader.poll(START + 7, 100) is None
    reader.close()


# --- Generator ----------------------------------------------------------------------------


def keys_of(gen: Generator, parallelism: int = 1) -> list:
    return [v for i in range(parallelism) for v in drain(gen.open(i, parallelism, START))[0]]


@pytest.mark.parametrize("records", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 4321])
@pytest.mark.parametrize("parallelism", [1, 2, 5])
def test_bounded_count_is_exact(records: int, parallelism: int) -> None:
    assert len(keys_of(Generator(records=records), parallelism)) == records


def test_default_records_are_key_names() -> None:
    keys = keys_of(Generator(records=2000, keys=100, seed=3))
    assert set(keys) <= {f"k{r:05d}" for r in range(100)}
    assert len(set(keys)) == 100
    wide = keys_of(Generator(records=50, keys=100_001))
    assert all(len(k) == 7 for k in wide)


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a = keys_of(Generator(records=3000, zipf=0.8, seed=11))
    assert keys_of(Generator(records=3000, zipf=0.8, seed=11)) == a
    assert keys_of(Generator(records=3000, zipf=0.8, seed=12)) != a


def test_zipf_skew_matches_alpha() -> None:
    counts = Counter(keys_of(Generator(records=40_000, keys=1000, zipf=1.0, seed=5)))
    harmonic = sum(1 / r for r in range(1, 1001))
    (top, top_count), (second, second_count) = counts.most_common(2)
    assert (top, second) == ("k00000", "k00001")
    assert top_count / 40_000 == pytest.approx(1 / harmonic, rel=0.1)
    assert top_count / second_count == pytest.approx(2.0, rel=0.15)
    uniform = Counter(keys_of(Generator(records=40_000, keys=1000, seed=5)))
    assert uniform.most_common(1)[0][1] < 80  # about 40 each


def hottest(keys: list) -> str:
    return Counter(keys).most_common(1)[0][0]


@pytest.mark.parametrize(("rate", "omega"), [(1000.0, 6.0), (0.0, 600.0)])
def test_reshuffle_moves_the_hot_key_between_epochs(rate: float, omega: float) -> None:
    # Either way an epoch lasts 10_000 records: 10 s at 1000/s, or 0.1 s of the nominal
    # 100_000 records/s logical clock of an unthrottled generator.
    for reshuffles in (0.0, omega):
        gen = Generator(records=16_000, rate=rate, keys=1000, zipf=1.0, omega=reshuffles)
        ordered = keys_of(gen)
        assert Counter(keys_of(gen, parallelism=3)) == Counter(ordered)
        first, second = ordered[:5000], ordered[-5000:]  # epochs 0 and 1
        assert hottest(first) == "k00000"
        assert (hottest(second) == "k00000") is (reshuffles == 0)


def test_unbounded_generator_keeps_going() -> None:
    gen = Generator(keys=10, seed=1)
    assert not gen.bounded and Generator(records=5).bounded
    reader = gen.open(0, 1, START)
    for _ in range(5):
        values, stamps = reader.poll(START, 3000)
        assert len(values) == 3000 and stamps == [START] * 3000
    assert reader.next_due(START) == START


def due_by(gen: Generator, seconds: float, parallelism: int = 1) -> int:
    readers = [gen.open(i, parallelism, START) for i in range(parallelism)]
    return sum(len(r.poll(START + seconds, 10**7)[0]) for r in readers)


def test_schedule_steps_and_ramps() -> None:
    step = Generator(rate=1000, schedule=((1, 1000), (1, 3000)))
    assert due_by(step, 1.0) == 1000
    assert due_by(step, 2.0) == 4000
    assert due_by(step, 2.0, parallelism=4) in range(3996, 4001)
    ramp = Generator(rate=0, schedule=((2, 1000),))  # 0 -> 1000/s over 2 s, then steady
    assert due_by(ramp, 1.0) == 250
    assert due_by(ramp, 2.0) == 1000
    assert due_by(ramp, 3.0) == 2000
    pause = Generator(rate=500, schedule=((1, 500), (1, 0), (3, 0), (3, 500)))
    assert due_by(pause, 1.0) == due_by(pause, 2.9) == 500
    assert due_by(pause, 4.0) == 1000
    reader = pause.open(0, 1, START)
    reader.poll(START + 2.0, 10**6)
    assert reader.next_due(START + 2.0) == pytest.approx(START + 3.002)


def test_schedule_from_text() -> None:
    assert parse_schedule("30:1000, 30:4000,60:8e3") == (
        (30.0, 1000.0),
        (30.0, 4000.0),
        (60.0, 8000.0),
    )
    assert Generator(rate=1, schedule="1:2, 3:4").schedule == ((1.0, 2.0), (3.0, 4.0))
    assert Generator(schedule=[[1, 2]]).schedule == ((1.0, 2.0),)
    with pytest.raises(ValueError, match="'30-1000' is not time_s:rate"):
        parse_schedule("30-1000")


def test_subclass_hook_shapes_records() -> None:
    gen = Indexed(records=3000, keys=30, tag="y", seed=4)
    records = keys_of(gen)
    assert [r[0] for r in records] == list(range(3000))
    assert {r[2] for r in records} == {"y"}
    assert [r[1] for r in records] == keys_of(Generator(records=3000, keys=30, seed=4))
    with pytest.raises(ValueError, match=r"WrongLength.make_records returned 1023 records"):
        keys_of(WrongLength(records=2000))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"records": -1}, "records must be an int >= 0"),
        ({"records": 2.5}, "records must be an int"),
        ({"rate": -5}, "rate must be >= 0"),
        ({"rate": float("nan")}, "rate must be a finite number"),
        ({"keys": 0}, "keys must be an int >= 1"),
        ({"zipf": -1.0}, "zipf must be >= 0"),
        ({"omega": "often"}, "omega must be a finite number"),
        ({"seed": "abc"}, "seed must be an int"),
        ({"schedule": ((1, 10), (0.5, 10))}, "times must not decrease"),
        ({"schedule": ((1, 10, 3),)}, r"schedule\[0\] must be a \(time_s, rate\) pair"),
        ({"schedule": ((1, 10), (2, 0))}, "must end with a rate > 0"),
        ({"schedule": ((1, -10),)}, r"schedule\[0\] rate must be >= 0"),
    ],
)
def test_generator_rejects_bad_params(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Generator(**params)


def test_seek_to_any_global_index() -> None:
    gen = Indexed(records=3 * CHUNK, keys=5)
    full = keys_of(gen)
    for position in (0, 5, CHUNK, CHUNK + 9, 3 * CHUNK - 1, 3 * CHUNK, 10**6):
        reader = gen.open(0, 1, START)
        reader.seek(position)
        assert drain(reader)[0] == full[position:]
    reader = gen.open(1, 3, START)
    reader.seek(5)  # inside task 0's chunk: continue at the next chunk task 1 owns
    assert reader.position() == CHUNK
    with pytest.raises(ValueError, match="position must be an int >= 0"):
        reader.seek(-1)


@settings(max_examples=40, deadline=None)
@given(
    records=st.integers(0, 4 * CHUNK),
    parallelism=st.integers(1, 6),
    position=st.integers(0, 5 * CHUNK),
    batch=st.integers(1, 3000),
)
def test_any_parallelism_covers_each_index_once(
    records: int, parallelism: int, position: int, batch: int
) -> None:
    gen = Indexed(records=records, keys=7, seed=records)
    seen = []
    for i in range(parallelism):
        reader = gen.open(i, parallelism, START)
        reader.seek(position)
        seen += [r[0] for r in drain(reader, batch=batch)[0]]
    assert sorted(seen) == list(range(position, records))


@settings(max_examples=25, deadline=None)
@given(
    rate=st.floats(1.0, 1e6),
    parallelism=st.integers(1, 4),
    seconds=st.floats(0.0, 5.0),
)
def test_tasks_together_follow_the_rate(rate: float, parallelism: int, seconds: float) -> None:
    expected = min(int(rate * seconds), 20_000)
    gen = Generator(rate=rate, records=20_000)
    assert expected - parallelism <= due_by(gen, seconds, parallelism) <= expected + 1


# --- FileReplay ---------------------------------------------------------------------------


def test_jsonl_replays_in_order(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    path.write_text('{"a": 1}\n\n[1, "two", null]\n"text"\n  \n3.5\n')
    assert drain(FileReplay(str(path)).open(0, 1, START))[0] == [
        {"a": 1},
        [1, "two", None],
        "text",
        3.5,
    ]
    assert drain(FileReplay(str(path)).open(1, 2, START))[0] == [[1, "two", None], 3.5]


def test_csv_records_are_dicts_of_strings(tmp_path: Path) -> None:
    write_csv(tmp_path / "in.csv", 4)
    values = drain(FileReplay(str(tmp_path / "in.csv")).open(0, 1, START))[0]
    assert values == [
        {"i": "0", "name": "n0", "note": "with, comma"},
        {"i": "1", "name": "n1", "note": ""},
        {"i": "2", "name": "n2", "note": ""},
        {"i": "3", "name": "n3", "note": "with, comma"},
    ]
    (tmp_path / "data.txt").write_text("x\n1\n")
    assert drain(FileReplay(str(tmp_path / "data.txt"), format="csv").open(0, 1, START))[0] == [
        {"x": "1"}
    ]


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ok": 1}\n\n{"ok": 2}\n{"broken": \n')
    reader = FileReplay(str(path)).open(0, 1, START)
    with pytest.raises(ValueError, match=r"bad.jsonl, line 4: not valid JSON"):
        drain(reader)
    reader.close()
    # The task that owns the bad record reports it; the other one does not parse it.
    assert drain(FileReplay(str(path)).open(1, 2, START))[0] == [{"ok": 2}]


def test_bad_csv_row_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n3\n")
    reader = FileReplay(str(path)).open(0, 1, START)
    with pytest.raises(ValueError, match=r"bad.csv, line 3: 1 fields, the header has 2"):
        drain(reader)
    reader.close()
    path.write_text('a,b\n1,"unterminated\n')
    reader = FileReplay(str(path)).open(0, 1, START)
    with pytest.raises(ValueError, match=r"bad.csv, line \d"):
        drain(reader)
    reader.close()


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    missing = FileReplay(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"cannot open .*nope.jsonl"):
        missing.open(0, 1, START)
    with pytest.raises(ValueError, match="format must be 'jsonl' or 'csv'"):
        FileReplay(str(tmp_path / "data.parquet"))
    with pytest.raises(ValueError, match="rate must be >= 0"):
        FileReplay(str(tmp_path / "a.csv"), rate=-1)


def test_file_seek_by_record_number(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", 50)
    reader = FileReplay(str(tmp_path / "in.jsonl")).open(1, 3, START)
    reader.seek(20)  # the first record of task 1 at or after 20 is 22
    assert reader.position() == 22
    assert [v["i"] for v in drain(reader)[0]] == list(range(22, 50, 3))
    assert reader.position() == 52
