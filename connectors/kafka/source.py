"""The Kafka source: :class:`KafkaSource` describes what to read, and a
:class:`KafkaPartitionReader` reads one of its partitions.

The partitions are ``"<topic>-<n>"``; each is read by its own consumer, *assigned* that
one partition (no group rebalancing), and its position is the offset of the next record
to read. Records are the deserialized values, or :class:`KafkaRecord` with
``records="record"``. A record the deserializer refuses fails the reader
(:class:`~connectors.kafka.common.UndecodableRecordError`) or, with
``dead_letter_topic``, goes there raw. Listing the partitions raises
:class:`~connectors.kafka.common.BrokerUnreachableError` or
:class:`~connectors.kafka.common.AuthenticationFailedError` naming the address; a reader
rides out a lost broker (librdkafka reconnects, its batches are empty meanwhile).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from runtime.io import PartitionedSource, SourceReader

from .common import (
    _FORMATS,
    FLUSH_TIMEOUT_S,
    AuthenticationFailedError,
    BrokerUnreachableError,
    Format,
    KafkaConnectorError,
    UndecodableRecordError,
    _check_choice,
    _client_config,
)

__all__ = ["KafkaPartitionReader", "KafkaRecord", "KafkaSource"]

logger = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 10.0  # partitions(): an unreachable broker is reported after this
WATERMARK_TIMEOUT_S = 5.0  # a high watermark asked for at open or for a first position
IDLE_POLL_S = 0.01  # a reader whose last poll was empty is polled again after this
MAX_BATCH = 100_000  # records per consume() call (librdkafka's limit is 1,000,000)


@dataclass(frozen=True)
class KafkaRecord:
    """A record as read, with ``records="record"``; ``value`` is deserialized, ``key``
    is raw bytes, ``timestamp_ms`` is None when the broker has none."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: Any
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None


def _decode(data: bytes | None, fmt: str) -> Any:
    if data is None or fmt == "bytes":
        return data
    text = data.decode("utf-8")
    return text if fmt == "utf-8" else json.loads(text)


