"""The NATS JetStream source: :class:`JetStreamSource` describes the stream and its
subjects, and a :class:`JetStreamReader` reads one subject.

Each subject is a partition: the ``subjects`` given, or (none given) every subject
the stream holds messages of, as its info lists them (looked for again every
``discovery_interval_s``). A partition's reader fetches through an ephemeral pull
consumer filtered on its subject, starting at a stream sequence
(``DeliverPolicy.BY_START_SEQUENCE``), with no acknowledgements
(``AckPolicy.NONE``): the position is the stream sequence of the last message
returned (0: none), kept by the job's checkpoints, and
:meth:`JetStreamReader.seek` makes a new consumer after it. Messages are not
acknowledged when a checkpoint completes: a reader has no hook for that, and a
consumer without acks needs none (the stream's retention, not acknowledgements,
decides when messages go; a work-queue stream does not fit). ``start="new"`` makes
a reader without a position start after the subject's last message when it first
reaches the server; ``bounded=True`` stops each partition at that message.

Records: the payload decoded by ``codec`` (JSON, UTF-8 or bytes). A message that
cannot be decoded makes :meth:`~JetStreamReader.poll` return the records before it,
then raise :class:`UndecodableMessageError` naming the stream, subject and sequence,
unless ``dead_letter_subject`` is set: the message then goes, payload and headers as
they are, to that subject (a JetStream publish, acknowledged before the reader's
position passes it, with ``Nats-Msg-Id: streampilot-dead/<stream>/<sequence>`` so
that a recovery sending it again within the duplicate window adds nothing), with
the headers ``Streampilot-Stream``, ``Streampilot-Subject``, ``Streampilot-Sequence``
and ``Streampilot-Error``; a stream must capture that subject (else the task fails
saying so). Discovery leaves the dead-letter subject out of the partitions.

Losing the server or the consumer: nats-py reconnects by itself; meanwhile, and
when the consumer is gone (deleted by an operator, or by the server after
:data:`CONSUMER_INACTIVE_S` without the reader), the reader returns empty batches,
says why in :attr:`JetStreamReader.stalled`, and makes a new consumer after the
last sequence it fetched (nothing lost, nothing twice), retrying with backoff
(:data:`~connectors.nats.common.RETRY_MIN_S` to
:data:`~connectors.nats.common.RETRY_MAX_S`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runtime.io import PartitionedSource, SourceReader

from .._writeahead import Codec, check_codec, decoder
from .common import (
    _LOST,
    MSG_ID,
    REQUEST_TIMEOUT_S,
    RETRY_MAX_S,
    RETRY_MIN_S,
    STOP_TIMEOUT_S,
    IoLoop,
    _close_when_connected,
    _Connection,
    _orphans,
)

__all__ = ["JetStreamReader", "JetStreamSource", "UndecodableMessageError"]

logger = logging.getLogger(__name__)

FETCH_WAIT_S = 0.5  # a fetch waits this long for messages; then the consumer is checked
FETCH_BATCH = 2048  # messages asked for by one fetch (fewer round trips per message)
BUFFERED_MAX = 4 * FETCH_BATCH  # records fetched ahead of polls before fetching pauses
CONSUMER_INACTIVE_S = 300.0  # the server deletes a consumer no reader fetched from this long
IDLE_S = 0.02  # a reader with nothing buffered is polled again after this long
_SKIPPED = object()  # in a reader's buffer: a dead-lettered message (a position, no record)


class UndecodableMessageError(ValueError):
    """A message the source cannot decode, and no ``dead_letter_subject`` is set."""


class _Gap(Exception):
    """Messages the consumer delivered never arrived (lost with a connection): without
    acknowledgements it will not send them again, so a new consumer must."""

    def __init__(self, missing: int) -> None:
        super().__init__(f"{missing} delivered messages did not arrive")


@dataclass(frozen=True, kw_only=True)
class JetStreamSource(_Connection, PartitionedSource):
    """Subjects of stream ``stream`` as partitions; see the module docstring."""

    stream: str
    subjects: tuple[str, ...] = ()
    start: Literal["first", "new"] = "first"
    codec: Codec = "utf-8"
    bounded: bool = False
    discovery_interval_s: float | None = None
    dead_letter_subject: str | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "subjects", tuple(self.subjects))
        if self.start not in ("first", "new"):
            raise ValueError(f"{owner}.start must be 'first' or 'new', got {self.start!r}")
        check_codec(owner, "codec", self.codec)
        dead = self.dead_letter_subject
        if dead is not None:
            if not (isinstance(dead, str) and dead and not set(dead) & set(" *>\t\r\n")):
                raise ValueError(
                    f"{owner}.dead_letter_subject must be a subject without wildcards or "
                    f"None, got {dead!r}"
                )
            if dead in self.subjects:
                raise ValueError(
                    f"{owner}.dead_letter_subject {dead!r} is one of the subjects it reads: "
                    "its dead letters would be read again; choose another subject"
                )

    def partitions(self) -> list[str]:
        """The ``subjects``, or the subjects the stream holds messages of (but the
        dead-letter subject), sorted. Raises
        :class:`ConnectionError` naming the servers when none answers, and
        :class:`ValueError` when the stream does not exist."""

        async def listed(js: Any) -> list[str]:
            try:
                info = await js.stream_info(self.stream, subjects_filter=">")
            except nats.js.errors.NotFoundError:
                raise ValueError(f"NATS at {self.where} has no stream {self.stream!r}") from None
            found = self.subjects or (info.state.subjects or {})
            return sorted(set(found) - {self.dead_letter_subject})

        return self.ask(listed)

    def open_partition(self, partition: str, start_time: float) -> JetStreamReader:
        return JetStreamReader(self, partition)


class JetStreamReader(SourceReader):
    """Reads one subject of the stream; see the module docstring. Its fetching starts
    at once, on the :class:`IoLoop`; :meth:`poll` never waits for it."""

    def __init__(self, source: JetStreamSource, subject: str) -> None:
        self._source = source
        self._subject = subject
        self._decode = decoder(source.codec)
        self._io = IoLoop.acquire()
        self._lock = threading.Lock()  # guards what both threads touch, below
        self._buffer: deque[tuple[int, Any]] = deque()  # (stream sequence, record)
        self._end = False  # bounded: everything up to the bound is in the buffer
        self._failure: Exception | None = None  # what poll raises
        self._arrived = threading.Event()  # set when the buffer, end or failure changes
        self._room = asyncio.Event()  # on the IoLoop: set while the buffer has room
        self._position: int | None = None if source.start == "new" else 0
        self._client: nats.NATS | None = None
        self._fetching: concurrent.futures.Future | None = None
        self._fetched: int | None = None  # on the IoLoop: the last sequence buffered
        self._stopped = threading.Event()  # set when its fetching has ended
        self._closed = False
        self.stalled: str | None = None
        """Why it cannot read now (server or consumer lost), None while it can."""
        self._begin(self._position)

    # -- on the caller's thread ----------------------------------------------------------

    def _begin(self, after: int | None) -> None:
        self._fetched = after
        self._stopped.clear()
        self._fetching = self._io.submit(self._fetch())

    def _stop(self) -> None:
        fetching, self._fetching = self._fetching, None
        if fetching is None:
            return
        fetching.cancel()
        if not self._stopped.wait(STOP_TIMEOUT_S):
            logger.warning("subject %s: fetching did not stop in time", self._subject)

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        with self._lock:
            if self._failure is not None and not self._buffer:
                raise self._failure  # once the records before it are taken
            count = min(max_records, len(self._buffer))
            taken = [self._buffer.popleft() for _ in range(count)]
            ended = self._end and not self._buffer
            if not self._buffer and not self._end and self._failure is None:
                self._arrived.clear()
        if taken:
            self._position = taken[-1][0]
            self._io.loop.call_soon_threadsafe(self._room.set)
        elif ended:
            return None
        records = [record for _, record in taken if record is not _SKIPPED]
        return records, [now] * len(records)

    def wait(self, timeout: float) -> bool:
        """Block until a poll would return something (records, the end or an error), at
        most ``timeout`` seconds; whether it would. For callers that may block (tests,
        tools), never the runtime."""
        return self._arrived.wait(timeout)

    def next_due(self, now: float) -> float:
        return now if self._arrived.is_set() else now + IDLE_S

    def position(self) -> int | None:
        """The stream sequence of the last message returned (None: ``start="new"`` and
        the subject's last sequence not known yet, which a seek takes as its start)."""
        return self._position

    def seek(self, position: Any) -> None:
        if position is not None and (
            isinstance(position, bool) or not isinstance(position, int) or position < 0
        ):
            raise ValueError(f"a JetStream position is a stream sequence >= 0, got {position!r}")
        self._stop()
        with self._lock:
            self._buffer.clear()
            self._end, self._failure = False, None
            self._arrived.clear()
        self._position = position
        self._begin(position)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop()
        client, self._client = self._client, None
        try:
            if client is not None:
                self._io.run(client.close(), STOP_TIMEOUT_S)
        except (TimeoutError, *_LOST) as exc:
            logger.warning("subject %s: closing the connection failed: %r", self._subject, exc)
        finally:
            IoLoop.release()

    # -- on the IoLoop -------------------------------------------------------------------

    def _push(self, records: list[tuple[int, Any]], end: bool = False) -> None:
        with self._lock:
            self._buffer.extend(records)
            self._end = end
            if len(self._buffer) >= BUFFERED_MAX:
                self._room.clear()
            self._arrived.set()

    def _fail(self, exc: Exception) -> None:
        with self._lock:
            self._failure = exc
            self._arrived.set()

    def _lost(self, why: str) -> None:
        if self.stalled is None:
            logger.warning("subject %s at %s: %s; retrying", self._subject, self._source.where, why)
        self.stalled = why

    async def _connection(self) -> nats.NATS:
        if self._client is None or self._client.is_closed:
            connecting = asyncio.ensure_future(
                self._source.connect(
                    reconnect=True, on_error=lambda exc: self._lost(f"connection: {exc!r}")
                )
            )
            try:  # nats-py leaves a socket open if cancelled halfway through connecting
                self._client = await asyncio.shield(connecting)
            except asyncio.CancelledError:
                _orphans.add(connecting)
                connecting.add_done_callback(_orphans.discard)
                connecting.add_done_callback(_close_when_connected)
                raise
        return self._client

    async def _last_sequence(self, js: Any) -> int:
        try:
            message = await js.get_last_msg(self._source.stream, self._subject)
        except nats.js.errors.NotFoundError:
            return 0
        return message.seq

    async def _fetch(self) -> None:
        """Fetch the subject after :attr:`_fetched` into the buffer until cancelled,
        making a new consumer after what it fetched when one fails (module docstring)."""
        self._room.set()
        bound: int | None = None
        failures = 0
        try:
            while True:
                try:
                    js = (await self._connection()).jetstream(timeout=REQUEST_TIMEOUT_S)
                    if self._fetched is None:
                        self._fetched = await self._last_sequence(js)
                        if self._position is None:
                            self._position = self._fetched
                    if self._source.bounded and bound is None:
                        bound = await self._last_sequence(js)
                    if bound is None or self._fetched < bound:
                        await self._consume(js, bound)
                    self._push([], end=True)
                    return
                except ValueError as exc:  # undecodable, or its dead letter refused
                    self._fail(exc)
                    return
                except (*_LOST, _Gap) as exc:
                    self._lost(f"{type(exc).__name__}: {exc}")
                    failures += 1
                    await asyncio.sleep(min(RETRY_MIN_S * 2 ** (failures - 1), RETRY_MAX_S))
        finally:
            self._stopped.set()

    async def _consume(self, js: Any, bound: int | None) -> None:
        """Read through a new consumer after :attr:`_fetched` until the bound; raises
        when the consumer fails or lost messages on their way (:class:`_Gap`)."""
        name = f"streampilot-{self._client._nuid.next().decode()}"  # type: ignore[union-attr]
        config = ConsumerConfig(
            name=name,
            filter_subject=self._subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._fetched + 1,  # type: ignore[operator]
            ack_policy=AckPolicy.NONE,
            inactive_threshold=CONSUMER_INACTIVE_S,
            mem_storage=True,
        )
        stream = self._source.stream
        await js.add_consumer(stream, config=config)
        sub = await js.pull_subscribe_bind(name=name, stream=stream)
        delivered = 0  # the consumer sequence of the last message received
        try:
            while bound is None or self._fetched < bound:  # type: ignore[operator]
                await self._room.wait()
                try:
                    messages = await sub.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
                except nats.errors.TimeoutError:
                    info = await sub.consumer_info()  # NotFoundError if it was deleted
                    if info.delivered.consumer_seq > delivered:
                        raise _Gap(info.delivered.consumer_seq - delivered) from None
                    self.stalled = None
                    continue
                records = []
                try:
                    for message in messages:
                        sequence, consumer = _sequences(message.reply)
                        if consumer != delivered + 1:
                            raise _Gap(consumer - delivered - 1)
                        delivered = consumer
                        if bound is not None and sequence > bound:
                            break
                        try:
                            record = self._decode(message.data)
                        except ValueError as exc:
                            await self._dead_letter(js, message, sequence, exc)
                            record = _SKIPPED
                        records.append((sequence, record))
                        self._fetched = sequence
                finally:
                    self._push(records)
                self.stalled = None
        finally:
            with contextlib.suppress(*_LOST):
                await sub.unsubscribe()
                await js.delete_consumer(stream, name)

    async def _dead_letter(self, js: Any, message: Any, seq: int, exc: ValueError) -> None:
        """Publish ``message`` (at stream sequence ``seq``, undecodable) to the dead-letter
        subject and wait for its acknowledgement (module docstring). Raises
        :class:`UndecodableMessageError` without one, :class:`ValueError` when no stream
        takes the subject or the stream refuses it, and what :data:`_LOST` lists when
        the server is lost (a new consumer then reads the message again)."""
        source = self._source
        why = (
            f"JetStream stream {source.stream!r}, subject {self._subject!r}, sequence {seq}: "
            f"cannot decode as {source.codec} ({exc})"
        )
        subject = source.dead_letter_subject
        if subject is None:
            raise UndecodableMessageError(
                f"{why}; fix its publisher, choose another codec, or set dead_letter_subject "
                "to set such messages aside"
            ) from None
        headers = {
            **(message.headers or {}),
            MSG_ID: f"streampilot-dead/{source.stream}/{seq}",
            "Streampilot-Stream": source.stream,
            "Streampilot-Subject": self._subject,
            "Streampilot-Sequence": str(seq),
            "Streampilot-Error": " ".join(why.split()),  # a header is one line
        }
        try:
            await js.publish(subject, message.data, headers=headers, timeout=REQUEST_TIMEOUT_S)
        except (nats.js.errors.NoStreamResponseError, nats.js.errors.APIError) as refused:
            raise ValueError(
                f"cannot send the undecodable message at {why.partition(': ')[0]} to "
                f"dead-letter subject {subject!r} at NATS {source.where}: {refused!r}; "
                "make a stream capture that subject"
            ) from None
        logger.warning("%s: sent to dead-letter subject %r", why, subject)


def _sequences(reply: str) -> tuple[int, int]:
    """The stream and consumer sequences of a message a consumer delivered, from its
    reply subject (what nats-py's ``Msg.metadata`` parses, without the objects):
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``
    or, with a domain and an account hash after ``$JS.ACK``, two tokens further on."""
    tokens = reply.split(".")
    at = 5 if len(tokens) == 9 else 7
    return int(tokens[at]), int(tokens[at + 1])
