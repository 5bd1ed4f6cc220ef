"""What the NATS source and sink share: the process's event loop for nats-py clients,
and the connection settings.

nats-py is asyncio-only and the runtime calls readers and writers synchronously on a
worker's event loop, so every client here runs on the process's :class:`IoLoop`, an
event loop in a thread of its own, started by the first client and stopped (its thread
joined) when the last one closes. A reader's fetching runs there and hands records over
through a buffer; :meth:`~connectors.nats.source.JetStreamReader.poll` only takes from
it.

Connection settings (:class:`_Connection`, the base of the source and the sink):
``servers`` (a URL or several), ``tls_ca``, ``tls_cert``, ``tls_key`` (PEM file paths;
a ``tls://`` URL or any of them turns TLS on), and ``options``, keyword arguments passed
through to :func:`nats.connect` (``user``, ``password``, ``token``,
``user_credentials``, ``nkeys_seed``, ``name``...). A server that refuses the
credentials or shows a certificate the client does not trust fails the submission (the
source's ``partitions``) and a writer's first publish at once, naming the servers and
why (:class:`ConnectionError`, :class:`OSError`); a reader retries, as for a lost
server, saying why in ``stalled``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import nats
import nats.errors
import nats.js.errors

__all__ = ["IoLoop"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 2.0  # an unreachable server fails a connection attempt this fast
REQUEST_TIMEOUT_S = 5.0  # a JetStream API request (stream info, consumer creation)
RETRY_MIN_S = 0.05  # first wait after a failure; doubles up to RETRY_MAX_S
RETRY_MAX_S = 5.0  # longest wait between two attempts to reach a lost server
STOP_TIMEOUT_S = 5.0  # a reader's fetching must stop within this (close, seek)
SETTLE_S = CONNECT_TIMEOUT_S + 1.0  # a connection being made when the loop stops ends by then
MSG_ID = "Nats-Msg-Id"

_LOST = (
    nats.errors.Error,  # connection closed, no servers, timeouts...
    nats.js.errors.Error,  # consumer or stream not found, API errors
    OSError,
    asyncio.TimeoutError,
)


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
