"""Kafka source and sink, through ``confluent-kafka`` (librdkafka): any Kafka-protocol
cluster; ``config`` is passed through to the client (TLS, SASL, timeouts...).

:class:`KafkaSource` is a :class:`~runtime.io.PartitionedSource`: its partitions are
``"<topic>-<n>"``; each is read by its own consumer, *assigned* that one partition (no
group rebalancing), and its position is the offset of the next record to read. Records
are the deserialized values, or :class:`KafkaRecord` with ``records="record"``.

:class:`KafkaSink` produces each record to a topic with an idempotent producer. With
``transactions=True`` (the default) and checkpoints it is exactly-once by write-ahead:

1. :meth:`KafkaSinkWriter.write` buffers the epoch's encoded records in memory.
2. ``prepare(checkpoint)`` returns them (and those of earlier epochs not yet committed)
   as the writer's state, which the runtime stores in the checkpoint.
3. ``commit(checkpoint)`` produces each prepared epoch in one Kafka transaction that also
   commits, as a consumer-group offset of the group ``<transactional id>`` on partition 0
   of the topic, the epoch's checkpoint id: the marker makes a second commit a no-op.
4. ``restore(state)``: a new producer with the same ``transactional.id`` fences the old
   one (aborting its open transaction), reads the marker and commits the epochs of
   ``state`` above it; what the old writer buffered later is gone with it.

Without transactions (``transactions=False``, for brokers that lack them) the sink is
at-least-once: records are produced as they come and ``prepare`` waits until every one
is acknowledged. Limits: see :class:`KafkaSinkWriter`.

Errors::

    KafkaConnectorError (RuntimeError)
    ├── BrokerUnreachableError (also ConnectionError): no answer from bootstrap_servers
    └── UndecodableRecordError (also ValueError): a record the deserializer refuses

Settings are checked when a description is made (:class:`ValueError` naming the field).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
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

from runtime.io import PartitionedSource, Sink, SinkWriter, SourceReader

__all__ = [
    "BrokerUnreachableError",
    "KafkaConnectorError",
    "KafkaPartitionReader",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSinkWriter",
    "KafkaSource",
    "UndecodableRecordError",
]

logger = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 10.0  # partitions(): an unreachable broker is reported after this
WATERMARK_TIMEOUT_S = 5.0  # a high watermark asked for at open or for a first position
FLUSH_TIMEOUT_S = 30.0  # prepare()/close(): every produced record acknowledged by then
TXN_TIMEOUT_S = 30.0  # one transactional call (init, offsets, commit, abort)
IDLE_POLL_S = 0.01  # a reader whose last poll was empty is polled again after this
MAX_BATCH = 100_000  # records per consume() call (librdkafka's limit is 1,000,000)

Format = Literal["bytes", "utf-8", "json"]
_FORMATS = ("bytes", "utf-8", "json")
_TRANSIENT_ERRORS = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT}


class KafkaConnectorError(RuntimeError):
    """Base of this module's errors."""


class BrokerUnreachableError(KafkaConnectorError, ConnectionError):
    """The brokers at ``bootstrap_servers`` did not answer in time."""


class UndecodableRecordError(KafkaConnectorError, ValueError):
    """A record the source's deserializer cannot decode (no dead-letter topic is set)."""


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


