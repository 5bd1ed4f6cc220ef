"""The Kafka connector against a real broker: ``tansu`` on loopback (tests/kafka_broker.py).

The contract suites (source; two-phase sink), the at-least-once sink, deserializers,
records with key, headers and timestamp, errors that name what to fix (an unreachable
address, an undecodable record's topic, partition and offset), dead letters, group
offsets, a broker killed and restarted under a reader, and a word count job reading a
topic through the runtime, with checkpoints, into ``Collect`` and back into Kafka.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_broker import Broker, free_port, running_tansu

from connectors.kafka import (
    BrokerUnreachableError,
    KafkaConnectorError,
    KafkaRecord,
    KafkaSink,
    KafkaSource,
    UndecodableRecordError,
)
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.partitioned import PartitionSetReader
from runtime.sinks import Collect, read_parts
from tests.api_support import wait_until
from tests.connector_contract import FAR, check_partitioned_source, check_two_phase_sink
from tests.faults_support import fault_cluster
from tests.jobs_for_tests import count, identity, split_words

WAIT_S = 30.0  # data produced and acknowledged reaches a consumer well within this
JOB_WAIT_S = 120.0
PAUSE_S = 0.005  # between two polls of a reader waiting for librdkafka's fetches

_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_tansu() as b:
        yield b


def new_topic(broker: Broker, partitions: int = 1) -> str:
    topic = f"t{next(_names)}-{time.monotonic_ns()}"
    broker.create_topic(topic, partitions)
    return topic


def until_data(reader: Any, most: int = 512) -> Any:
    """A reader's next non-empty batch (``most`` records at most), or None at its end;
    raises after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while (polled := reader.poll(FAR, most)) is not None and not polled[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no record from {reader!r} within {WAIT_S:.0f}s")
        time.sleep(PAUSE_S)  # librdkafka fetches in the background; look again
    return polled


def read_all(reader: Any) -> list:
    out: list = []
    while (polled := until_data(reader)) is not None:
        out += polled[0]
    return out


# -- the source -----------------------------------------------------------------------------


def test_the_source_keeps_the_partitioned_source_contract(broker: Broker) -> None:
    topic = new_topic(broker, 3)
    expected = {f"{topic}-{p}": [f"p{p}-r{i}" for i in range(120 + 7 * p)] for p in range(3)}
    broker.produce(topic, [(p, v) for p in range(3) for v in expected[f"{topic}-{p}"]])
    source = KafkaSource(broker.bootstrap, topic, stop_at="end")
    # One record a poll: the suite stops its readers after exactly k records.
    check_partitioned_source(source, expected, poll=lambda reader: until_data(reader, 1))


def test_a_task_share_of_partitions_reads_each_record_once(broker: Broker) -> None:
    topic = new_topic(broker, 3)
    broker.produce(topic, [(i % 3, f"r{i}") for i in range(300)])
    source = KafkaSource(broker.bootstrap, topic, stop_at="end")
    got = []
    names = source.partitions()
    for index in range(2):  # as the runtime splits them: partition j to task j mod 2
        reader = PartitionSetReader(source, names[index::2], 0.0)
        try:
            got += read_all(reader)
        finally:
            reader.close()
    assert sorted(got) == sorted(f"r{i}" for i in range(300))


@pytest.mark.parametrize(
    ("deserializer", "raw", "value"),
    [
        ("bytes", b"\x00\xff", b"\x00\xff"),
        ("utf-8", "naïve 日本".encode(), "naïve 日本"),
        ("json", b'{"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}),
    ],
)
def test_deserializers(broker: Broker, deserializer: str, raw: bytes, value: Any) -> None:
    topic = new_topic(broker)
    broker.produce(topic, [(0, raw)])
    source = KafkaSource(broker.bootstrap, topic, deserializer=deserializer, stop_at=1)
    reader = source.open_partition(f"{topic}-0", 0.0)
    try:
        assert read_all(reader) == [value]
    finally:
        reader.close()


def test_records_expose_key_headers_timestamp_partition_and_offset(broker: Broker) -> None:
    topic = new_topic(broker, 2)
    broker.produce(
        topic, [(1, b"v0", b"k0"), (1, b"v1")], headers=[("trace", b"x1")], timestamp_ms=1_700_000
    )
    source = KafkaSource(broker.bootstrap, topic, records="record", stop_at="end")
    reader = source.open_partition(f"{topic}-1", 0.0)
    try:
        got = read_all(reader)
    finally:
        reader.close()
    headers = (("trace", b"x1"),)
    assert got == [
        KafkaRecord(topic, 1, 0, b"k0", "v0", headers, 1_700_000),
        KafkaRecord(topic, 1, 1, None, "v1", headers, 1_700_000),
    ]


def test_start_latest_skips_what_was_there_and_its_first_position_is_the_end(
    broker: Broker,
) -> None:
    topic = new_topic(broker)
    broker.produce(topic, [(0, "old0")])
    broker.produce(topic, [(0, "old1")])  # apart: tansu's end offset counts a batch as one
    source = KafkaSource(broker.bootstrap, topic, start="latest", stop_at=3)
    reader = source.open_partition(f"{topic}-0", 0.0)
    try:
        assert reader.position() == 2
        broker.produce(topic, [(0, "new")])
        assert read_all(reader) == ["new"]
    finally:
        reader.close()


def test_an_unreachable_broker_is_named_in_the_error() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    source = KafkaSource(address, "orders")
    with pytest.raises(BrokerUnreachableError, match=rf"Kafka brokers at {address} within"):
        source.partitions()


def test_a_missing_topic_is_named(broker: Broker) -> None:
    with pytest.raises(KafkaConnectorError, match=r"topic 'no-such-topic' .* create it first"):
        KafkaSource(broker.bootstrap, ["no-such-topic"]).partitions()


def test_invalid_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"KafkaSource.deserializer must be one of"):
        KafkaSource("h:1", "t", deserializer="avro")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"KafkaSource.stop_at must be"):
        KafkaSource("h:1", "t", stop_at=-1)
    with pytest.raises(ValueError, match=r"KafkaSink.serializer must be one of"):
        KafkaSink("h:1", "t", serializer="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"has no partition 'u-0'"):
        KafkaSource("h:1", "t").open_partition("u-0", 0.0)


def test_a_record_that_cannot_be_decoded_names_topic_partition_and_offset(
    broker: Broker,
) -> None:
    topic = new_topic(broker, 2)
    broker.produce(topic, [(1, b'{"ok": 1}'), (1, b"{not json")])
    reader = KafkaSource(broker.bootstrap, topic, deserializer="json").open_partition(
        f"{topic}-1", 0.0
    )
    try:
        assert until_data(reader)[0] == [{"ok": 1}]
        with pytest.raises(
            UndecodableRecordError, match=rf"topic '{topic}' partition 1 offset 1 as json"
        ):
            until_data(reader)
    finally:
        reader.close()


def test_undecodable_records_go_to_the_dead_letter_topic(broker: Broker) -> None:
    topic, dead = new_topic(broker), new_topic(broker)
    broker.produce(topic, [(0, b"1"), (0, b"\xfe", b"key"), (0, b"2")])
    source = KafkaSource(
        broker.bootstrap, topic, deserializer="json", stop_at=3, dead_letter_topic=dead
    )
    reader = source.open_partition(f"{topic}-0", 0.0)
    try:
        assert read_all(reader) == [1, 2]
        assert reader.position() == 3  # dead letters acknowledged first
    finally:
        reader.close()
    (letter,) = broker.consume(dead, 1, 1)
    assert (letter.key(), letter.value()) == (b"key", b"\xfe")
    assert dict(letter.headers())["streampilot-error"].startswith(
        f"topic '{topic}' partition 0 offset 1".encode()
    )


def test_checkpointed_offsets_are_committed_to_the_group_for_lag_tooling(broker: Broker) -> None:
    topic = new_topic(broker, 2)
    broker.produce(topic, [(0, f"r{i}") for i in range(8)])
    source = KafkaSource(
        broker.bootstrap, topic, group_id="lag-tooling", deserializer="utf-8", stop_at=5
    )
    reader = source.open_partition(f"{topic}-0", 0.0)
    try:
        assert read_all(reader) == [f"r{i}" for i in range(5)]
        reader.committed(reader.position())  # the checkpoint that recorded it completed
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lag-tooling"})
        try:
            (committed,) = wait_until(
                lambda: [
                    o
                    for o in consumer.committed([TopicPartition(topic, 0)], WAIT_S)
                    if o.offset == 5
                ],
                WAIT_S,
                "the group's committed offset",
            )
        finally:
            consumer.close()
        assert committed.offset == 5
    finally:
        reader.close()


class _Seen(logging.Handler):
    """Notes the librdkafka log lines forwarded to the connector's logger."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_reader_rides_out_a_broker_restart() -> None:
    """Killed, the broker leaves the reader returning empty batches (no error); back (a
    memory broker loses its topics: the test makes the same records again), the reader
    resumes at its position."""
    port = free_port()
    records = [(0, f"r{i}") for i in range(15)]
    seen = _Seen()
    logging.getLogger("connectors.kafka").addHandler(seen)
    try:
        with running_tansu(port) as b:
            b.create_topic("restarted")
            b.produce("restarted", records[:10])
            reader = KafkaSource(b.bootstrap, "restarted").open_partition("restarted-0", 0.0)
            got = []
            while len(got) < 10:
                got += until_data(reader)[0]
            assert got == [v for _, v in records[:10]]
        try:  # the broker is gone now
            deadline = time.monotonic() + WAIT_S
            while not any("Connection refused" in line for line in seen.lines):
                assert reader.poll(FAR, 100) == ([], []), "a record from a dead broker"
                assert time.monotonic() < deadline, "the client never saw the broker go"
                time.sleep(PAUSE_S)
            assert reader.position() == 10
            with running_tansu(port) as b:
                b.create_topic("restarted")
                b.produce("restarted", records)
                assert until_data(reader)[0] == [v for _, v in records[10:]]
        finally:
            reader.close()
    finally:
        logging.getLogger("connectors.kafka").removeHandler(seen)


# -- the sink -------------------------------------------------------------------------------


def read_committed(broker: Broker, topic: str, partitions: int = 1) -> list:
    """What a read-committed consumer sees in ``topic`` now (JSON values)."""
    return [json.loads(m.value()) for m in broker.consume_all(topic, partitions)]


def test_the_transactional_sink_keeps_the_two_phase_contract(broker: Broker) -> None:
    topic = new_topic(broker, 2)
    sink = KafkaSink(broker.bootstrap, topic, transactional_id=topic)
    assert sink.exactly_once
    check_two_phase_sink(lambda: sink.open(0, 1), lambda: read_committed(broker, topic, 2))


def test_without_transactions_the_sink_is_at_least_once(broker: Broker) -> None:
    """Prepared records are acknowledged; after a recovery the replay is written again."""
    topic = new_topic(broker)
    sink = KafkaSink(broker.bootstrap, topic, transactions=False)
    assert not sink.exactly_once
    w = sink.open(0, 1)
    w.transactional()
    w.write(["a", "b"])
    assert w.prepare(1) is None
    assert read_committed(broker, topic) == ["a", "b"]
    w.write(["c"])
    w.abort()
    r = sink.open(0, 1)
    r.transactional()
    r.restore(None)
    r.write(["c", "d"])  # the replay after checkpoint 1
    r.close()
    got = read_committed(broker, topic)
    assert got[:2] == ["a", "b"] and set(got) == {"a", "b", "c", "d"}


def test_keys_and_serializers(broker: Broker) -> None:
    topic = new_topic(broker, 3)
    sink = KafkaSink(broker.bootstrap, topic, serializer="utf-8", key=first_letter)
    w = sink.open(0, 1)
    w.write(["apple", "avocado", "banana"])
    w.close()
    got = broker.consume_all(topic, 3)
    assert sorted((m.key(), m.value()) for m in got) == [
        (b"a", b"apple"), (b"a", b"avocado"), (b"b", b"banana"),
    ]  # fmt: skip
    by_key = {m.key(): m.partition() for m in got}
    assert all(m.partition() == by_key[m.key()] for m in got)  # one key, one partition


def first_letter(word: str) -> str:
    return word[0]


# -- through the runtime --------------------------------------------------------------------

LINES = [f"w{i % 7} w{i % 13} w{i % 5}" for i in range(3_000)]


@pytest.fixture(scope="module")
def checkpointing_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    yield from fault_cluster(tmp_path_factory, workers=2)


def word_count(source: KafkaSource, out: Path, sink: KafkaSink) -> Any:
    flow = Dataflow("kafka_word_count")
    lines = flow.source("lines", source, parallelism=2)
    words = lines.flat_map("split", split_words, parallelism=2)
    counts = words.key_by(identity).process("count", count, parallelism=2)
    counts.sink("out", Collect(str(out)), parallelism=2)
    counts.sink("kafka", sink, parallelism=2)
    return flow.compile()


def reference(lines: list[str]) -> list[tuple[str, int]]:
    seen = Counter(w for line in lines for w in split_words(line))
    return sorted((w, n) for w, c in seen.items() for n in range(1, c + 1))


def test_a_job_counts_words_from_a_topic_into_collect_and_back_into_kafka(
    broker: Broker, checkpointing_cluster: BackgroundCluster, tmp_path: Path
) -> None:
    topic, counts_topic = new_topic(broker, 3), new_topic(broker, 2)
    broker.produce(topic, [(i % 3, line) for i, line in enumerate(LINES)])
    source = KafkaSource(broker.bootstrap, topic, stop_at="end")
    sink = KafkaSink(broker.bootstrap, counts_topic, transactional_id=counts_topic)
    graph = word_count(source, tmp_path / "out", sink)
    c = checkpointing_cluster
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    job = c.call(c.coordinator.submit(graph, checkpoints=policy))
    try:
        assert c.wait(job, JOB_WAIT_S) == JobStatus.FINISHED, job.error
    finally:
        if not job.done:
            c.call(c.coordinator.stop_job(job.id))
    want = reference(LINES)
    assert sorted((w, n) for w, n in read_parts(tmp_path / "out")) == want
    produced = broker.consume_all(counts_topic, 2)
    assert sorted(tuple(json.loads(m.value())) for m in produced) == want