@dataclass(frozen=True)
class KafkaSource(PartitionedSource):
    """Read ``topic`` (a name or a sequence of names) from the cluster at
    ``bootstrap_servers``; ``config`` goes to librdkafka as is (``security.protocol``,
    ``ssl.ca.location``, ``sasl.mechanism``, ``sasl.username``...).

    ``deserializer`` decodes values; ``start`` is where a partition without a position
    starts; ``records="record"`` gives :class:`KafkaRecord` instead of values.
    ``stop_at`` makes it bounded: each partition ends before that offset (an int) or
    where its reader first reaches its end (``"end"``: librdkafka's end-of-partition
    event; a reader reopened later, after a recovery, reads to the end it finds then). ``dead_letter_topic`` takes, raw, the records that
    cannot be decoded (with a ``streampilot-error`` header) instead of failing the job.
    ``group_id`` names a consumer group to which each reader commits the offsets a
    checkpoint recorded once it is complete (``SourceReader.committed``), so that
    standard lag tooling sees the job's progress; the positions that count stay the
    checkpoint's.
    """

    bootstrap_servers: str
    topic: str | Sequence[str]
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    deserializer: Format = "utf-8"
    start: Literal["earliest", "latest"] = "earliest"
    records: Literal["value", "record"] = "value"
    stop_at: int | Literal["end"] | None = None
    group_id: str | None = None
    dead_letter_topic: str | None = None
    discovery_interval_s: float | None = 30.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        topics = (self.topic,) if isinstance(self.topic, str) else tuple(self.topic)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise ValueError(
                f"{name}.topic must be a topic name or a list of them, got {self.topic!r}"
            )
        object.__setattr__(self, "topic", topics[0] if len(topics) == 1 else topics)
        object.__setattr__(self, "config", dict(self.config))
        _client_config(name, self.bootstrap_servers, self.config)
        _check_choice(name, "deserializer", self.deserializer, _FORMATS)
        _check_choice(name, "start", self.start, ("earliest", "latest"))
        _check_choice(name, "records", self.records, ("value", "record"))
        if not (self.stop_at in (None, "end") or (type(self.stop_at) is int and self.stop_at >= 0)):
            raise ValueError(
                f"{name}.stop_at must be None, an offset >= 0 or 'end', got {self.stop_at!r}"
            )
        for attr in ("group_id", "dead_letter_topic"):
            value = getattr(self, attr)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name}.{attr} must be a non-empty name or None, got {value!r}")
        interval = self.discovery_interval_s
        if interval is not None and not (isinstance(interval, int | float) and interval > 0):
            raise ValueError(
                f"{name}.discovery_interval_s must be > 0 seconds or None, got {interval!r}"
            )

    @property
    def topics(self) -> tuple[str, ...]:
        return (self.topic,) if isinstance(self.topic, str) else tuple(self.topic)

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.stop_at is not None

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """The librdkafka settings of its clients: ``config`` over the defaults, ``extra``
        over both."""
        return {**_client_config(type(self).__name__, self.bootstrap_servers, self.config), **extra}

    def partitions(self) -> list[str]:
        """``"<topic>-<n>"`` for each partition of each topic, from one metadata request.
        Raises :class:`BrokerUnreachableError` naming the address after
        :data:`METADATA_TIMEOUT_S` (:class:`AuthenticationFailedError` if they refused
        the credentials), :class:`KafkaConnectorError` for a missing topic."""
        errors: list[KafkaError] = []  # what librdkafka reports meanwhile (error_cb)
        admin = AdminClient(self.client_config(error_cb=errors.append))
        try:
            metadata = admin.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb
            refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            if refused:
                raise AuthenticationFailedError(
                    f"the Kafka brokers at {self.bootstrap_servers} refused the credentials "
                    f"in config ({refused[-1].str()}): check sasl.mechanism, sasl.username "
                    "and sasl.password"
                ) from None
            raise BrokerUnreachableError(
                f"cannot reach the Kafka brokers at {self.bootstrap_servers} within "
                f"{METADATA_TIMEOUT_S:.0f}s ({exc.args[0].str()}): check bootstrap_servers, "
                "that the brokers run, and the TLS/SASL settings in config"
            ) from None
        names = []
        for topic in self.topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                why = "does not exist" if meta is None else meta.error.str()
                raise KafkaConnectorError(
                    f"topic {topic!r} on {self.bootstrap_servers}: {why}; create it first"
                )
            names += [f"{topic}-{n}" for n in sorted(meta.partitions)]
        return names

    def _split(self, partition: str) -> tuple[str, int]:
        topic, _, n = partition.rpartition("-")
        if topic not in self.topics or not n.isdigit():
            raise ValueError(
                f"{type(self).__name__} has no partition {partition!r}: partitions are "
                f"'<topic>-<n>' of {list(self.topics)}"
            )
        return topic, int(n)

    def open_partition(self, partition: str, start_time: float) -> KafkaPartitionReader:
        topic, n = self._split(partition)
        return KafkaPartitionReader(self, topic, n)

    open = PartitionedSource.open


