"""Sinks: Collect round trips through real part files; Null discards; errors name the file."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sinks import Collect, Null, read_parts


def first_item(record):
    return record[0]


def write_all(sink: Collect, batches_per_task: list[list[list]]) -> None:
    """Task ``i`` writes ``batches_per_task[i]``, then every task closes."""
    writers = [sink.open(i, len(batches_per_task)) for i in range(len(batches_per_task))]
    for writer, batches in zip(writers, batches_per_task, strict=True):
        for batch in batches:
            writer.write(batch)
    for writer in writers:
        writer.close()


def test_collect_all_round_trip(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path / "out"))
    write_all(
        sink,
        [
            [[("a", 1), ("b", 2)], [{"x": [1, 2.5, None]}]],
            [],
            [["naïve", True]],
        ],
    )
    # A task that wrote nothing leaves no file.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-0.jsonl", "part-2.jsonl"]
    assert read_parts(tmp_path / "out") == [
        ["a", 1],
        ["b", 2],
        {"x": [1, 2.5, None]},
        "naïve",
        True,
    ]


def test_collect_last_keeps_the_latest_record_per_key(tmp_path: Path) -> None:
    sink = Collect(tmp_path / "counts", mode="last", key=first_item)
    writer = sink.open(0, 1)
    writer.write([("the", 1), ("cat", 1), ("the", 2)])
    writer.write([("sat", 1), ("the", 3), ("cat", 2)])
    assert not (tmp_path / "counts" / "part-0.jsonl").exists()  # nothing before close
    writer.close()
    writer.close()  # a second close is harmless
    assert read_parts(tmp_path / "counts") == [["the", 3], ["cat", 2], ["sat", 1]]


def test_parts_are_read_in_index_order_and_reopening_appends(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path))
    for index in (10, 2, 0):
        writer = sink.open(index, 11)
        writer.write([index])
        writer.close()
    writer = sink.open(2, 11)  # e.g. the task after a rescale: earlier output survives
    writer.write(["again"])
    writer.close()
    (tmp_path / "notes.txt").write_text("not a part")
    assert read_parts(tmp_path) == [0, 2, "again", 10]


def test_collect_description_pickles(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path), mode="last", key=first_item)
    assert pickle.loads(pickle.dumps(sink)) == sink
    assert pickle.loads(pickle.dumps(Null())) == Null()


def test_null_discards() -> None:
    writer = Null().open(0, 1)
    writer.write([1, 2, object()])
    writer.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"mode": "first"}, "mode must be 'all' or 'last'"),
        ({"mode": "last"}, "key must be a callable"),
        ({"mode": "last", "key": "word"}, "key must be a callable"),
        ({"key": first_item}, "key is only used with mode='last'"),
    ],
)
def test_collect_rejects_bad_params(tmp_path: Path, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Collect(str(tmp_path), **params)
    with pytest.raises(ValueError, match="path must be a directory path"):
        Collect(None)  # type: ignore[arg-type]


def test_write_errors_name_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(OSError, match=r"cannot create the directory of .*blocker/part-3.jsonl"):
        Collect(str(blocker)).open(3, 4)
    (tmp_path / "out" / "part-0.jsonl").mkdir(parents=True)
    writer = Collect(str(tmp_path / "out")).open(0, 1)
    with pytest.raises(OSError, match=r"cannot open collect part .*out/part-0.jsonl"):
        writer.write([1])


def test_unencodable_record_names_the_file(tmp_path: Path) -> None:
    writer = Collect(str(tmp_path)).open(0, 1)
    with pytest.raises(TypeError, match=r"cannot write a record to .*part-0.jsonl as JSON"):
        writer.write([{1, 2}])
    writer.close()


def test_read_parts_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no collect directory"):
        read_parts(tmp_path / "missing")
    (tmp_path / "part-0.jsonl").write_text('[1]\n\n{"broken"\n')
    with pytest.raises(ValueError, match=r"part-0.jsonl, line 3: not valid JSON"):
        read_parts(tmp_path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=15, deadline=None)
@given(batches=st.lists(st.lists(json_values, max_size=5), max_size=4))
def test_any_json_records_round_trip(tmp_path_factory: pytest.TempPathFactory, batches) -> None:
    out = tmp_path_factory.mktemp("collect")
    write_all(Collect(str(out)), [batches])
    assert read_parts(out) == [value for batch in batches for value in batch]
