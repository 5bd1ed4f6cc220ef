"""Kafka source and sink, through ``confluent-kafka`` (librdkafka): any Kafka-protocol
cluster; ``config`` is passed through to the client (TLS, SASL, timeouts...).

:class:`KafkaSource` is a :class:`~runtime.io.PartitionedSource`: its partitions are
``"<topic>-<n>"``; each is read by its own consumer, *assigned* that one partition (no
group rebalancing), and its position is the offset of the next record to read. Records
are the deserialized values, or :class:`KafkaRecord` with ``records="record"``.

:class:`KafkaSink` produces each record to a topic. With ``transactions=True`` (the
default) and checkpoints it is exactly-once, as Flink's two-phase Kafka sink: each sink
task has a pool of :data:`SLOTS` transactional producers (``transactional.id``
``<prefix>-<task>-<slot>``), one holding the open transaction, one the prepared one
(at most one checkpoint is in flight), and each epoch's records (those between two
barriers) are also kept, encoded, as the write-ahead copy a recovery needs:

1. :meth:`KafkaSinkWriter.write` produces the records into the open transaction as they
   arrive (invisible to read-committed consumers) and keeps their copy.
2. ``prepare(checkpoint)`` (the barrier) flushes the open transaction, which becomes the
   epoch of that checkpoint, and returns the writer's token and the copies of every
   epoch not yet committed as its state (stored in the checkpoint); the next records go
   into a transaction of the other producer.
3. ``commit(checkpoint)`` commits each epoch's transaction, in checkpoint order, with a
   marker: the checkpoint id committed in the same transaction as the offset of
   partition 0 of the topic for the consumer group ``<prefix>-<task>-<token>``.
4. ``restore(state)``: new producers with the pool's ids fence the old writer's (aborting
   its open and prepared transactions), the marker says which epochs of ``state`` were
   committed, and those that were not are produced again from their copies, in one
   transaction with the marker. What the old writer produced after the checkpoint was
   aborted by the fencing.

librdkafka cannot take over another process's open transaction, hence the copies: an
epoch whose transaction is lost (its producer failed, was fenced, or the task moved) is
produced again from its copy at its commit, after the marker is read, so that a
transaction committed before its producer was lost is not repeated. The token (drawn by
a fresh writer, taken from the checkpoint by a restored one) names one run of the task,
so that a job run again from scratch is not taken for a repeat of an earlier run. While
both producers hold transactions (a commit late, failed or lost), the records of the
open epoch wait in memory and are produced once one is free.

Without transactions (``transactions=False``, for brokers that lack them) the sink is
at-least-once: records are produced as they come with an idempotent producer and
``prepare`` waits until every one is acknowledged. Limits: see :class:`KafkaSinkWriter`.

Errors::

    KafkaConnectorError (RuntimeError)
    ├── BrokerUnreachableError (also ConnectionError): no answer from bootstrap_servers
    ├── AuthenticationFailedError (also PermissionError): the brokers refused config's
    │   SASL credentials
    └── UndecodableRecordError (also ValueError): a record the deserializer refuses

Settings are checked when a description is made (:class:`ValueError` naming the field).
"""

from __future__ import annotations

import json
import logging
import secrets
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
    "AuthenticationFailedError",
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
PREPARE_FLUSH_S = 5.0  # prepare() waits this long for acks; the commit waits for the rest
ABORT_TIMEOUT_S = 5.0  # abort()/hand_over(): a lost broker holds the loop no longer (a
#                       restore's fencing aborts what is left)
SLOTS = 2  # transactional producers per sink task: the open transaction and the prepared one
IDLE_POLL_S = 0.01  # a reader whose last poll was empty is polled again after this
MAX_BATCH = 100_000  # records per consume() call (librdkafka's limit is 1,000,000)

Format = Literal["bytes", "utf-8", "json"]
_FORMATS = ("bytes", "utf-8", "json")
_TRANSIENT_ERRORS = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT}


class KafkaConnectorError(RuntimeError):
    """Base of this module's errors."""


class BrokerUnreachableError(KafkaConnectorError, ConnectionError):
    """The brokers at ``bootstrap_servers`` did not answer in time."""


class AuthenticationFailedError(KafkaConnectorError, PermissionError):
    """The brokers at ``bootstrap_servers`` refused the credentials (SASL) in ``config``."""


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


