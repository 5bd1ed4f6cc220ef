"""The coordinator: worker registrations, job deployment, outcomes, barriers, metrics.

It runs on the control plane's asyncio loop, listens for workers on a TCP port and speaks
the protocol of :mod:`runtime.messages` (framed by :mod:`runtime.protocol`). Deployment of a job:

1. Place the tasks (:meth:`runtime.layout.Layout.initial`).
2. Send ``deploy`` to every worker hosting a task; each creates its tasks and channels.
3. Wait for every ``deployed`` (``DEPLOY_TIMEOUT_S``); any ``deploy_failed`` fails the job
   and stops it everywhere.
4. Send ``start`` with a common start time; the job is ``running``.

A job is ``finished`` when every task has reported it finished (bounded sources exhausted
and every record processed), ``failed`` (with the cause) when a task raises, a data link
breaks or a worker hosting a task dies, and ``stopped`` when asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import pickle
import ssl
import time
from typing import Any

from controlplane.abstraction import Resolver, resolve_importable
from controlplane.backends import BackendError
from runtime import codeload, handshake, messages, protocol
from runtime.dataflow import JobGraph
from runtime.layout import Layout
from runtime.records import BarrierKind

from .model import CoordinatorError, Job, RuntimeConfig, WorkerInfo
from .plans import abstraction_of, apply, cancel
from .reconfig import reconfigure
from .restart import restart_with

__all__ = ["Coordinator", "CoordinatorError", "Job", "RuntimeConfig", "WorkerInfo"]

logger = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 30.0  # workers import the job's modules and open channels within this
REGISTER_READ_TIMEOUT_S = 5.0  # a worker that proved itself says who it is within this
BARRIER_TIMEOUT_S = 30.0  # every task acks an injected barrier within this
STOP_TIMEOUT_S = 5.0  # workers send their last counts of a stopped job within this
HEARTBEAT_TIMEOUT_S = 10.0  # a worker silent this long (metrics come every second) is lost


class _WorkerConn:
    def __init__(self, info: WorkerInfo, writer: asyncio.StreamWriter) -> None:
        self.info = info
        self.writer = writer

    def send(self, msg: messages.ToWorker) -> None:
        """Queue ``msg`` for this worker (dropped once the connection is closing)."""
        if not self.writer.is_closing():
            protocol.write_frame(self.writer, messages.encode(msg))


class Coordinator:
    """Accepts workers, deploys jobs and follows them. Start with :meth:`start`."""

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        config: RuntimeConfig | None = None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        resolve_logic: Resolver = resolve_importable,
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
        self.config = config or RuntimeConfig()
        self.workers: dict[str, WorkerInfo] = {}
        self.jobs: dict[str, Job] = {}
        self._conns: dict[str, _WorkerConn] = {}
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._job_ids = itertools.count(1)
        self._barrier_ids = itertools.count(1)
        self._registered = asyncio.Condition()
        self._readers: set[asyncio.Task] = set()
        self.backend: Any = None  # a WorkerBackend, to start workers a plan asks for
        # What a logic ref in a plan may name (raises BadLogic otherwise); the server's
        # accepts registered code only, a program running its own coordinator anything.
        self.resolve_logic = resolve_logic
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._monitor: asyncio.Task | None = None

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
        """Stop running jobs, tell workers to exit, close every connection."""
        for job in list(self.jobs.values()):
            if not job.done:
                await self.stop_job(job.id)
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

    def alive_workers(self) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.status == "alive"]

    async def wait_for_workers(self, n: int, timeout: float = 30.0) -> list[WorkerInfo]:
        """Wait until at least ``n`` workers are alive; CoordinatorError after ``timeout``."""

        async def enough() -> None:
            async with self._registered:
                await self._registered.wait_for(lambda: len(self.alive_workers()) >= n)

        try:
            await asyncio.wait_for(enough(), timeout)
        except TimeoutError:
            raise CoordinatorError(
                f"only {len(self.alive_workers())} of {n} workers registered within {timeout:.0f}s"
            ) from None
        return self.alive_workers()

    # -- jobs ---------------------------------------------------------------------------------

    async def submit(
        self, graph: JobGraph, workers: list[str] | None = None, *, job_id: str | None = None
    ) -> Job:
        """Deploy and start ``graph``; returns the running job (or a failed one, with cause).

        ``job_id`` lets the caller (the StreamManager) name the job; it must be new.
        """
        if job_id is not None and job_id in self.jobs:
            raise CoordinatorError(f"job id {job_id!r} is taken")
        ids = workers or [w.id for w in self.alive_workers()]
        if not ids:
            raise CoordinatorError("no workers are registered: start some before submitting a job")
        layout = Layout.initial(graph, ids)
        job = Job(job_id or f"job-{next(self._job_ids)}", graph, layout)
        self.jobs[job.id] = job
        error = await self._deploy(job, layout)
        if error:
            await self._fail(job, error)
            return job
        if job.done:
            return job
        backend = self.backend.name if self.backend is not None else "local"
        job.abstraction = abstraction_of(job, self.alive_workers(), backend)
        job.versions.append(job.abstraction)
        # Step 4. Start with a common clock origin.
        job.started_at = time.time()
        job.status = "running"
        self._start(job)
        logger.info("job %s running on %s", job.id, ", ".join(layout.workers_used()))
        return job

    async def _deploy(
        self, job: Job, layout: Layout, restore: dict[str, messages.Restore] | None = None
    ) -> str | None:
        """Steps 2-3: deploy ``layout`` on its workers; returns an error, or None when deployed.

        ``restore`` (task -> its key groups' state and source position) seeds tasks with
        state, for a restart from a snapshot.
        """
        used = layout.workers_used()
        missing = [w for w in used if w not in self._conns]
        if missing:
            return f"workers {missing} are not connected"
        graph = pickle.dumps(job.graph)
        base = messages.Deploy(
            job_id=job.id,
            graph=graph,
            code=codeload.sources_for([graph, *layout.logic.values()]),
            layout=layout,
            workers=self.data_addresses(),
            config=self.channel_config(),
        )
        loop = asyncio.get_running_loop()
        job._deploy_replies = {}
        # Step 2. Deploy everywhere.
        for wid in used:
            job._deploy_replies[wid] = loop.create_future()
            msg = base
            if restore:
                mine = {t: r for t, r in restore.items() if layout.placement.get(t) == wid}
                msg = dataclasses.replace(base, restore=mine)
            self._conns[wid].send(msg)
        # Step 3. Wait for every worker's answer.
        try:
            replies = await asyncio.wait_for(
                asyncio.gather(*job._deploy_replies.values()), DEPLOY_TIMEOUT_S
            )
        except TimeoutError:
            return f"deploy timed out after {DEPLOY_TIMEOUT_S:.0f}s"
        errors = [r for r in replies if r]
        return "; ".join(errors) if errors else None

    def _start(self, job: Job) -> None:
        for wid in job.layout.workers_used():
            self._send(wid, messages.Start(job.id, job.started_at))
        self._warm(job, [w.id for w in self.alive_workers()])

    def _warm(self, job: Job, workers: list[str]) -> None:
        """Send the job's code to those of ``workers`` that host none of its tasks: each
        imports it at once, so that a task moved there later (a migration to a spare, a
        scale out) does not wait for the imports in the prepare (tens of milliseconds on a
        fresh worker, against a few for the rest of a prepare)."""
        used = set(job.layout.workers_used())
        idle = [w for w in workers if w not in used and w in self._conns]
        if not idle:
            return
        graph = pickle.dumps(job.graph)
        msg = messages.Warm(
            job.id, graph, codeload.sources_for([graph, *job.layout.logic.values()])
        )
        for wid in idle:
            self._conns[wid].send(msg)

    async def restart_with(self, job_id: str, layout: Layout) -> Any:
        """The stop-and-restart baseline (see :mod:`.restart`); returns the record."""
        return await restart_with(self, self._job(job_id), layout)

    async def stop_job(self, job_id: str) -> Job:
        """Stop the job everywhere; waits (at most ``STOP_TIMEOUT_S``) for the workers' last
        counts, so the job's totals include what its tasks did since their last report."""
        job = self._job(job_id)
        if job._end("stopped"):
            loop = asyncio.get_running_loop()
            job._stop_replies = {
                wid: loop.create_future() for wid in job.layout.workers_used() if wid in self._conns
            }
            self._stop_everywhere(job)
            if job._stop_replies:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*job._stop_replies.values()), STOP_TIMEOUT_S
                    )
        return job

    async def inject_barrier(
        self,
        job_id: str,
        kind: BarrierKind = BarrierKind.CHECKPOINT,
        timeout: float = BARRIER_TIMEOUT_S,
    ) -> int:
        """Inject a barrier at the sources and wait until every task has aligned it."""
        job = self._job(job_id)
        if job.status != "running":
            raise CoordinatorError(f"job {job_id} is {job.status}, not running")
        bid = self._next_barrier_id()
        fut = asyncio.get_running_loop().create_future()
        pending = set(job.graph.task_ids()) - job.finished_tasks
        job._barrier_waits[bid] = (pending, fut)
        for wid in job.layout.workers_used():
            self._conns[wid].send(messages.InjectBarrier(job_id, kind, bid))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            left = sorted(job._barrier_waits.get(bid, (set(), None))[0])
            raise CoordinatorError(
                f"barrier {bid} not acked within {timeout:.0f}s by {left[:10]}"
            ) from None
        finally:
            job._barrier_waits.pop(bid, None)
        return bid

    async def reconfigure(
        self,
        job_id: str,
        layout: Layout,
        *,
        wait: bool = True,
        sync_timeout_s: float | None = None,
        plan: Any = None,
    ) -> Any:
        """Change the running job to ``layout`` live (see :mod:`.reconfig`); returns the record."""
        return await reconfigure(
            self, self._job(job_id), layout, wait=wait, plan=plan, sync_timeout_s=sync_timeout_s
        )

    async def apply_plan(
        self,
        job_id: str,
        plan: Any,
        *,
        wait: bool = True,
        sync_timeout_s: float | None = None,
        restart: bool = False,
        new_workers: bool = False,
        on_change: Any = None,
        cancellation: Any = None,
    ) -> Any:
        """Validate ``plan`` (a :class:`controlplane.abstraction.Plan`) and carry it out live
        (or, with ``restart``, by the stop-and-restart baseline, on new worker processes
        with ``new_workers``); see :func:`.plans.apply`."""
        return await apply(
            self,
            self._job(job_id),
            plan,
            wait=wait,
            sync_timeout_s=sync_timeout_s,
            restart=restart,
            new_workers=new_workers,
            on_change=on_change,
            cancellation=cancellation,
        )

    def cancel_plan(self, job_id: str, reason: str = "cancelled on request") -> Any:
        """Cancel the plan under way on ``job_id`` at its next safe point; returns its
        record (see :func:`.plans.cancel`; :class:`ReconfigurationError` when it cannot be)."""
        return cancel(self._job(job_id), reason)

    def _next_barrier_id(self) -> int:
        return next(self._barrier_ids)

    def data_addresses(self) -> dict[str, tuple[str, int]]:
        """Every alive worker's data address, as workers are told it."""
        return {w.id: (w.data_host, w.data_port) for w in self.alive_workers()}

    def channel_config(self) -> messages.ChannelConfig:
        """How the workers' channels batch and buffer, as they are told it."""
        return messages.ChannelConfig(
            self.config.batch_size, self.config.linger_s, self.config.credits
        )

    def _send(self, worker_id: str, msg: messages.ToWorker) -> None:
        """Send ``msg`` to worker ``worker_id``; nothing if it is not connected."""
        conn = self._conns.get(worker_id)
        if conn is not None:
            conn.send(msg)

    def _job(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise CoordinatorError(f"no job {job_id!r}") from None

    async def _fail(self, job: Job, error: str) -> None:
        if job._end("failed", error):
            logger.warning("job %s failed: %s", job.id, error)
            self._stop_everywhere(job)

    def _stop_everywhere(self, job: Job) -> None:
        """Tell every worker to stop ``job``: also those its tasks are leaving in a change
        under way (a worker forgets a job once none of its tasks is left there)."""
        for conn in list(self._conns.values()):
            conn.send(messages.Stop(job.id))

    # -- worker connections ---------------------------------------------------------------------

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
            for job in self.jobs.values():
                if job.status == "running":
                    self._warm(job, [info.id])
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
                self._handle(info, msg)
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
        if info is None or info.status != "alive":
            return
        info.status, info.error = "stopped", reason
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
        before = _lost_message(info, info.error)
        info.error = reason
        for job in self.jobs.values():
            if job.error == before:
                job.error = _lost_message(info, reason)

    def _worker_lost(self, info: WorkerInfo) -> None:
        if info.status != "stopped":  # not retired on purpose (see retire_worker)
            info.status = "lost"
        self._conns.pop(info.id, None)
        for job in self.jobs.values():  # a stop waiting for this worker's last counts
            fut = job._stop_replies.get(info.id)
            if fut is not None and not fut.done():
                fut.set_result(None)
        for job in self.jobs.values():
            rec = job.active
            if rec is not None and info.id in rec.workers():  # e.g. a migration's target
                rec.on_failed(_lost_message(info, info.error))
            if job.done or info.id not in job.layout.workers_used():
                continue
            msg = _lost_message(info, info.error)
            if job.status == "starting":
                fut = job._deploy_replies.get(info.id)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                    continue
            if job._end("failed", msg):
                logger.warning("job %s failed: %s", job.id, msg)
                self._stop_everywhere(job)

    def _handle(self, info: WorkerInfo, msg: messages.ToCoordinator) -> None:
        """React to ``msg`` from worker ``info`` (decoded: see :mod:`runtime.messages`)."""
        match msg:
            case messages.Metrics():
                self._took_metrics(info, msg)
                return
            case messages.Register() | messages.Heartbeat():
                logger.warning("worker %s: unexpected %s message, dropped", info.id, msg.TYPE)
                return
        job = self.jobs.get(msg.job_id)  # type: ignore[attr-defined]
        if job is None:
            return
        match msg:
            case messages.Deployed() | messages.DeployFailed():
                fut = job._deploy_replies.get(info.id)
                if fut is not None and not fut.done():
                    fut.set_result(msg.error if isinstance(msg, messages.DeployFailed) else None)
            case messages.TaskFinished(task=task, metrics=metrics):
                job.metrics.add(time.time(), task, metrics)
                job.finished_tasks.add(task)
                active = job.active
                if active is not None:
                    active.on_task_finished(task)
                self._check_barriers(job, task, None)
                if len(job.finished_tasks) == len(job.layout.placement) and job._end("finished"):
                    logger.info("job %s finished", job.id)
                    self._stop_everywhere(job)
            case messages.TaskFailed(task=task, error=error):
                job.failed_tasks[task] = error
                active = job.active
                if active is not None:  # a reconfiguration under way ends with the task's error
                    active.on_failed(error)
                if job._end("failed", error):
                    logger.warning("job %s failed: %s", job.id, error)
                    self._stop_everywhere(job)
            case messages.WorkerError(error=error):
                if job._end("failed", error):
                    self._stop_everywhere(job)
            case messages.Stopped(metrics=metrics):
                for task, snap in metrics.items():
                    job.metrics.add(time.time(), task, snap)
                fut = job._stop_replies.get(info.id)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            case messages.Snapshot(task=task, metrics=metrics):
                job.metrics.add(time.time(), task, metrics)
                snap = job._snapshot
                if snap is not None:
                    snap.add(msg)
            case messages.BarrierAck(task=task, barrier_id=bid):
                self._check_barriers(job, task, bid)
            case (
                messages.Prepared()
                | messages.PrepareFailed()
                | messages.Paused()
                | messages.Updated()
                | messages.UpdateFailed()
                | messages.StageDone()
                | messages.StageWithdrawn()
            ):
                self._reconfiguration_reply(job, info, msg)

    def _took_metrics(self, info: WorkerInfo, msg: messages.Metrics) -> None:
        info.cpu_percent = msg.cpu_percent
        info.rss_mb = msg.rss_mb
        for job in self.jobs.values():
            if info.id in job.layout.workers_used():
                job.metrics.add_worker(info.id, info.cpu_percent, info.rss_mb)
        for job_id, tasks in msg.jobs.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            for task, snap in tasks.items():
                job.metrics.add(msg.time, task, snap)

    def _reconfiguration_reply(
        self, job: Job, info: WorkerInfo, msg: messages.ToCoordinator
    ) -> None:
        """A worker's reply in the reconfiguration under way; one of an earlier (ended)
        reconfiguration is dropped."""
        rec = job.active
        if rec is None or rec.id != msg.rid:  # type: ignore[attr-defined]
            return
        match msg:
            case messages.Prepared(precopy=precopy):
                rec.on_prepared(info.id, None, precopy)
            case messages.PrepareFailed(error=error):
                rec.on_prepared(info.id, error)
            case messages.Paused(task=task):
                rec.on_paused(task)
            case messages.StageDone(stage=stage):
                rec.on_stage_done(info.id, stage)
            case messages.StageWithdrawn(clean=clean):
                rec.on_stage_withdrawn(info.id, clean)
            case messages.Updated(
                task=task, pause_ms=pause_ms, update_ms=update_ms, metrics=metrics
            ):
                if metrics is not None:
                    job.metrics.add(time.time(), task, metrics)
                rec.on_updated(info.id, task, pause_ms, update_ms)
            case messages.UpdateFailed(error=error):
                rec.on_failed(error)

    def _check_barriers(self, job: Job, task: str, bid: int | None) -> None:
        for b, (pending, fut) in job._barrier_waits.items():
            if bid is None or b == bid:
                pending.discard(task)
                if not pending and not fut.done():
                    fut.set_result(b)

    async def drain(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(ConnectionError):
                await conn.writer.drain()


def _lost_message(info: WorkerInfo, cause: str | None) -> str:
    """A job's error when ``info``'s worker, hosting some of its tasks, was lost."""
    cause = cause or "control connection lost"
    return f"worker {info.id} (pid {info.pid} on {info.host}) died: {cause}"
