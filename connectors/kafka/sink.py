"""The Kafka sink: :class:`KafkaSink` describes where to produce, and a
:class:`KafkaSinkWriter` is one sink task's writer.

With ``transactions=True`` (the default) and checkpoints it is exactly-once, as Flink's
two-phase Kafka sink: each sink task has a pool of :data:`SLOTS` transactional producers
(``transactional.id`` ``<prefix>-<task>-<slot>``, :mod:`connectors.kafka.producers`),
one holding the open transaction, one the prepared one (at most one checkpoint is in
flight), and each epoch's records (those between two barriers) are also kept, encoded,
as the write-ahead copy a recovery needs:

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
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer

from runtime.io import Sink, SinkWriter

from .common import _FORMATS, Format, _check_choice, _client_config
from .producers import _produce, _Producers, _Slot

__all__ = ["KafkaSink", "KafkaSinkWriter"]

logger = logging.getLogger(__name__)

PREPARE_FLUSH_S = 5.0  # prepare() waits this long for acks; the commit waits for the rest
ABORT_TIMEOUT_S = 5.0  # abort()/hand_over(): a lost broker holds the loop no longer (a
#                       restore's fencing aborts what is left)
SLOTS = 2  # transactional producers per sink task: the open transaction and the prepared one


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


@dataclass(eq=False)
class _Epoch:
    """The records written between two barriers, in wire form (the write-ahead copy),
    and the slot whose transaction holds them all (None: none does, they are produced
    from the copy at the commit). ``checkpoint`` is None while the epoch is open."""

    checkpoint: int | None
    records: list
    slot: _Slot | None = None
    held_back: bool = False  # going live failed: produced at the commit only


class KafkaSinkWriter(_Producers, SinkWriter):
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

    def _encode(self, value: Any) -> tuple[bytes | None, bytes | None]:
        sink = self._sink
        try:
            key = None if sink.key is None else sink.key(value)
            return (key.encode() if isinstance(key, str) else key), _encode(value, sink.serializer)
        except (TypeError, ValueError, AttributeError) as exc:
            raise TypeError(
                f"cannot encode a record for topic {sink.topic!r} as {sink.serializer}: {exc}"
            ) from exc

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
