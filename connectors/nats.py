"""NATS JetStream: a partitioned source (one partition per subject) and a sink.

nats-py is asyncio-only and the runtime calls readers and writers synchronously on a
worker's event loop, so every client here runs on the process's :class:`IoLoop`, an
event loop in a thread of its own, started by the first client and stopped (its thread
joined) when the last one closes. A reader's fetching runs there and hands records over
through a buffer; :meth:`JetStreamReader.poll` only takes from it.

:class:`JetStreamSource`
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
    (:data:`RETRY_MIN_S` to :data:`RETRY_MAX_S`).

:class:`JetStreamSink`
    Publishes each record to ``subject`` with the core client, up to
    :data:`PUBLISH_WINDOW` publishes in flight, JetStream's acknowledgements (to one
    reply inbox per batch) counted as they come; a batch fails when one is an error or
    none comes for :data:`ACK_TIMEOUT_S`. With checkpoints it is exactly once through
    :class:`~connectors._writeahead.WriteAheadWriter`: a checkpoint's records are
    published when it completes, each with the header ``Nats-Msg-Id:
    <name>/<index>/<token>/<checkpoint>/<n>``, so that the stream's duplicate window
    drops a record published again by the same commit after a recovery. Limit: the
    window (the stream's ``duplicate_window``, 2 minutes by default) must be longer than
    the time from a commit to its repetition by a recovery's restore; a commit repeated
    after the window has passed publishes its records twice.

    A commit waits for its acknowledgements (the sink contract: its records are visible
    when it returns), on the caller's thread; the publishing runs on the
    :class:`IoLoop`. Readers see records once their checkpoint is complete.

Connection settings, common to both: ``servers`` (a URL or several), ``tls_ca``,
``tls_cert``, ``tls_key`` (PEM file paths; a ``tls://`` URL or any of them turns TLS on),
and ``options``, keyword arguments passed through to :func:`nats.connect` (``user``,
``password``, ``token``, ``user_credentials``, ``nkeys_seed``, ``name``...). A server
that refuses the credentials or shows a certificate the client does not trust fails the
submission (the source's ``partitions``) and a writer's first publish at once, naming
the servers and why (:class:`ConnectionError`, :class:`OSError`); a reader retries, as
for a lost server, saying why in ``stalled``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runtime.io import PartitionedSource, Sink, SourceReader

from ._writeahead import Codec, Epoch, WriteAheadWriter, check_codec, decoder, encoder

__all__ = [
    "IoLoop",
    "JetStreamReader",
    "JetStreamSink",
    "JetStreamSource",
    "JetStreamWriter",
    "UndecodableMessageError",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 2.0  # an unreachable server fails a connection attempt this fast
REQUEST_TIMEOUT_S = 5.0  # a JetStream API request (stream info, consumer creation)
FETCH_WAIT_S = 0.5  # a fetch waits this long for messages; then the consumer is checked
FETCH_BATCH = 2048  # messages asked for by one fetch (fewer round trips per message)
BUFFERED_MAX = 4 * FETCH_BATCH  # records fetched ahead of polls before fetching pauses
CONSUMER_INACTIVE_S = 300.0  # the server deletes a consumer no reader fetched from this long
RETRY_MIN_S = 0.05  # first wait after a failure; doubles up to RETRY_MAX_S
RETRY_MAX_S = 5.0  # longest wait between two attempts to reach a lost server
IDLE_S = 0.02  # a reader with nothing buffered is polled again after this long
STOP_TIMEOUT_S = 5.0  # a reader's fetching must stop within this (close, seek)
SETTLE_S = CONNECT_TIMEOUT_S + 1.0  # a connection being made when the loop stops ends by then
ACK_TIMEOUT_S = 10.0  # publishes fail when no acknowledgement came for this long
PUBLISH_WINDOW = 8192  # publishes awaiting their acknowledgement; more wait for them
COMMIT_TIMEOUT_S = 600.0  # hang guard only: a commit fails after ACK_TIMEOUT_S idle
MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"
_SKIPPED = object()  # in a reader's buffer: a dead-lettered message (a position, no record)

_LOST = (
    nats.errors.Error,  # connection closed, no servers, timeouts...
    nats.js.errors.Error,  # consumer or stream not found, API errors
    OSError,
    asyncio.TimeoutError,
)


class UndecodableMessageError(ValueError):
    """A message the source cannot decode, and no ``dead_letter_subject`` is set."""


class _Gap(Exception):
    """Messages the consumer delivered never arrived (lost with a connection): without
    acknowledgements it will not send them again, so a new consumer must."""

    def __init__(self, missing: int) -> None:
        super().__init__(f"{missing} delivered messages did not arrive")


class IoLoop:
    """The process's event loop for nats-py clients, in a daemon thread. :meth:`acquire`
    starts it if needed and counts the user; :meth:`release` stops it and joins the
    thread when the last user leaves. :meth:`run` must not be called from the loop's
    own thread."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _shared: ClassVar[IoLoop | None] = None
    _users: ClassVar[int] = 0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="nats-io", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls) -> IoLoop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = IoLoop()
            cls._users += 1
            return cls._shared

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users > 0 or cls._shared is None:
                return
            shared, cls._shared = cls._shared, None
        try:  # let closed transports finish closing; end what a client left running
            shared.submit(_settle()).result(SETTLE_S + STOP_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            logger.warning("the NATS loop did not settle in time")
        shared.loop.call_soon_threadsafe(shared.loop.stop)
        shared._thread.join(STOP_TIMEOUT_S)
        shared.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait for its result; :class:`TimeoutError`
        after ``timeout`` (the coroutine is cancelled)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from NATS within {timeout:.0f} s") from None


_orphans: set[asyncio.Future] = set()  # on the IoLoop: connections no reader waits for


def _close_when_connected(connecting: asyncio.Future) -> None:
    """A connection its reader stopped waiting for: closed once made."""
    if not connecting.cancelled() and connecting.exception() is None:
        closing = asyncio.ensure_future(connecting.result().close())
        _orphans.add(closing)
        closing.add_done_callback(_orphans.discard)


async def _settle() -> None:
    """Let orphan connections close (within :data:`SETTLE_S`), cancel the loop's other
    tasks, then run what closing sockets scheduled."""
    while _orphans:
        done, _ = await asyncio.wait(list(_orphans), timeout=SETTLE_S)
        if not done:
            break
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)


