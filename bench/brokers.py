"""The broker side of bench/connectors.py: a tansu broker, JetStream streams, the word
count's sentences written to them ahead of a run, and a paced load written while one runs.

The tansu broker is the tests' (:func:`tests.kafka_broker.running_tansu`, imported, not
copied): memory storage on a free loopback port, killed and reaped on exit. JetStream is
the machine's server (:data:`NATS_URL`); every stream made here has a name of its own and
is deleted by the benchmark.

:func:`paced_load` runs in a process of its own (so that its CPU is not the coordinator's
thread's): it writes sentences at a fixed rate, each prefixed with the time it was
written (``"<time.time()> <sentence>"``), which :class:`ProducedAt`
turns back into the record's timestamp: the sinks' latency then runs from the producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import nats
import psutil
from confluent_kafka import Producer
from nats.js.api import StorageType

from examples.wordcount import Params, source_of
from runtime.io import PartitionedSource, SourceReader
from tests.kafka_broker import Broker, running_tansu

__all__ = [
    "NATS_URL",
    "Broker",
    "ProducedAt",
    "delete_streams",
    "fill_subjects",
    "fill_topic",
    "new_stream",
    "paced_load",
    "running_tansu",
    "sentences",
    "take_apart",
    "take_apart_jetstream",
]

NATS_URL = "nats://127.0.0.1:4222"
FLUSH_TIMEOUT_S = 60.0  # a topic's pre-produced records all acknowledged by then
REQUEST_TIMEOUT_S = 10.0  # a JetStream API request (a loaded machine gets slack)
TICK_S = 0.002  # the paced load writes what is due every 2 ms
LINGER_MS = 5  # librdkafka's default linger: what a producer of a user's would add


def sentences(n: int) -> list[str]:
    """The first ``n`` sentences of the generator pipeline's stream (Zipf 1.0 over
    10,000 words, 8 words each): the brokers carry the same words as the generator."""
    reader = source_of(Params(records=n)).open(0, 1, 0.0)
    out: list[str] = []
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        out += polled[0]
    return out


def _produce(producer: Producer, topic: str, value: str, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, value, partition=partition)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)


def fill_topic(bootstrap: str, topic: str, partitions: int, lines: list[str]) -> None:
    """Produce ``lines`` to ``topic``, round robin over its ``partitions``, and wait
    until every one is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i, line in enumerate(lines):
        _produce(producer, topic, line, i % partitions)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left:
        raise RuntimeError(f"{left} records to {topic} unacknowledged after {FLUSH_TIMEOUT_S}s")


async def _connect() -> Any:
    return await nats.connect(NATS_URL, connect_timeout=5)


def new_stream(prefix: str) -> str:
    """A memory stream capturing ``<name>.>``; its name."""
    name = f"{prefix}{secrets.token_hex(4).upper()}"

    async def make() -> None:
        nc = await _connect()
        try:
            js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
            await js.add_stream(name=name, subjects=[f"{name}.>"], storage=StorageType.MEMORY)
        finally:
            await nc.close()

    asyncio.run(make())
    return name


def delete_streams(*names: str) -> None:
    """Delete the streams ``names`` (those that exist)."""

    async def delete() -> None:
        nc = await _connect()
        try:
            js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
            for name in names:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)
        finally:
            await nc.close()

    asyncio.run(delete())


def fill_subjects(stream: str, subjects: list[str], lines: list[str]) -> None:
    """Publish ``lines`` round robin over ``subjects`` of ``stream`` and wait until the
    stream holds them all."""

    async def fill() -> None:
        nc = await _connect()
        try:
            for i, line in enumerate(lines):
                await nc.publish(subjects[i % len(subjects)], line.encode())
                if i % 5000 == 4999:
                    await nc.flush(REQUEST_TIMEOUT_S)
            await nc.flush(REQUEST_TIMEOUT_S)
            js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
            deadline = time.monotonic() + FLUSH_TIMEOUT_S
            while (held := (await js.stream_info(stream)).state.messages) < len(lines):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"stream {stream} holds {held} of {len(lines)} sentences")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(fill())