class KafkaPartitionReader(SourceReader):
    """Reads partition ``partition`` of ``topic`` through a consumer assigned to it.

    :meth:`poll` never blocks (it takes what librdkafka has fetched in the background)
    and never raises for a lost connection: librdkafka reconnects and the batches are
    empty meanwhile. It raises for a fatal client error, a partition that no longer
    exists, and a record it cannot decode when there is no dead-letter topic.
    """

    def __init__(self, source: KafkaSource, topic: str, partition: int) -> None:
        self._source = source
        self._tp = TopicPartition(topic, partition)
        self._name = f"{topic}-{partition}"
        self._consumer = Consumer(
            source.client_config(**{
                "group.id": source.group_id or f"streampilot-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,  # tells where the partition ends (stop_at)
                "auto.offset.reset": source.start,
            })
        )  # fmt: skip
        self._dead_letters: Producer | None = None
        self._next: int | None = None  # the offset of the next record, once known
        # bounded: the offset it stops before (stop_at="end": found at the first end event)
        self._end: int | None = source.stop_at if isinstance(source.stop_at, int) else None
        self._idle = False
        try:
            self._assign(OFFSET_BEGINNING if source.start == "earliest" else OFFSET_END)
        except BaseException:
            self._consumer.close()
            raise

    def _assign(self, offset: int) -> None:
        self._consumer.assign([TopicPartition(self._tp.topic, self._tp.partition, offset)])

    def _watermarks(self) -> tuple[int, int]:
        try:
            return self._consumer.get_watermark_offsets(self._tp, WATERMARK_TIMEOUT_S, cached=False)
        except KafkaException as exc:
            raise BrokerUnreachableError(
                f"cannot read the offsets of {self._name} on {self._source.bootstrap_servers} "
                f"within {WATERMARK_TIMEOUT_S:.0f}s: {exc.args[0].str()}"
            ) from None

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._end is not None and self._next is not None and self._next >= self._end:
            return None
        values: list = []
        for msg in self._consumer.consume(min(max(1, max_records), MAX_BATCH), 0):
            if not self._take(msg, values):
                break
        self._idle = not values
        return values, [now] * len(values)

    def _take(self, msg: Message, values: list) -> bool:
        """Add ``msg``'s record to ``values``; False once past the end (bounded)."""
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self.stalled = None
                self._next = max(self._next or 0, msg.offset())
                if self._source.stop_at == "end" and self._end is None:
                    self._end = self._next
                return True
            if error.fatal() or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaConnectorError(f"reading {self._name}: {error.str()}")
            logger.debug("reading %s: %s (librdkafka retries)", self._name, error.str())
            self.stalled = f"reading {self._name}: {error.str()} (retrying)"
            return True
        self.stalled = None
        offset = msg.offset()
        if self._end is not None and offset >= self._end:
            self._next = self._end
            return False
        try:
            value = _decode(msg.value(), self._source.deserializer)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            if values and self._source.dead_letter_topic is None:
                self.seek(offset)  # the batch so far first; the next poll raises
                return False
            self._dead_letter(msg, exc)
            self._next = offset + 1
            return True
        self._next = offset + 1
        if self._source.records == "record":
            kind, stamp = msg.timestamp()
            value = KafkaRecord(
                self._tp.topic, self._tp.partition, offset, msg.key(), value,
                tuple(msg.headers() or ()), None if kind == TIMESTAMP_NOT_AVAILABLE else stamp,
            )  # fmt: skip
        values.append(value)
        return True

    def _dead_letter(self, msg: Message, exc: ValueError) -> None:
        where = f"topic {self._tp.topic!r} partition {self._tp.partition} offset {msg.offset()}"
        topic = self._source.dead_letter_topic
        if topic is None:
            raise UndecodableRecordError(
                f"cannot decode the record at {where} as {self._source.deserializer}: {exc}; "
                "fix its producer, choose another deserializer, or set dead_letter_topic"
            ) from None
        if self._dead_letters is None:
            self._dead_letters = Producer(
                self._source.client_config(**{"enable.idempotence": True})
            )
        headers = [*(msg.headers() or ()), ("streampilot-error", f"{where}: {exc}".encode())]
        self._dead_letters.produce(topic, msg.value(), msg.key(), headers=headers)
        self._dead_letters.poll(0)

    def next_due(self, now: float) -> float:
        return now + IDLE_POLL_S if self._idle else now

    def position(self) -> int:
        """The offset of the next record (dead letters so far acknowledged first)."""
        if self._dead_letters is not None and self._dead_letters.flush(FLUSH_TIMEOUT_S):
            raise KafkaConnectorError(
                f"dead letters of {self._name} not acknowledged by "
                f"{self._source.dead_letter_topic!r} within {FLUSH_TIMEOUT_S:.0f}s"
            )
        if self._next is None:
            (known,) = self._consumer.position([self._tp])
            if known.offset >= 0:
                self._next = known.offset
            elif self._source.start == "earliest":
                return 0  # the log start (auto.offset.reset moves a seek there)
            else:  # pin "latest" where it is now: the consumer may not have looked yet
                self.seek(self._watermarks()[1])
        return self._next

    def committed(self, position: Any) -> None:
        """With a ``group_id``: commit ``position`` (the next offset, checkpointed) to the
        consumer group, asynchronously, so that standard lag tooling sees it."""
        if self._source.group_id is None or self._consumer is None:
            return
        offsets = [TopicPartition(self._tp.topic, self._tp.partition, int(position))]
        self._consumer.commit(offsets=offsets, asynchronous=True)

    def lag(self) -> int | None:
        """The partition's high watermark (as last fetched) minus the next offset."""
        if self._consumer is None or self._next is None:
            return None
        _low, high = self._consumer.get_watermark_offsets(self._tp, cached=True)
        return None if high < 0 else max(0, high - self._next)

    def seek(self, position: Any) -> None:
        if type(position) is not int or position < 0:
            raise ValueError(f"a position of {self._name} is an offset >= 0, got {position!r}")
        self._next = position
        self._idle = False
        self._assign(position)

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        producer, self._dead_letters = self._dead_letters, None
        if producer is not None and producer.flush(FLUSH_TIMEOUT_S):
            logger.warning("%s: dead letters lost at close (unacknowledged)", self._name)