# -- the sink -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaSink(Sink):
    """Produce each record to ``topic`` at ``bootstrap_servers`` (``config`` passed to
    librdkafka), its value encoded by ``serializer`` and its key by ``key`` (a picklable
    record -> str | bytes | None; librdkafka's partitioner places keyed records).

    ``transactions=True``: exactly-once with checkpoints (module docstring), transactional
    ids ``<transactional_id>-<task index>-<slot>`` (default prefix ``streampilot-<topic>``:
    give each job writing to the same topic its own). ``transactions=False``:
    at-least-once.
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


class _Slot:
    """One transactional producer of a sink task's pool (``transactional.id`` ``id``),
    created and fenced in (``init_transactions``) when first needed. ``in_txn``: it
    holds the transaction of one epoch (open, then prepared) until that is committed
    or lost."""

    def __init__(self, transactional_id: str) -> None:
        self.id = transactional_id
        self.producer: Producer | None = None
        self.in_txn = False
        self.errors: list[str] = []  # failed deliveries since the transaction began

    def delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err.str())

    def drop(self) -> None:
        """Forget the producer and its transaction: the next ``init_transactions`` of this
        id (a new producer of this slot, or a restored writer's) aborts it."""
        producer, self.producer = self.producer, None
        self.in_txn = False
        self.errors.clear()
        if producer is not None:
            producer.purge()
            producer.flush(0)


@dataclass(eq=False)
class _Epoch:
    """The records written between two barriers, in wire form (the write-ahead copy),
    and the slot whose transaction holds them all (None: none does, they are produced
    from the copy at the commit). ``checkpoint`` is None while the epoch is open."""

    checkpoint: int | None
    records: list
    slot: _Slot | None = None
    held_back: bool = False  # going live failed: produced at the commit only


def _produce(producer: Producer, topic: str, records: list) -> None:
    produce = producer.produce
    for key, value in records:
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
    producer.poll(0)


class KafkaSinkWriter(SinkWriter):
    """Task ``index``'s writer of a :class:`KafkaSink` (module docstring for the steps).

    Its epochs, held ones (prepared, not committed, in checkpoint order) then the open
    one, are *live* (their slot's transaction holds their records) or not (their records
    are only in memory and in checkpoints); no live epoch follows one that is not, so
    that epochs are committed in checkpoint order: an epoch whose transaction is lost
    takes every later one's with it (aborted, produced again from the copies).

    Limits: an epoch's records are held in memory and in the checkpoint until its
    commit; a writer removed by a reconfiguration (:meth:`hand_over` without
    ``moving``) commits its records at once, so a recovery to a checkpoint taken before
    that barrier writes them again (a moved one hands them to its successor, which
    commits them); a broker that does not hide aborted transactions (tansu 0.6) shows
    the records of every aborted transaction: those of an epoch cut short by a failure
    or a move, which are then produced again.
    """

    def __init__(self, sink: KafkaSink, index: int) -> None:
        self._sink = sink
        self._prefix = f"{sink.transactional_id or f'streampilot-{sink.topic}'}-{index}"
        self._transactional = False
        self._token = secrets.token_hex(8)
        self._slots = [_Slot(f"{self._prefix}-{n}") for n in range(SLOTS)]
        self._held: list[_Epoch] = []
        self._open = _Epoch(None, [])
        self._last = 0  # the id of its last prepare (or of the restored checkpoint)
        self._marker_reader: tuple[str, Consumer] | None = None  # (group, its consumer)
        self._producer: Producer | None = None  # without transactions
        self._errors: list[str] = []  # without transactions: failed deliveries
        self._closed = False

    @property
    def marker_group(self) -> str:
        """The consumer group whose offset of partition 0 of the topic is the id of the
        last checkpoint whose epoch this run of the task committed."""
        return f"{self._prefix}-{self._token}" if self._token else self._prefix

    def transactional_ids(self) -> list[str]:
        """The ``transactional.id`` of each producer of its pool."""
        return [slot.id for slot in self._slots]

    def _encode(self, value: Any) -> tuple[bytes | None, bytes | None]:
        sink = self._sink
        try:
            key = None if sink.key is None else sink.key(value)
            return (key.encode() if isinstance(key, str) else key), _encode(value, sink.serializer)
        except (TypeError, ValueError, AttributeError) as exc:
            raise TypeError(
                f"cannot encode a record for topic {sink.topic!r} as {sink.serializer}: {exc}"
            ) from exc

    def _sink_config(self, **extra: Any) -> dict[str, Any]:
        return {
            **_client_config("KafkaSink", self._sink.bootstrap_servers, self._sink.config),
            **extra,
        }

    # -- without transactions -------------------------------------------------------------

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(err.str())

    def _flush(self) -> None:
        """Every record produced so far acknowledged; OSError if not."""
        producer = self._producer
        if producer is not None and producer.flush(FLUSH_TIMEOUT_S):
            raise OSError(
                f"records to {self._sink.topic!r} unacknowledged after {FLUSH_TIMEOUT_S:.0f}s"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise OSError(f"records to {self._sink.topic!r} failed: {errors[:3]}")

    def _write_now(self, records: list) -> None:
        if self._producer is None:
            # Failed deliveries only are reported: a callback per acknowledged record
            # costs more CPU than producing the record.
            self._producer = Producer(
                self._sink_config(**{
                    "enable.idempotence": True,
                    "on_delivery": self._delivered,
                    "delivery.report.only.error": True,
                })
            )  # fmt: skip
        _produce(self._producer, self._sink.topic, records)

    # -- the pool of transactional producers ----------------------------------------------

    def _ready(self, slot: _Slot) -> Producer:
        """``slot``'s producer, created and fenced in if it has none: the broker then
        aborts the open transaction of any earlier producer of this id (or completes
        one whose commit was under way). OSError if it cannot."""
        if slot.producer is None:
            producer = Producer(
                self._sink_config(**{
                    "transactional.id": slot.id,
                    "on_delivery": slot.delivered,
                    "delivery.report.only.error": True,
                })
            )  # fmt: skip
            try:
                producer.init_transactions(TXN_TIMEOUT_S)
            except KafkaException as exc:
                raise OSError(
                    f"cannot start the transactions of {slot.id!r} on "
                    f"{self._sink.bootstrap_servers}: {exc.args[0].str()} (a broker "
                    "without transactions needs transactions=False)"
                ) from None
            slot.producer = producer
        return slot.producer

    def _marker_consumer(self) -> Consumer:
        group = self.marker_group
        if self._marker_reader is not None and self._marker_reader[0] != group:
            self._marker_reader[1].close()
            self._marker_reader = None
        if self._marker_reader is None:
            reader = Consumer(self._sink_config(**{"group.id": group, "enable.auto.commit": False}))
            self._marker_reader = (group, reader)
        return self._marker_reader[1]

    def _marker(self) -> int:
        """The last checkpoint whose epoch this run committed (-1: none). Read once the
        lost slots are fenced in again, so that a commit in doubt is settled first."""
        for slot in self._slots:
            if slot.producer is None:
                self._ready(slot)
        try:
            (marker,) = self._marker_consumer().committed(
                [TopicPartition(self._sink.topic, 0)], TXN_TIMEOUT_S
            )
        except KafkaException as exc:
            raise OSError(
                f"cannot read the commit marker of {self._prefix!r} (group "
                f"{self.marker_group!r}) on {self._sink.bootstrap_servers}: {exc.args[0].str()}"
            ) from None
        return max(marker.offset, -1)

    def _end(self, slot: _Slot, checkpoint: int | None) -> None:
        """Commit ``slot``'s transaction with the marker ``checkpoint`` (None: no marker).
        KafkaException if it fails."""
        producer = slot.producer
        assert producer is not None and slot.in_txn
        if checkpoint is not None:
            producer.send_offsets_to_transaction(
                [TopicPartition(self._sink.topic, 0, checkpoint)],
                self._marker_consumer().consumer_group_metadata(),
                TXN_TIMEOUT_S,
            )
        self._commit_transaction(slot)
        slot.in_txn = False
        slot.errors.clear()

    def _commit_transaction(self, slot: _Slot) -> None:
        """The commit itself (its records and marker are in the transaction): the step
        a fault-injection test stops a worker before or after."""
        assert slot.producer is not None
        slot.producer.commit_transaction(TXN_TIMEOUT_S)

    def _epochs(self) -> list[_Epoch]:
        return [*self._held, self._open]

    def _lose(self, epoch: _Epoch, why: str) -> None:
        """``epoch``'s transaction is lost (or about to be aborted): it and every later
        epoch are produced again from their copies at their commit."""
        epochs = self._epochs()
        lost = [e for e in epochs[epochs.index(epoch) :] if e.slot is not None]
        if lost:
            logger.warning(
                "%s: transactions of %d epoch(s) lost, their records are produced again "
                "at the commit: %s", self._prefix, len(lost), why,
            )  # fmt: skip
        for e in lost:
            assert e.slot is not None
            e.slot.drop()
            e.slot = None

    def _go_live(self) -> None:
        """Produce the open epoch's records so far into a transaction of a free slot, if
        one is free and every held epoch is live; else they wait for their commit (or a
        later call)."""
        epoch = self._open
        if epoch.slot is not None or epoch.held_back or not epoch.records:
            return
        if any(e.slot is None for e in self._held):
            return
        slot = next((s for s in self._slots if not s.in_txn), None)
        if slot is None:
            return
        try:
            self._ready(slot).begin_transaction()
        except (OSError, KafkaException) as exc:
            logger.warning("%s: the records of this epoch are produced at its commit: %s",
                           slot.id, exc)  # fmt: skip
            slot.drop()
            epoch.held_back = True
            return
        slot.in_txn, epoch.slot = True, slot
        self._into(epoch, epoch.records)

    def _into(self, epoch: _Epoch, records: list) -> None:
        """Produce ``records`` into ``epoch``'s transaction (losing it if that fails)."""
        assert epoch.slot is not None and epoch.slot.producer is not None
        try:
            _produce(epoch.slot.producer, self._sink.topic, records)
        except KafkaException as exc:
            self._lose(epoch, str(exc))

    # -- the two phases -------------------------------------------------------------------

    def transactional(self) -> None:
        self._transactional = self._sink.transactions

    def write(self, values: list) -> None:
        records = [self._encode(v) for v in values]
        if not self._transactional:
            if records:
                self._write_now(records)
            return
        epoch = self._open
        epoch.records += records
        if epoch.slot is None:
            self._go_live()
        elif records:
            self._into(epoch, records)

    def prepare(self, checkpoint_id: int) -> dict[str, Any] | None:
        """Step 2: the open transaction flushed (for :data:`PREPARE_FLUSH_S` at most)
        becomes epoch ``checkpoint_id``; the state is the token and the copies of the
        epochs not committed yet, this one included. Without transactions: every record
        produced so far acknowledged (OSError if not)."""
        if not self._transactional:
            self._flush()
            return None
        epoch = self._open
        if epoch.slot is not None:
            assert epoch.slot.producer is not None
            epoch.slot.producer.flush(PREPARE_FLUSH_S)  # the rest is flushed by the commit
            if epoch.slot.errors:
                self._lose(epoch, f"records failed: {epoch.slot.errors[:3]}")
        self._open = _Epoch(None, [])
        if epoch.records:
            epoch.checkpoint = checkpoint_id
            self._held.append(epoch)
        self._last = checkpoint_id
        return self._state(checkpoint_id)

    def _state(self, checkpoint_id: int) -> dict[str, Any]:
        pending = [[e.checkpoint, e.records] for e in self._held]
        return {"token": self._token, "checkpoint": checkpoint_id, "pending": pending}

    def commit(self, checkpoint_id: int) -> None:
        """Step 3: every epoch prepared at ``checkpoint_id`` or before committed, in
        checkpoint order: a live one by committing its transaction, the others from
        their copies in one transaction, those the marker shows committed skipped.
        OSError if it cannot (the epochs not committed stay for the next commit)."""
        if not self._transactional:
            self._flush()
            return
        due = [e for e in self._held if e.checkpoint is not None and e.checkpoint <= checkpoint_id]
        marker = self._marker() if any(e.slot is None for e in due) else -1
        for epoch in [e for e in due if e.slot is not None]:
            assert epoch.slot is not None and epoch.checkpoint is not None
            slot = epoch.slot
            try:
                self._end(slot, epoch.checkpoint)
            except KafkaException as exc:
                self._lose(epoch, str(exc))
                raise OSError(
                    f"the transaction of {slot.id!r} (checkpoint {epoch.checkpoint}) failed: {exc}"
                ) from None
            epoch.slot = None
            self._held.remove(epoch)
            marker = epoch.checkpoint
        again = [e for e in due if e in self._held and e.checkpoint > marker]  # type: ignore[operator]
        if again:
            self._produce_again(again, again[-1].checkpoint)
        self._held = [e for e in self._held if e not in due]
        self._go_live()

    def _produce_again(self, epochs: list[_Epoch], marker: int | None) -> None:
        """Produce ``epochs`` from their copies in one transaction with ``marker``, on a
        free slot (all are: no live epoch follows one that is not). OSError if it fails."""
        slot = next(s for s in self._slots if not s.in_txn)
        producer = self._ready(slot)
        try:
            producer.begin_transaction()
            slot.in_txn = True
            for epoch in epochs:
                _produce(producer, self._sink.topic, epoch.records)
            self._end(slot, marker)
        except KafkaException as exc:
            slot.drop()
            raise OSError(
                f"the transaction of {slot.id!r} (checkpoint {marker}) failed: {exc}"
            ) from None

    def restore(self, state: dict[str, Any] | None) -> None:
        """Step 4: the pool's producers fenced in (the old writer's transactions aborted),
        then the epochs of ``state`` that the marker does not show committed produced
        again. A state without a token (from before the pool) has its marker in the
        group ``<prefix>-<task>``."""
        if not self._transactional or state is None:
            return
        self._token = state.get("token") or ""
        self._last = state["checkpoint"]
        self._held = [_Epoch(c, list(records)) for c, records in state["pending"]]
        for slot in self._slots:
            self._ready(slot)
        self.commit(self._last)

    def hand_over(self, barrier_id: int, moving: bool) -> dict[str, Any] | None:
        """Leaving at reconfiguration barrier ``barrier_id``. Moving (the same task index,
        so the same transactional ids): its transactions aborted, its token and the
        copies of its epochs (the open one as epoch ``barrier_id``) for its new writer to
        :meth:`adopt` and commit as checkpoints complete. Removed: everything it holds
        committed now (class docstring)."""
        if not (moving and self._transactional):
            self.close()
            return None
        if self._closed:
            return None
        if self._open.records:
            self._open.checkpoint = barrier_id
            self._held.append(self._open)
        state = self._state(self._last)
        self.abort()
        return state

    def adopt(self, state: dict[str, Any]) -> None:
        """Continue the task that moved here: its token, and its epochs, produced again
        from their copies at their commit (this writer's own epochs wait for that)."""
        self._token = state.get("token") or ""
        self._last = max(self._last, state["checkpoint"])
        if self._epochs()[0].slot is not None:
            self._lose(self._epochs()[0], "the task's earlier epochs come first")
        adopted = [_Epoch(c, list(records)) for c, records in state["pending"]]
        self._held = sorted([*adopted, *self._held], key=lambda e: e.checkpoint)

    def close(self) -> None:
        """The held epochs and the open one committed (the open one without a marker);
        without transactions, every record acknowledged. OSError if they cannot be."""
        if self._closed:
            return
        try:
            if not self._transactional:
                self._flush()
                return
            if self._held:
                self.commit(self._held[-1].checkpoint)  # type: ignore[arg-type]
            epoch = self._open
            if epoch.slot is not None:
                try:
                    self._end(epoch.slot, None)
                except KafkaException as exc:
                    self._lose(epoch, str(exc))
            if epoch.slot is None and epoch.records:
                self._produce_again([epoch], None)
            self._open = _Epoch(None, [])
        finally:
            self._release(abort=False)

    def abort(self) -> None:
        """Drop what it holds, aborting its open transactions (for
        :data:`ABORT_TIMEOUT_S` at most; a restore's fencing aborts what is left); what
        it produced without transactions stays."""
        if self._closed:
            return
        self._held, self._open = [], _Epoch(None, [])
        if self._producer is not None:
            self._producer.purge()
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        self._closed = True
        for slot in self._slots:
            if abort and slot.in_txn and slot.producer is not None:
                slot.producer.purge()
                try:
                    slot.producer.abort_transaction(ABORT_TIMEOUT_S)
                except KafkaException as exc:
                    logger.info("%s: transaction left to be aborted by fencing: %s", slot.id, exc)
            slot.drop()
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(0)
        reader, self._marker_reader = self._marker_reader, None
        if reader is not None:
            reader[1].close()