def _check_choice(owner: str, name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


def _client_config(owner: str, bootstrap: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(bootstrap, str) or not bootstrap:
        raise ValueError(
            f"{owner}.bootstrap_servers must be 'host:port[,host:port]', got {bootstrap!r}"
        )
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"{owner}.config must be a dict of librdkafka settings, got {config!r}")
    return {"bootstrap.servers": bootstrap, "logger": logger, **config}


def _decode(data: bytes | None, fmt: str) -> Any:
    if data is None or fmt == "bytes":
        return data
    text = data.decode("utf-8")
    return text if fmt == "utf-8" else json.loads(text)


# -- the source ---------------------------------------------------------------------------


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
        :data:`METADATA_TIMEOUT_S`, :class:`KafkaConnectorError` for a missing topic."""
        admin = AdminClient(self.client_config())
        try:
            metadata = admin.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
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


# -- the sink -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaSink(Sink):
    """Produce each record to ``topic`` at ``bootstrap_servers`` (``config`` passed to
    librdkafka), its value encoded by ``serializer`` and its key by ``key`` (a picklable
    record -> str | bytes | None; librdkafka's partitioner places keyed records).

    ``transactions=True``: exactly-once with checkpoints (module docstring), transactional
    ids ``<transactional_id>-<task index>`` (default prefix ``streampilot-<topic>``: give
    each job writing to the same topic its own). ``transactions=False``: at-least-once.
    """

    bootstrap_servers: str
    topic: str
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    serializer: Format = "json"
    key: Callable[[Any], str | bytes | None] | None = None
    transactions: bool = True
    transactional_id: str | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "config", dict(self.config))
        _client_config(name, self.bootstrap_servers, self.config)
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"{name}.topic must be a topic name, got {self.topic!r}")
        _check_choice(name, "serializer", self.serializer, _FORMATS)
        if self.key is not None and not callable(self.key):
            raise ValueError(
                f"{name}.key must be a callable record -> key or None, got {self.key!r}"
            )

    @property
    def exactly_once(self) -> bool:  # type: ignore[override]
        return self.transactions

    def open(self, index: int, parallelism: int) -> KafkaSinkWriter:
        return KafkaSinkWriter(self, index)


# json.dumps with options builds an encoder per call: a third of a record's encoding time.
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _encode(value: Any, fmt: str) -> bytes | None:
    if value is None or fmt == "bytes":
        return value
    if fmt == "json":
        return _to_json(value).encode()
    return value.encode()


class KafkaSinkWriter(SinkWriter):
    """Task ``index``'s writer of a :class:`KafkaSink` (module docstring for the steps).

    Limits: an epoch is held in memory and in the checkpoint until its commit; a writer
    removed by a reconfiguration (:meth:`hand_over` without ``moving``) commits its
    records at once, so a recovery to a checkpoint taken before that barrier writes them
    again (a moved one hands them to its successor, which commits them); a broker
    that does not hide aborted transactions (tansu 0.6) shows twice the records of a
    commit cut short by a failure.
    """

    def __init__(self, sink: KafkaSink, index: int) -> None:
        self._sink = sink
        self._id = f"{sink.transactional_id or f'streampilot-{sink.topic}'}-{index}"
        self._transactional = False
        self._producer: Producer | None = None
        self._marker_reader: Consumer | None = None  # the group holding the commit marker
        self._committed = -1  # the last checkpoint whose epoch is in the topic
        self._epoch: list[tuple[bytes | None, bytes | None]] = []
        self._prepared: dict[int, list] = {}  # checkpoint -> its epoch, not committed yet
        self._errors: list[str] = []

    def _encode(self, value: Any) -> tuple[bytes | None, bytes | None]:
        sink = self._sink
        try:
            key = None if sink.key is None else sink.key(value)
            return (key.encode() if isinstance(key, str) else key), _encode(value, sink.serializer)
        except (TypeError, ValueError, AttributeError) as exc:
            raise TypeError(
                f"cannot encode a record for topic {sink.topic!r} as {sink.serializer}: {exc}"
            ) from exc

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(err.str())

    def _produce(self, records: list) -> None:
        producer, topic = self._producer, self._sink.topic
        assert producer is not None
        for key, value in records:
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        producer.poll(0)

    def _flush(self) -> None:
        producer = self._producer
        if producer is not None and producer.flush(FLUSH_TIMEOUT_S):
            raise OSError(
                f"records to {self._sink.topic!r} unacknowledged after {FLUSH_TIMEOUT_S:.0f}s"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise OSError(f"records to {self._sink.topic!r} failed: {errors[:3]}")

    def transactional(self) -> None:
        self._transactional = self._sink.transactions

    def write(self, values: list) -> None:
        records = [self._encode(v) for v in values]
        if self._transactional:
            self._epoch += records
            return
        if self._producer is None:
            self._producer = self._new_producer(**{"enable.idempotence": True})
        self._produce(records)

    def _sink_config(self, **extra: Any) -> dict[str, Any]:
        return {
            **_client_config("KafkaSink", self._sink.bootstrap_servers, self._sink.config),
            **extra,
        }

    def _new_producer(self, **extra: Any) -> Producer:
        """A producer that reports failed deliveries only, to :meth:`_delivered` (a
        callback per acknowledged record costs more CPU than producing the record)."""
        only_errors = {"on_delivery": self._delivered, "delivery.report.only.error": True}
        return Producer(self._sink_config(**only_errors, **extra))

    # -- the two phases ---------------------------------------------------------------

    def prepare(self, checkpoint_id: int) -> dict[str, Any] | None:
        """Step 2: the epochs not committed yet, this one included, as the state; without
        transactions, every record produced so far acknowledged (OSError if not)."""
        if not self._transactional:
            self._flush()
            return None
        self._prepared[checkpoint_id], self._epoch = self._epoch, []
        pending = [[c, [list(r) for r in recs]] for c, recs in sorted(self._prepared.items())]
        return {"checkpoint": checkpoint_id, "pending": pending}

    def commit(self, checkpoint_id: int) -> None:
        """Step 3: each epoch prepared at ``checkpoint_id`` or before in its transaction."""
        if not self._transactional:
            self._flush()
            return
        for c in sorted(c for c in self._prepared if c <= checkpoint_id):
            self._commit_epoch(c, self._prepared[c])
            del self._prepared[c]

    def restore(self, state: Any) -> None:
        """Step 4: commit the epochs of ``state`` its marker does not show committed."""
        if not self._transactional or state is None:
            return
        for c, records in state["pending"]:
            self._commit_epoch(c, [tuple(r) for r in records])

    def _begin(self) -> None:
        """A transactional producer (fencing any earlier one of this id) and the marker."""
        if self._producer is not None:
            return
        producer = self._new_producer(**{"transactional.id": self._id})
        reader = Consumer(self._sink_config(**{"group.id": self._id, "enable.auto.commit": False}))
        try:
            producer.init_transactions(TXN_TIMEOUT_S)
            (marker,) = reader.committed([TopicPartition(self._sink.topic, 0)], TXN_TIMEOUT_S)
        except KafkaException as exc:
            reader.close()
            raise OSError(
                f"cannot start the transactions of {self._id!r} on {self._sink.bootstrap_servers}: "
                f"{exc.args[0].str()} (a broker without transactions needs transactions=False)"
            ) from None
        self._producer, self._marker_reader = producer, reader
        self._committed = max(self._committed, marker.offset)

    def _commit_epoch(self, checkpoint_id: int | None, records: list) -> None:
        """Produce ``records`` in one transaction with the marker ``checkpoint_id`` (None:
        no marker); nothing if the marker shows it done. OSError if it fails."""
        self._begin()
        if checkpoint_id is not None and checkpoint_id <= self._committed:
            return
        producer, reader = self._producer, self._marker_reader
        assert producer is not None and reader is not None
        try:
            producer.begin_transaction()
            self._produce(records)
            if checkpoint_id is not None:
                marker = [TopicPartition(self._sink.topic, 0, checkpoint_id)]
                producer.send_offsets_to_transaction(
                    marker, reader.consumer_group_metadata(), TXN_TIMEOUT_S
                )
            producer.commit_transaction(TXN_TIMEOUT_S)
        except KafkaException as exc:
            self._drop()  # a new producer fences this one and aborts its transaction
            raise OSError(
                f"the transaction of {self._id!r} (checkpoint {checkpoint_id}) failed: {exc}"
            ) from None
        if self._errors:
            errors, self._errors = self._errors, []
            raise OSError(f"records of {self._id!r} failed: {errors[:3]}")
        if checkpoint_id is not None:
            self._committed = checkpoint_id

    def hand_over(self, barrier_id: int, moving: bool) -> dict[str, Any] | None:
        """Leaving at reconfiguration barrier ``barrier_id``. Moving (the same task index,
        so the same transactional id): its epochs, the open one as epoch ``barrier_id``,
        for its new writer to :meth:`adopt` and commit as checkpoints complete; nothing
        is produced here. Removed: everything it holds committed now (class docstring)."""
        if not (moving and self._transactional):
            self.close()
            return None
        if self._epoch:
            self._prepared[barrier_id], self._epoch = self._epoch, []
        pending = [[c, [list(r) for r in recs]] for c, recs in sorted(self._prepared.items())]
        self._prepared = {}
        self._drop()
        return {"pending": pending}

    def adopt(self, state: dict[str, Any]) -> None:
        """Continue the task that moved here: its epochs are this writer's to commit."""
        for c, records in state["pending"]:
            self._prepared[c] = [tuple(r) for r in records] + self._prepared.get(c, [])

    def close(self) -> None:
        """The prepared epochs and the last one committed (or, without transactions,
        every record acknowledged); OSError if they cannot be."""
        try:
            if not self._transactional:
                self._flush()
                return
            self.commit(max(self._prepared, default=0))
            if self._epoch:
                self._commit_epoch(None, self._epoch)
                self._epoch = []
        finally:
            self._drop()

    def abort(self) -> None:
        """Drop what it holds; what it produced without transactions stays."""
        self._epoch, self._prepared = [], {}
        if self._producer is not None:
            self._producer.purge()
        self._drop()

    def _drop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(0)
        reader, self._marker_reader = self._marker_reader, None
        if reader is not None:
            reader.close()