@dataclass(frozen=True, kw_only=True)
class _Connection:
    """Where the server is and how to talk to it (module docstring)."""

    servers: str | tuple[str, ...] = "nats://127.0.0.1:4222"
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return self.servers if isinstance(self.servers, str) else ",".join(self.servers)

    def _tls(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    async def connect(self, *, reconnect: bool, on_error: Any = None) -> nats.NATS:
        """A client; ``reconnect=False``: two attempts per server, for a one-off question."""
        servers = [self.servers] if isinstance(self.servers, str) else list(self.servers)

        async def report(exc: Exception) -> None:
            if on_error is not None:
                on_error(exc)

        settings: dict[str, Any] = {
            "servers": servers,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "allow_reconnect": reconnect,
            "max_reconnect_attempts": -1 if reconnect else 1,  # 0 would mean no limit
            "reconnect_time_wait": RETRY_MIN_S * 4,
            "error_cb": report,
            "tls": self._tls(),
        }
        return await nats.connect(**{**settings, **self.options})

    async def _ask(self, question: Any) -> Any:
        try:
            client = await self.connect(reconnect=False)
        except _LOST as exc:
            raise ConnectionError(f"cannot reach NATS at {self.where}: {exc!r}") from exc
        try:
            return await question(client.jetstream(timeout=REQUEST_TIMEOUT_S))
        finally:
            await client.close()

    def ask(self, question: Any) -> Any:
        """``await question(jetstream)`` on a connection of its own, from a thread that
        may block. Raises :class:`ConnectionError` naming the servers if none answers."""
        io = IoLoop.acquire()
        try:
            return io.run(self._ask(question), 3 * (CONNECT_TIMEOUT_S + REQUEST_TIMEOUT_S))
        finally:
            IoLoop.release()


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


@dataclass(frozen=True, kw_only=True)
class JetStreamSink(_Connection, Sink):
    """Publish records to ``subject`` (captured by a stream); see the module docstring.
    ``name``: the message ids' prefix (default: ``subject``); ``stream``: if given,
    publishes are refused unless that stream captures them."""

    subject: str
    codec: Codec = "json"
    stream: str | None = None
    name: str | None = None

    exactly_once = True  # with checkpoints: write-ahead, ids in the duplicate window

    def __post_init__(self) -> None:
        check_codec(type(self).__name__, "codec", self.codec)

    def open(self, index: int, parallelism: int) -> JetStreamWriter:
        return JetStreamWriter(self, index)


class JetStreamWriter(WriteAheadWriter):
    """Sink task ``index``'s writer (module docstring). It connects at its first write or
    commit."""

    def __init__(self, sink: JetStreamSink, index: int) -> None:
        super().__init__()
        self._sink = sink
        self._index = index
        self._encode = encoder(sink.codec)
        self._io = IoLoop.acquire()
        self._client: nats.NATS | None = None  # on the IoLoop

    def encode(self, value: Any) -> bytes:
        return self._encode(value)

    def msg_id(self, checkpoint: float, n: int) -> str:
        """The id of the ``n``-th record of epoch ``checkpoint`` of this run."""
        return (
            f"{self._sink.name or self._sink.subject}/{self._index}/{self.token}/{checkpoint}/{n}"
        )

    def write_now(self, records: list) -> None:
        self._run([(records, None)])

    def write_epochs(self, epochs: list[Epoch]) -> None:
        """Publish every record of ``epochs`` with its id (:meth:`msg_id`): the stream
        drops those it has had within its duplicate window."""
        self._run(
            [(records, [self.msg_id(c, n) for n in range(len(records))]) for c, records in epochs]
        )

    def _run(self, batches: list[tuple[list[bytes], list[str] | None]]) -> None:
        try:
            self._io.run(self._publish(batches), COMMIT_TIMEOUT_S)
        except (TimeoutError, *_LOST) as exc:
            raise OSError(
                f"cannot publish to {self._sink.subject!r} at NATS {self._sink.where}: {exc!r}"
            ) from exc

    def release(self) -> None:
        try:
            self._io.run(self._disconnect(), STOP_TIMEOUT_S)
        except (TimeoutError, *_LOST) as exc:
            logger.warning("closing the connection to %s failed: %r", self._sink.where, exc)
        finally:
            IoLoop.release()

    # -- on the IoLoop -------------------------------------------------------------------

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _connection(self) -> nats.NATS:
        """The writer's client, connected again after a loss; connecting fails at once
        (wrong credentials, an untrusted certificate, no server), as does a publish on
        a connection lost meanwhile: the commit fails and the next one connects."""
        if self._client is None or self._client.is_closed:
            self._client = await self._sink.connect(reconnect=False)
        return self._client

    async def _publish(self, batches: list[tuple[list[bytes], list[str] | None]]) -> None:
        """Publish ``batches`` (payloads, their message ids or None) with the core
        client, up to PUBLISH_WINDOW unacknowledged, and wait until every one is
        acknowledged. Raises :class:`nats.errors.Error` (an acknowledgement that is an
        error, none for ACK_TIMEOUT_S) or what :data:`_LOST` lists."""
        client = await self._connection()
        acks = _Acks()
        inbox = client.new_inbox()
        sub = await client.subscribe(inbox, cb=acks.take, pending_msgs_limit=4 * PUBLISH_WINDOW)
        subject, stream = self._sink.subject, self._sink.stream
        expected = {EXPECTED_STREAM: stream} if stream is not None else {}
        try:
            for records, ids in batches:
                for n, payload in enumerate(records):
                    headers = expected if ids is None else {**expected, MSG_ID: ids[n]}
                    await client.publish(subject, payload, reply=inbox, headers=headers or None)
                    acks.sent += 1
                    if acks.sent - acks.received >= PUBLISH_WINDOW:
                        await acks.wait(acks.sent - PUBLISH_WINDOW // 2)
            await acks.wait(acks.sent)
        finally:
            with contextlib.suppress(*_LOST):
                await sub.unsubscribe()


class _Acks:
    """JetStream's acknowledgements of one batch of publishes, counted on the IoLoop."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.error: str | None = None
        self._progress = asyncio.Event()

    async def take(self, msg: Any) -> None:
        self.received += 1
        if (not msg.data or b'"error"' in msg.data) and self.error is None:
            status = (msg.headers or {}).get("Status")
            self.error = msg.data.decode(errors="replace") if msg.data else (
                "no stream captures the subject" if status == "503" else f"status {status}"
            )  # fmt: skip
        self._progress.set()

    async def wait(self, received: int) -> None:
        """Until ``received`` acknowledgements came; raises for an error or when none
        comes for ACK_TIMEOUT_S."""
        while self.received < received and self.error is None:
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), ACK_TIMEOUT_S)
            except TimeoutError:
                raise nats.errors.TimeoutError(
                    f"{received - self.received} publishes unacknowledged after "
                    f"{ACK_TIMEOUT_S:.0f}s without one"
                ) from None
        if self.error is not None:
            raise nats.errors.Error(f"JetStream refused a publish: {self.error}")