def _due(rate: float, seconds: float) -> Iterator[tuple[float, int]]:
    """Every TICK_S for ``seconds``: (now, how many records are due by now at ``rate``)."""
    start = time.time()
    sent = 0
    while (now := time.time()) < start + seconds:
        due = int(rate * (now - start))
        yield now, due - sent
        sent = due
        time.sleep(max(0.0, TICK_S - (time.time() - now)))


def paced_load(
    kind: Literal["kafka", "nats"],
    address: str,
    targets: list[Any],
    rate: float,
    seconds: float,
    lines: list[str],
) -> None:
    """Write ``rate`` sentences per second of ``lines`` (over and over) for ``seconds``,
    round robin over ``targets`` (kafka: ``(topic, partition)`` pairs at bootstrap
    ``address``; nats: subjects), each stamped with the time it was written (module
    docstring). Runs in a process of its own."""
    if kind == "kafka":
        producer = Producer({"bootstrap.servers": address, "linger.ms": LINGER_MS})
        i = 0
        for now, n in _due(rate, seconds):
            for _ in range(n):
                topic, partition = targets[i % len(targets)]
                _produce(producer, topic, f"{now:.6f} {lines[i % len(lines)]}", partition)
                i += 1
            producer.poll(0)
        producer.flush(FLUSH_TIMEOUT_S)
        return

    async def publish() -> None:
        nc = await nats.connect(address, connect_timeout=5)
        try:
            i = 0
            for now, n in _due(rate, seconds):
                for _ in range(n):
                    line = f"{now:.6f} {lines[i % len(lines)]}"
                    await nc.publish(targets[i % len(targets)], line.encode())
                    i += 1
                await nc.flush(REQUEST_TIMEOUT_S)
        finally:
            await nc.close()

    asyncio.run(publish())


@dataclass(frozen=True)
class ProducedAt(PartitionedSource):
    """``inner``, whose records are ``"<time written> <sentence>"``: each comes out as the
    sentence, timestamped with the time written (so latency counts from the producer)."""

    inner: PartitionedSource

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.inner.bounded

    def partitions(self) -> list[str]:
        return self.inner.partitions()

    def open_partition(self, partition: str, start_time: float) -> SourceReader:
        return _Stamped(self.inner.open_partition(partition, start_time))


class _Stamped(SourceReader):
    def __init__(self, inner: SourceReader) -> None:
        self._inner = inner

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        polled = self._inner.poll(now, max_records)
        if polled is None:
            return None
        values, stamps = [], []
        for line in polled[0]:
            written, _, sentence = line.partition(" ")
            values.append(sentence)
            stamps.append(float(written))
        return values, stamps

    def next_due(self, now: float) -> float:
        return self._inner.next_due(now)

    def position(self) -> Any:
        return self._inner.position()

    def seek(self, position: Any) -> None:
        self._inner.seek(position)

    def close(self) -> None:
        self._inner.close()


# -- the Kafka path taken apart -------------------------------------------------------------


class Costs:
    """Per-record costs of pieces of work, each run once: wall time, this process's CPU
    (Python's and the client library's threads') and the broker process's CPU."""

    def __init__(self, broker_pid: int | None) -> None:
        self._broker = psutil.Process(broker_pid) if broker_pid else None
        self.figures: dict[str, dict[str, float]] = {}

    def _broker_cpu(self) -> float:
        if self._broker is None:
            return 0.0
        t = self._broker.cpu_times()
        return t.user + t.system

    def measure(self, name: str, n: int, work: Any) -> Any:
        """Run ``work()`` (``n`` records' worth); its result."""
        broker, ours, wall = self._broker_cpu(), time.process_time(), time.perf_counter()
        result = work()
        self.figures[name] = {
            "records": n,
            "us_per_record": round((time.perf_counter() - wall) / n * 1e6, 3),
            "client_cpu_us_per_record": round((time.process_time() - ours) / n * 1e6, 3),
            "broker_cpu_us_per_record": round((self._broker_cpu() - broker) / n * 1e6, 3),
        }
        return result


def read_to_end(source: PartitionedSource) -> int:
    """Read every partition of a bounded ``source`` in one reader, as a task would; how
    many records there were."""
    from runtime.partitioned import PartitionSetReader

    reader, got = PartitionSetReader(source, source.partitions(), 0.0), 0
    while (polled := reader.poll(time.time(), 512)) is not None:
        got += len(polled[0])
        if not polled[0]:
            time.sleep(0.001)  # the client fetches in the background: look again soon
    reader.close()
    return got


