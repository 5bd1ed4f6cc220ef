"""Collect's two-phase commit, on real files: what a reader sees is committed, and after
any interleaving of checkpoints, lost commits, recoveries and tasks that move, every
record is there exactly once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.sinks import Collect, CollectWriter, read_parts


def first_item(record):
    return record[0]


def opened(sink: Collect, index: int, parallelism: int) -> CollectWriter:
    writer = sink.open(index, parallelism)
    writer.transactional()
    return writer


def test_records_are_visible_only_once_their_checkpoint_completes(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path))
    writer = opened(sink, 0, 1)
    writer.write(["a", "b"])
    assert read_parts(tmp_path) == []  # in progress
    state = writer.prepare(7)
    assert state == {"checkpoint": 7}
    writer.write(["c"])
    assert read_parts(tmp_path) == []  # pending: checkpoint 7 is not complete yet
    writer.commit(7)
    assert read_parts(tmp_path) == ["a", "b"]
    writer.commit(7)  # again: nothing changes
    writer.close()  # the end of the stream makes the rest visible
    assert read_parts(tmp_path) == ["a", "b", "c"]
    assert sorted(os.listdir(tmp_path / "_pending")) == []


def test_a_recovery_commits_what_its_checkpoint_prepared_and_takes_back_the_rest(
    tmp_path: Path,
) -> None:
    sink = Collect(str(tmp_path))
    writer = opened(sink, 0, 2)
    writer.write([1, 2])
    state = writer.prepare(3)
    writer.write([3])
    writer.prepare(5)  # checkpoint 5 never completes
    writer.write([4])
    writer.abort()  # the worker is lost before checkpoint 3's commit reached it
    assert read_parts(tmp_path) == []
    again = opened(sink, 0, 2)
    again.restore(state)
    assert read_parts(tmp_path) == [1, 2]  # checkpoint 3 is complete: committed now
    assert os.listdir(tmp_path / "_pending") == []  # 5's pending file and [4] are gone
    again.write([3, 4])  # the sources replay from checkpoint 3
    again.close()
    assert read_parts(tmp_path) == [1, 2, 3, 4]


def test_a_task_that_leaves_is_committed_by_the_next_checkpoint_of_another(
    tmp_path: Path,
) -> None:
    sink = Collect(str(tmp_path))
    leaving, staying = opened(sink, 1, 2), opened(sink, 0, 2)
    leaving.write(["x"])
    leaving.hand_over(10)  # a reconfiguration at barrier 10 removes it
    leaving.abort()
    assert read_parts(tmp_path) == []
    staying.write(["y"])
    staying.prepare(12)
    staying.commit(12)
    assert sorted(read_parts(tmp_path)) == ["x", "y"]


def test_last_mode_hands_its_latest_records_over_when_it_moves(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path), mode="last", key=first_item)
    leaving = opened(sink, 0, 1)
    leaving.write([("a", 1), ("a", 2)])
    leaving.hand_over(3)
    arrived = opened(sink, 0, 1)  # the task, on its new worker
    arrived.write([("b", 1)])
    arrived.prepare(4)
    arrived.commit(4)
    assert read_parts(tmp_path) == [["a", 2]]
    arrived.close()
    assert read_parts(tmp_path) == [["a", 2], ["b", 1]]


def test_last_mode_restores_its_latest_records(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path), mode="last", key=first_item)
    writer = opened(sink, 0, 1)
    writer.write([("a", 1), ("b", 1)])
    state = writer.prepare(2)
    writer.write([("a", 2)])
    writer.abort()
    again = opened(sink, 0, 1)
    again.restore(state)
    again.write([("b", 5)])
    again.close()
    assert read_parts(tmp_path) == [["a", 1], ["b", 5]]


def test_a_final_file_written_after_the_checkpoint_is_taken_back_by_a_recovery(
    tmp_path: Path,
) -> None:
    """A task whose input ended makes its last records visible; a recovery of the rest
    of the job to an earlier checkpoint takes them back, and its replay writes them."""
    sink = Collect(str(tmp_path))
    writer = opened(sink, 0, 1)
    writer.write(["a"])
    state = writer.prepare(4)
    writer.commit(4)
    writer.write(["b"])
    writer.close()
    assert read_parts(tmp_path) == ["a", "b"]
    again = opened(sink, 0, 1)
    again.restore(state)
    assert read_parts(tmp_path) == ["a"]
    again.write(["b"])
    again.close()
    assert read_parts(tmp_path) == ["a", "b"]


def test_without_checkpoints_records_are_visible_as_they_are_written(tmp_path: Path) -> None:
    writer = Collect(str(tmp_path)).open(0, 1)
    writer.write(["a"])
    writer._file.flush()  # what the buffer held: the file is the visible one
    assert read_parts(tmp_path) == ["a"]
    assert writer.prepare(1) is None
    writer.close()


def test_a_commit_that_cannot_rename_names_the_file(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path))
    writer = opened(sink, 0, 1)
    writer.write(["a"])
    writer.prepare(1)
    (tmp_path / "part-0-000000000001.jsonl").mkdir()  # in the way of the rename
    with pytest.raises(OSError, match=r"cannot commit collect part .*part-0-000000000001"):
        writer.commit(1)


# -- any interleaving ------------------------------------------------------------------


@dataclass
class Run:
    """A sink of ``parallelism`` writers fed, per index, the records 0, 1, 2... in order,
    as a job whose sources replay from a checkpoint's positions would."""

    sink: Collect
    parallelism: int
    writers: list[CollectWriter] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # per index: records written so far
    checkpoints: dict[int, tuple[list[int], list]] = field(default_factory=dict)
    completed: int | None = None
    barrier: int = 0

    def start(self, states: list | None = None) -> None:
        self.writers = [opened(self.sink, i, self.parallelism) for i in range(self.parallelism)]
        if states is not None:
            for writer, state in zip(self.writers, states, strict=True):
                writer.restore(state)

    def write(self, index: int, n: int) -> None:
        first = self.sent[index]
        self.writers[index].write([[index, k] for k in range(first, first + n)])
        self.sent[index] += n

    def checkpoint(self, complete: bool, commit_to: set[int]) -> None:
        self.barrier += 1
        states = [w.prepare(self.barrier) for w in self.writers]
        self.checkpoints[self.barrier] = (list(self.sent), states)
        if complete:
            self.completed = self.barrier
            for i in commit_to:  # some commits may be lost
                self.writers[i].commit(self.barrier)

    def move(self, index: int) -> None:
        """A reconfiguration moves task ``index`` to another worker at its barrier."""
        self.barrier += 1
        self.writers[index].hand_over(self.barrier)
        self.writers[index].abort()
        self.writers[index] = opened(self.sink, index, self.parallelism)

    def fail(self) -> None:
        """A failure, and a recovery from the last complete checkpoint (a job without
        one does not recover: it fails)."""
        if self.completed is None:
            return
        for w in self.writers:
            w.abort()
        sent, states = self.checkpoints[self.completed]
        self.sent = list(sent)
        self.start(states)

    def visible(self) -> dict[int, list[int]]:
        seen: dict[int, list[int]] = {}
        for index, k in read_parts(self.sink.path):
            seen.setdefault(index, []).append(k)
        return seen


steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("checkpoint"), st.booleans(), st.sets(st.integers(0, 2))),
        st.tuples(st.just("move"), st.integers(0, 2)),
        st.tuples(st.just("fail")),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=steps)
def test_any_interleaving_is_read_committed_and_exactly_once(
    tmp_path_factory: pytest.TempPathFactory, steps
) -> None:
    run = Run(Collect(str(tmp_path_factory.mktemp("out"))), parallelism=3)
    run.sent = [0, 0, 0]
    run.start()
    for step in steps:
        match step:
            case ("write", index, n):
                run.write(index, n)
            case ("checkpoint", complete, commit_to):
                run.checkpoint(complete, commit_to)
            case ("move", index):
                run.move(index)
            case ("fail",):
                run.fail()
        # Read-committed: each index shows a prefix of its records, never past the
        # last completed checkpoint's cut.
        cut = [0, 0, 0] if run.completed is None else run.checkpoints[run.completed][0]
        for index, seen in run.visible().items():
            assert seen == list(range(len(seen)))
            assert len(seen) <= cut[index]
    for w in run.writers:
        w.close()
    final = run.visible()
    assert {i: final.get(i, []) for i in range(3)} == {
        i: list(range(run.sent[i])) for i in range(3)
    }
