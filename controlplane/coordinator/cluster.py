"""Cluster membership: the coordinator's port, worker registrations, heartbeats, sending.

The bottom layer of the coordinator (see :mod:`controlplane.coordinator`); it knows
workers and their connections, not jobs. A connection to the port is accepted once the
peer proved it holds the cluster secret (:mod:`runtime.handshake`), then either:

1. registers a worker (``register``, within ``REGISTER_READ_TIMEOUT_S``): it gets an id
   (``registered``) and its messages are read until the connection closes, when the
   worker is lost; or
2. carries the heartbeats of a registered worker.

A worker silent for ``heartbeat_timeout_s`` is lost too (its connection is aborted).

:class:`~.core.Coordinator` extends :class:`Cluster` with jobs through three hooks, called
on the coordinator's loop in this order for one worker: :meth:`Cluster._on_registered`,
:meth:`Cluster._on_message` (each message, in order), :meth:`Cluster._on_lost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
import time
from collections.abc import Callable

from controlplane.backends import BackendError, WorkerBackend
from controlplane.statuses import WorkerStatus
from runtime import handshake, messages, protocol

from .errors import CoordinatorError
from .model import WorkerInfo

__all__ = ["HEARTBEAT_TIMEOUT_S", "REGISTER_READ_TIMEOUT_S", "Cluster"]

logger = logging.getLogger(__name__)

REGISTER_READ_TIMEOUT_S = 5.0  # a worker that proved itself says who it is within this
HEARTBEAT_TIMEOUT_S = 10.0  # a worker silent this long (metrics come every second) is lost


class _WorkerConn:
    def __init__(self, info: WorkerInfo, writer: asyncio.StreamWriter) -> None:
        self.info = info
        self.writer = writer

    def send(self, msg: messages.ToWorker) -> None:
        """Queue ``msg`` for this worker (dropped once the connection is closing)."""
        if not self.writer.is_closing():
            protocol.write_frame(self.writer, messages.encode(msg))


class Cluster:
    """Accepts workers and keeps their connections. Start with :meth:`start`."""

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.secret = secret
        self._control_key = handshake.control_key(secret)
        self.tls = tls  # served on the port when set (see runtime.handshake.server_tls)
        self._refusals = handshake.RefusalLog(logger, "coordinator")
        self.host = host
        self.port = port
        self.workers: dict[str, WorkerInfo] = {}
        self._conns: dict[str, _WorkerConn] = {}
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._barrier_ids = itertools.count(1)
        self._registered = asyncio.Condition()
        self._readers: set[asyncio.Task] = set()
        self.backend: WorkerBackend | None = None  # starts workers a plan asks for
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._monitor: asyncio.Task | None = None

    # -- hooks (the coordinator's jobs) ---------------------------------------------------------

    def _on_registered(self, info: WorkerInfo) -> None:
        """Worker ``info`` registered (before anyone waiting for registrations is woken)."""

    def _on_message(self, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
        """Worker ``info`` sent ``msg`` (decoded) on its control connection."""

    def _on_lost(self, info: WorkerInfo) -> None:
        """Worker ``info`` is gone (``lost``, or ``stopped`` when retired); it is no longer
        connected."""

    def _on_cause_known(self, info: WorkerInfo, earlier: str | None) -> None:
        """A backend told why worker ``info``, already gone, failed: ``info.error`` is that
        reason now, ``earlier`` the cause it was lost with."""

    # -- the port -------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            ssl=self.tls,
            ssl_handshake_timeout=handshake.HANDSHAKE_TIMEOUT_S if self.tls else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._monitor = asyncio.create_task(self._watch_heartbeats(), name="heartbeats")
        logger.info("coordinator listening on %s:%s", self.host, self.port)
        return self.host, self.port

    async def close(self) -> None:
        """Tell workers to exit, close every connection and the port."""
        for conn in self._conns.values():
            conn.send(messages.Shutdown())
            conn.writer.close()
        if self._monitor is not None:
            self._monitor.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._readers):
            t.cancel()

    # -- workers --------------------------------------------------------------------------------

    def alive_workers(self) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.status == WorkerStatus.ALIVE]

    async def wait_for_workers(self, n: int, timeout: float = 30.0) -> list[WorkerInfo]:
        """Wait until at least ``n`` workers are alive; CoordinatorError after ``timeout``."""
        try:
            await asyncio.wait_for(
                self.until_registered(lambda: len(self.alive_workers()) >= n), timeout
            )
        except TimeoutError:
            raise CoordinatorError(
                f"only {len(self.alive_workers())} of {n} workers registered within {timeout:.0f}s"
            ) from None
        return self.alive_workers()

    async def until_registered(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked now and after every registration."""
        async with self._registered:
            await self._registered.wait_for(condition)

    def data_addresses(self) -> dict[str, tuple[str, int]]:
        """Every alive worker's data address, as workers are told it."""
        return {w.id: (w.data_host, w.data_port) for w in self.alive_workers()}

    def next_barrier_id(self) -> int:
        """A barrier id never handed out before (barriers of every job share them)."""
        return next(self._barrier_ids)

    def skip_barrier_ids(self, past: int) -> None:
        """Hand out only ids above ``past`` from now on (a job resumed from an earlier
        coordinator's checkpoint ``past``: its later checkpoints come after it)."""
        upcoming = next(self._barrier_ids)
        self._barrier_ids = itertools.count(max(upcoming, past + 1))

    def connected(self, worker_id: str) -> bool:
        """Whether worker ``worker_id`` has an open control connection."""
        return worker_id in self._conns

    def send(self, worker_id: str, msg: messages.ToWorker) -> None:
        """Send ``msg`` to worker ``worker_id``; nothing if it is not connected."""
        conn = self._conns.get(worker_id)
        if conn is not None:
            conn.send(msg)

    def broadcast(self, msg: messages.ToWorker) -> None:
        """Send ``msg`` to every connected worker."""
        for conn in list(self._conns.values()):
            conn.send(msg)

    def shutdown_worker(self, worker_id: str) -> bool:
        """Ask one worker to exit (it closes its connection and is then lost); False when it
        is not connected."""
        conn = self._conns.get(worker_id)
        if conn is None:
            return False
        conn.send(messages.Shutdown())
        return True

    async def retire_worker(self, worker_id: str, reason: str) -> None:
        """Stop a worker no job needs any more (one started for a plan that did not use it):
        it is ``stopped``, not lost, with ``reason``; its backend stops it, or it is asked
        to exit when no backend of ours started it."""
        info = self.workers.get(worker_id)
        if info is None or info.status != WorkerStatus.ALIVE:
            return
        info.status, info.error = WorkerStatus.STOPPED, reason
        if self.backend is not None and self.backend.owns(info.pid):
            try:
                await self.backend.stop_worker(info.pid)
            except BackendError as exc:
                logger.warning("could not stop worker %s: %s", worker_id, exc)
        else:
            self.shutdown_worker(worker_id)

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """A backend saw what hosts the worker fail (e.g. its Spark task died): the worker is
        lost with ``reason``. If its connection already closed, the reason replaces the
        vaguer cause on the worker and in the error of the jobs that failed with it."""
        info = self.workers.get(worker_id)
        if info is None:
            return
        conn = self._conns.get(worker_id)
        if conn is not None:
            info.error = reason
            conn.writer.transport.abort()  # _serve's reader ends and calls _worker_lost
            return
        earlier = info.error
        info.error = reason
        self._on_cause_known(info, earlier)

    async def drain(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(ConnectionError):
                await conn.writer.drain()

    # -- connections ----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._readers.add(task)
        peer = writer.get_extra_info("peername")
        conn: _WorkerConn | None = None
        try:
            # Nothing is decoded from a peer before it has proved it holds the secret.
            try:
                context = await handshake.accept(reader, writer, self._key_for)
            except handshake.HandshakeError as exc:
                self._refusals.refused(peer, exc)
                return
            if context.startswith("heartbeat:"):
                await self._serve_heartbeats(context.partition(":")[2], reader)
                return
            try:
                msg = await asyncio.wait_for(
                    protocol.read_frame(reader, f"connection from {peer}"), REGISTER_READ_TIMEOUT_S
                )
            except (TimeoutError, EOFError, ConnectionError) as exc:
                logger.warning("connection from %s did not register: %s", peer, exc)
                return
            try:
                register = messages.decode(msg, f"connection from {peer}", messages.ToCoordinator)
                if not isinstance(register, messages.Register):
                    raise messages.UnknownMessage(
                        f"connection from {peer}", f"expected register, got {register.TYPE}"
                    )
            except messages.MessageError as exc:
                logger.warning("refused: %s", exc)
                protocol.write_frame(
                    writer, messages.encode(messages.Refused(f"expected a register message: {exc}"))
                )
                return
            info = WorkerInfo(
                id=f"w{next(self._ids)}",
                host=register.host,
                pid=register.pid,
                cpus=register.cpus,
                memory_mb=register.memory_mb,
                data_host=register.data_host,
                data_port=register.data_port,
                name=register.name,
                executor_id=register.executor_id,
            )
            conn = _WorkerConn(info, writer)
            self.workers[info.id] = info
            self._conns[info.id] = conn
            conn.send(messages.Registered(info.id))
            logger.info(
                "worker %s registered (pid %s, data %s:%s)",
                info.id,
                info.pid,
                info.data_host,
                info.data_port,
            )
            self._on_registered(info)
            async with self._registered:
                self._registered.notify_all()
            name = f"worker {info.id}"
            while True:
                try:
                    frame = await protocol.read_frame(reader, name)
                except EOFError:
                    break
                info.last_seen = time.monotonic()
                try:
                    msg = messages.decode(frame, name, messages.ToCoordinator)
                except messages.MessageError as exc:  # dropped; the connection goes on
                    logger.warning("refused a message: %s", exc)
                    continue
                self._on_message(info, msg)
        except (ConnectionError, OSError) as exc:
            if conn is not None and conn.info.error is None:
                conn.info.error = str(exc)
        except asyncio.CancelledError:
            pass
        finally:
            self._readers.discard(task)
            writer.close()
            if conn is not None:
                self._worker_lost(conn.info)

    def _key_for(self, context: str) -> bytes | None:
        """The key of a connection for ``context`` (see :mod:`runtime.handshake`): the
        control key for a registration, or for the heartbeats of a registered worker."""
        if context == "control":
            return self._control_key
        kind, _, worker_id = context.partition(":")
        if kind == "heartbeat" and worker_id in self.workers:
            return self._control_key
        return None

    async def _serve_heartbeats(self, worker_id: str, reader: asyncio.StreamReader) -> None:
        """A worker's heartbeat connection (authenticated for ``worker_id``): each
        ``heartbeat`` proves the process is alive; anything else is refused (logged)."""
        info = self.workers[worker_id]
        name = f"heartbeats of {info.id}"
        while True:
            try:
                frame = await protocol.read_frame(reader, name)
            except (EOFError, ConnectionError):
                return
            try:
                beat = messages.decode(frame, name, messages.ToCoordinator)
                if not isinstance(beat, messages.Heartbeat):
                    raise messages.UnknownMessage(name, f"expected heartbeat, got {beat.TYPE}")
            except messages.MessageError as exc:
                logger.warning("refused a message: %s", exc)
                continue
            info.last_seen = time.monotonic()

    async def _watch_heartbeats(self) -> None:
        """Declare lost (and close) workers that stopped talking, e.g. a hung process."""
        while True:
            await asyncio.sleep(min(1.0, self.heartbeat_timeout_s / 2))
            now = time.monotonic()
            for wid, conn in list(self._conns.items()):
                silent = now - conn.info.last_seen
                if silent > self.heartbeat_timeout_s:
                    conn.info.error = f"no heartbeat for {silent:.1f}s"
                    logger.warning("worker %s: %s", wid, conn.info.error)
                    conn.writer.transport.abort()

    def _worker_lost(self, info: WorkerInfo) -> None:
        if info.status != WorkerStatus.STOPPED:  # not retired on purpose (see retire_worker)
            info.status = WorkerStatus.LOST
        self._conns.pop(info.id, None)
        self._on_lost(info)
