"""The producers of a :class:`~connectors.kafka.sink.KafkaSinkWriter` and its commit
marker, apart from the protocol that decides what goes into which transaction.

Without transactions a writer produces through one idempotent producer, created at its
first write; :meth:`_Producers._flush` waits until every record is acknowledged (OSError
if one failed or is not acknowledged after :data:`~connectors.kafka.common.FLUSH_TIMEOUT_S`).

With transactions it has a pool of slots (:class:`_Slot`), one transactional producer
each, created and fenced in (``init_transactions``, which aborts the open transaction of
any earlier producer of that id) when first needed. The commit marker is the offset of
partition 0 of the topic that the consumer group :attr:`_Producers.marker_group` has
committed: the id of the last checkpoint whose epoch this run of the task committed,
committed in the same transaction as that epoch's records (:meth:`_Producers._end`).
Fencing in and reading the marker raise :class:`OSError` naming the address; ending a
transaction raises librdkafka's ``KafkaException``, which the writer handles. Each
transactional call waits :data:`TXN_TIMEOUT_S` at most.

:class:`_Producers` is the writer's base: the writer's ``__init__`` sets the attributes
it lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from .common import FLUSH_TIMEOUT_S, _client_config

if TYPE_CHECKING:
    from .sink import KafkaSink

TXN_TIMEOUT_S = 30.0  # one transactional call (init, offsets, commit, abort)


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


class _Producers:
    """The producers of one sink task's writer and its commit marker (module docstring).
    The writer sets these attributes in its ``__init__``."""

    _sink: KafkaSink
    _prefix: str  # ``<transactional_id>-<task index>``
    _token: str  # names this run of the task (the marker's group)
    _slots: list[_Slot]
    _marker_reader: tuple[str, Consumer] | None  # (group, its consumer)
    _producer: Producer | None  # without transactions
    _errors: list[str]  # without transactions: failed deliveries

    @property
    def marker_group(self) -> str:
        """The consumer group whose offset of partition 0 of the topic is the id of the
        last checkpoint whose epoch this run of the task committed."""
        return f"{self._prefix}-{self._token}" if self._token else self._prefix

    def transactional_ids(self) -> list[str]:
        """The ``transactional.id`` of each producer of its pool."""
        return [slot.id for slot in self._slots]

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
