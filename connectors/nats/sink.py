"""The NATS JetStream sink: :class:`JetStreamSink` describes the subject, and a
:class:`JetStreamWriter` is one sink task's writer.

The sink publishes each record to ``subject`` with the core client, up to
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
:class:`~connectors.nats.common.IoLoop`. Readers see records once their checkpoint is
complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors

from runtime.io import Sink

from .._writeahead import Codec, Epoch, WriteAheadWriter, check_codec, encoder
from .common import _LOST, MSG_ID, STOP_TIMEOUT_S, IoLoop, _Connection

__all__ = ["JetStreamSink", "JetStreamWriter"]

logger = logging.getLogger(__name__)

ACK_TIMEOUT_S = 10.0  # publishes fail when no acknowledgement came for this long
PUBLISH_WINDOW = 8192  # publishes awaiting their acknowledgement; more wait for them
COMMIT_TIMEOUT_S = 600.0  # hang guard only: a commit fails after ACK_TIMEOUT_S idle
EXPECTED_STREAM = "Nats-Expected-Stream"


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
