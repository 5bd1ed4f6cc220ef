"""The exactly-once Kafka sink's transactions against a real broker (``tansu`` on
loopback, tests/kafka_broker.py), one writer at a time, driven as the runtime drives it.

Records are produced into the open transaction as they arrive; the two producers of a
task take turns (one transaction open, one prepared); a recovery produces again an epoch
whose prepared transaction was lost and not one that was committed (the marker); a
commit that comes late makes the next records wait in memory; a moved task's successor
commits what it held; a job run again from scratch is not taken for its earlier run.
What a reader sees is what a read-committed consumer of a real Kafka broker would see
(:meth:`kafka_broker.Broker.consume_all`: tansu's own consumers show aborted records).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import pytest
from kafka_broker import Batch, Broker, aborted_records, running_tansu

from connectors.kafka import KafkaSink, KafkaSinkWriter
from tests.api_support import wait_until

WAIT_S = 30.0  # records produced reach the broker's log well within this

_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_tansu() as b:
        yield b


@pytest.fixture
def topic(broker: Broker) -> str:
    name = f"txn{next(_names)}-{time.monotonic_ns()}"
    broker.create_topic(name)
    return name


def visible(broker: Broker, topic: str) -> list:
    """What a read-committed consumer sees in ``topic`` now (JSON values)."""
    return [json.loads(m.value()) for m in broker.consume_all(topic, 1)]


def data_batches(broker: Broker, topic: str) -> list[Batch]:
    return [b for b in broker.partition_log(topic, 0) if not b.control]


def aborted(broker: Broker, topic: str) -> list:
    """The values of ``topic``'s records in aborted transactions (JSON values)."""
    return [json.loads(v) for _, _, v in aborted_records(broker.partition_log(topic, 0))]


def writer(broker: Broker, topic: str) -> KafkaSinkWriter:
    w = KafkaSink(broker.bootstrap, topic, transactional_id=topic).open(0, 1)
    w.transactional()
    return w


def test_records_go_into_the_open_transaction_as_they_arrive(broker: Broker, topic: str) -> None:
    w = writer(broker, topic)
    try:
        w.write(["a", "b"])
        produced = wait_until(
            lambda: [r for b in data_batches(broker, topic) for r in b.records],
            WAIT_S,
            "the records in the broker's log before the barrier",
        )
        assert [json.loads(v) for _, _, v in produced] == ["a", "b"]
        assert all(b.transactional for b in data_batches(broker, topic))
        w.prepare(1)
        assert visible(broker, topic) == [], "prepared records are visible before the commit"
        w.commit(1)
        assert visible(broker, topic) == ["a", "b"]
    finally:
        w.abort()


def test_the_two_producers_of_a_task_take_turns(broker: Broker, topic: str) -> None:
    """Epoch 2 is written while epoch 1 is prepared, by the other producer; epoch 3 by
    the first again."""
    w = writer(broker, topic)
    try:
        for checkpoint, value in enumerate(["one", "two", "three"], start=1):
            w.write([value])
            w.prepare(checkpoint)
            w.commit(checkpoint - 1)
        w.commit(3)
        producers = [b.producer_id for b in data_batches(broker, topic)]
        assert len(producers) == 3 and producers[0] == producers[2] != producers[1]
        assert visible(broker, topic) == ["one", "two", "three"]
        assert len(set(w.transactional_ids())) == 2
    finally:
        w.abort()


def test_a_recovery_produces_again_an_epoch_whose_transaction_was_lost(
    broker: Broker, topic: str
) -> None:
    """Checkpoint 2 completed but its commit was lost with the writer (left as a killed
    process leaves it: nothing aborted, its transactions open): the restore's producers
    fence the old ones, aborting them, and checkpoint 2's records are produced again."""
    old = writer(broker, topic)
    old.write(["a"])
    old.prepare(1)
    old.commit(1)
    old.write(["b"])
    state = old.prepare(2)
    old.write(["c"])  # after checkpoint 2: taken back
    new = writer(broker, topic)
    try:
        new.restore(state)
        assert visible(broker, topic) == ["a", "b"]
        assert sorted(aborted(broker, topic)) == ["b", "c"]
        new.write(["c"])  # the replay
        new.close()
        assert visible(broker, topic) == ["a", "b", "c"]
    finally:
        old.abort()  # fenced: its producers only go


def test_a_recovery_does_not_produce_again_an_epoch_that_was_committed(
    broker: Broker, topic: str
) -> None:
    """The commit of checkpoint 2 went through, then the writer died before noting it:
    the restore of checkpoint 2 finds its marker and produces nothing again."""
    old = writer(broker, topic)
    old.write(["a"])
    state = old.prepare(1)
    old.write(["b"])
    state = old.prepare(2)
    old.commit(2)
    new = writer(broker, topic)
    try:
        new.restore(state)
        new.close()
        assert visible(broker, topic) == ["a", "b"]
        assert aborted(broker, topic) == []
    finally:
        old.abort()


def test_while_both_producers_hold_transactions_the_next_records_wait(
    broker: Broker, topic: str
) -> None:
    """Checkpoint 1's commit does not come before checkpoint 2's barrier (checkpoint 1
    abandoned, or its commit late): the records after barrier 2 wait in memory, and go
    into a transaction once checkpoint 2's commit has freed both producers."""
    w = writer(broker, topic)
    try:
        w.write(["a"])
        w.prepare(1)
        w.write(["b"])
        w.prepare(2)
        w.write(["c"])
        produced = [json.loads(v) for b in data_batches(broker, topic) for _, _, v in b.records]
        assert produced == ["a", "b"]
        w.commit(2)
        assert visible(broker, topic) == ["a", "b"]
        wait_until(
            lambda: len(data_batches(broker, topic)) == 3, WAIT_S, "c produced after the commit"
        )
        w.prepare(3)
        w.commit(3)
        assert visible(broker, topic) == ["a", "b", "c"]
    finally:
        w.abort()


def test_a_moved_task_is_committed_once_by_its_successor(broker: Broker, topic: str) -> None:
    """A reconfiguration moves the task at barrier 2: the leaving writer aborts its
    transactions and hands its epochs over; the new one (same task index, so the same
    transactional ids) commits them with its own, each once."""
    old = writer(broker, topic)
    old.write(["a"])
    old.prepare(1)
    old.write(["b"])
    state = old.hand_over(2, moving=True)
    new = writer(broker, topic)
    try:
        new.adopt(state)
        new.write(["c"])
        new.prepare(3)
        assert visible(broker, topic) == []
        new.commit(3)
        assert visible(broker, topic) == ["a", "b", "c"]
    finally:
        new.abort()


def test_a_job_run_again_from_scratch_is_not_taken_for_its_earlier_run(
    broker: Broker, topic: str
) -> None:
    """The same transactional ids, checkpoint ids from 1 again: the new run's first
    checkpoint, restored before its commit, is produced (its marker is the run's own)."""
    first = writer(broker, topic)
    first.write(["earlier"])
    first.prepare(1)
    first.commit(1)
    first.close()
    second = writer(broker, topic)
    second.write(["again"])
    state = second.prepare(1)
    third = writer(broker, topic)
    try:
        third.restore(state)
        third.close()
        assert visible(broker, topic) == ["earlier", "again"]
    finally:
        second.abort()