def count_records(n: int) -> list[tuple[str, int]]:
    """``n`` records as the count emits them: (word, its running count)."""
    return [(f"w{i % 10_000}", i // 10_000 + 1) for i in range(n)]


def take_apart(broker: Broker, topic: str, partitions: int, records: int) -> dict[str, Any]:
    """The Kafka path's costs in this one process, with nothing else of the benchmark
    running (:class:`Costs`): librdkafka consuming ``topic`` (all ``partitions``,
    fetches from the broker included), decoding the values,
    :class:`~connectors.kafka.KafkaPartitionReader` doing both, then for ``records``
    count records: JSON encoding, producing them acknowledged (idempotent), and
    :class:`~connectors.kafka.KafkaSinkWriter` committing them in one transaction."""
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka import KafkaSink, KafkaSource
    from connectors.kafka.sink import _encode

    costs = Costs(broker.process.pid)
    measure = costs.measure

    def consume() -> list:
        settings = {"group.id": "bench", "enable.auto.commit": False, "enable.partition.eof": True}
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, **settings})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got, ended = [], set()
        while len(ended) < partitions:
            for msg in consumer.consume(100_000, 0.1):
                if msg.error() is None:
                    got.append(msg)
                else:
                    ended.add(msg.partition())
        consumer.close()
        return got

    n = len(consume())  # a first read: the broker's caches and ours warm
    messages = measure("consume (librdkafka, broker fetches)", n, consume)
    measure("decode UTF-8", n, lambda: [m.value().decode() for m in messages])
    messages.clear()

    source = KafkaSource(broker.bootstrap, topic, stop_at="end")
    measure("KafkaPartitionReader.poll (both)", n, lambda: read_to_end(source))

    counts = count_records(records)
    encoded = measure("encode JSON", records, lambda: [_encode(v, "json") for v in counts])
    broker.create_topic(f"{topic}-apart", partitions)

    def produce() -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        for value in encoded:
            while True:
                try:
                    producer.produce(f"{topic}-apart", value)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(FLUSH_TIMEOUT_S)

    measure("produce, acknowledged", records, produce)

    def commit() -> None:
        writer = KafkaSink(broker.bootstrap, f"{topic}-apart").open(0, 1)
        writer.transactional()
        writer.write(counts)
        writer.prepare(1)
        writer.commit(1)
        writer.close()

    measure("KafkaSinkWriter: encode, transaction", records, commit)
    return costs.figures


def nats_server_pid() -> int | None:
    """The machine's NATS server process, if this user may see it."""
    for p in psutil.process_iter(["name"]):
        if (p.info["name"] or "").startswith("nats-server"):
            return p.pid
    return None


def take_apart_jetstream(stream: str, subjects: tuple[str, ...], records: int) -> dict[str, Any]:
    """The JetStream path's costs, as :func:`take_apart`'s: a
    :class:`~connectors.nats.JetStreamReader` per subject of ``stream`` read to its end
    (fetching on the connector's I/O thread, decoding), then for ``records`` count
    records a :class:`~connectors.nats.JetStreamWriter` commit (JSON, each record
    published with its id and acknowledged) into a stream of its own."""
    from connectors.nats import JetStreamSink, JetStreamSource

    costs = Costs(nats_server_pid())

    source = JetStreamSource(servers=NATS_URL, stream=stream, subjects=subjects, bounded=True)
    got = read_to_end(source)  # a first read: the server's caches and ours warm
    costs.measure("JetStreamReader.poll (fetch, decode)", got, lambda: read_to_end(source))
    out = new_stream("SPBENCHAPART")
    try:
        writer = JetStreamSink(servers=NATS_URL, subject=f"{out}.counts", stream=out).open(0, 1)
        writer.transactional()

        def commit() -> None:
            writer.write(count_records(records))
            writer.prepare(1)
            writer.commit(1)
            writer.close()

        costs.measure("JetStreamWriter: encode, publish acknowledged", records, commit)
    finally:
        delete_streams(out)
    return costs.figures
