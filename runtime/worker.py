"""A worker: one process, one asyncio event loop, any number of tasks.

Run as ``python -m runtime.worker --coordinator HOST:PORT --secret-fd N`` (or
``--secret-file PATH``; :mod:`runtime.worker_cli` has the flags). The worker:

1. reads the cluster secret from the inherited file descriptor ``N`` (a pipe its starter
   wrote it to; closed once read) or from a file only its user can read: never from its
   command line or environment, which other users and its children can see;
2. starts its data server (the address peers send records to; TLS with ``--tls-cert``,
   ``--tls-key``, mutual with ``--tls-ca``);
3. dials the coordinator, proves it holds the secret (:mod:`runtime.handshake`) and
   registers its resources (host, pid, cpus, memory, data address, and the Spark executor
   id when a Spark task started it; :mod:`runtime.registration`); a refusal or a wrong secret ends the process with
   exit code 2 and the reason on stderr;
4. obeys the coordinator's messages (:mod:`runtime.messages` lists them all: deploy,
   start, stop, barriers, reconfigurations), and reports task outcomes, barrier acks and,
   every second, metrics (per task, plus CPU and RSS);
5. exits by itself when the control connection closes (the coordinator went away).

Workers are identical whatever started them (the local backend, Spark, a person). Each
job here is a :class:`~runtime.jobruntime.JobRuntime`, which the worker serves as its
:class:`~runtime.jobruntime.WorkerServices`; the coordinator's requests about jobs
(deploy, prepare, update, warm, list partitions) are carried out by
:mod:`runtime.worker_jobs`, its reconfigurations by :mod:`runtime.reconfigure` and
:mod:`runtime.stages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

import psutil

from . import (
    heap,
    messages,
    protocol,
    reconfigure,
    registration,
    stages,
    worker_cli,
    worker_jobs,
)
from .channels import InputChannel, wait_while
from .checkpoints.taking import CheckpointWriter
from .dataserver import DataServer
from .handover import StateInbox
from .jobruntime import JobRuntime
from .records import Barrier, BarrierKind
from .task import BaseTask, SourceTask, TaskStatus

__all__ = ["WorkerProcess", "main"]

logger = logging.getLogger(__name__)

METRICS_INTERVAL_S = 1.0  # how often tasks' metrics are reported to the coordinator
# Background work waits for the tasks to catch up with their input, but never longer
# than this per piece (so that it moves on under a steady load).
IDLE_WAIT_S = 0.05

EXIT_REFUSED = 2


class WorkerProcess:
    """The worker process's state: its registration, data server and jobs."""

    def __init__(
        self,
        coordinator: tuple[str, int],
        secret: str,
        *,
        host: str = "127.0.0.1",
        cpus: float = 1.0,
        memory_mb: int | None = None,
        name: str | None = None,
        executor_id: str | None = None,
        server_tls: ssl.SSLContext | None = None,
        client_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.secret = secret
        self.client_tls = client_tls  # to dial the coordinator and peers' data servers
        self.host = host
        self.cpus = cpus
        self.memory_mb = memory_mb or int(psutil.virtual_memory().total / 2**20)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.executor_id = executor_id  # the Spark executor hosting this worker, if any
        self.worker_id = ""
        self.inputs: dict[str, InputChannel] = {}
        self.jobs: dict[str, JobRuntime] = {}
        pool = protocol.PayloadPool()  # state is received into it, its buffers reused once read
        # A copy ahead that comes while the tasks here have no input waiting is read at once.
        self.state = StateInbox(pool, idle=lambda: not self.behind())
        self.checkpoint_writer = CheckpointWriter()
        self.data = DataServer(
            secret,
            self.inputs,
            on_error=self.data_failed,
            on_state=self.state_arrived,
            has_job=self.jobs.__contains__,
            changing=self.changing,
            pool=pool,
            tls=server_tls,
        )
        self._background: set[asyncio.Task] = set()  # see background()
        self._dry = asyncio.Event()  # see caught_up()
        self._dry_waiters = 0
        self._writer: asyncio.StreamWriter | None = None
        self._process = psutil.Process()

    # -- messages to the coordinator -------------------------------------------------------

    def behind(self) -> bool:
        """True while a running task here has input waiting for it."""
        return any(job.behind() for job in self.jobs.values())

    async def caught_up(self, most_s: float = IDLE_WAIT_S) -> None:
        """Wait until no running task here has input waiting (each has caught up with its
        records), but at most ``most_s``: work in the background (state copied ahead, sent
        or received) goes at idle priority and still moves on under a steady load. The
        task that runs dry last wakes the waiters (:meth:`task_ran_dry`): idle moments
        between batches last a millisecond or two, and polling for them missed most."""
        self._dry_waiters += 1
        try:
            await wait_while(self.behind, self._dry, most_s)
        finally:
            self._dry_waiters -= 1

    def task_ran_dry(self) -> None:
        """A task here has processed all its input (:attr:`InputGate.on_dry`)."""
        if self._dry_waiters and not self.behind():
            self._dry.set()

    def send(self, msg: messages.ToCoordinator) -> None:
        """Queue ``msg`` for the coordinator (dropped before registration and once the
        connection is closing): every message of this worker goes through here."""
        if self._writer is not None and not self._writer.is_closing():
            protocol.write_frame(self._writer, messages.encode(msg))

    def register_input(self, channel: InputChannel) -> None:
        """Route the frames of ``channel.key`` that peers send here to ``channel``."""
        self.inputs[channel.key] = channel

    def unregister_input(self, channel: InputChannel) -> None:
        """Stop routing frames to ``channel``, unless another channel of its key (of a
        runtime of the job made since) has replaced it."""
        if self.inputs.get(channel.key) is channel:
            del self.inputs[channel.key]

    def task_finished(self, task: BaseTask) -> None:
        job = self.jobs.get(task.job_id)  # type: ignore[attr-defined]
        if job is not None:
            stages.task_ended(job, task)
        self.send(messages.TaskFinished(task.job_id, task.task_id, task.snapshot_metrics()))  # type: ignore[attr-defined]

    def task_failed(self, task: BaseTask, error: str) -> None:
        self.send(messages.TaskFailed(task.job_id, task.task_id, error))  # type: ignore[attr-defined]

    def barrier_aligned(self, task: BaseTask, barrier: Barrier) -> bool:
        """For a reconfiguration, the job says who pauses; a checkpoint barrier of a job
        that takes checkpoints is its tasks' cue to take their parts; a savepoint's
        snapshots a task and halts it; any other barrier is acked."""
        job = self.jobs.get(task.job_id)  # type: ignore[attr-defined]
        if barrier.kind is BarrierKind.RECONFIG:
            return job is not None and reconfigure.barrier_aligned(job, task, barrier)
        if job is not None and barrier.id == job.savepoint_id:
            job.snapshot_and_halt(task)
            return True
        if job is not None and job.checkpoints is not None:
            job.take_checkpoint(task, barrier.id)
            return False
        self.send(messages.BarrierAck(task.job_id, task.task_id, barrier.kind, barrier.id))  # type: ignore[attr-defined]
        return False

    def peer_failed(self, job: JobRuntime, peer: str, exc: BaseException) -> None:
        error = f"worker {self.worker_id}: data link to worker {peer} failed: {exc}"
        self.send(messages.WorkerError(job.job_id, error))

    def changing(self, rids: set[int]) -> set[str]:
        """The jobs here whose pending reconfiguration is one of ``rids``."""
        return {
            job.job_id
            for job in self.jobs.values()
            if job.pending is not None and job.pending.rid in rids
        }

    def state_arrived(
        self,
        job_id: str,
        frame: tuple,
        chunk: bytearray | memoryview,
        on_read: Any,
    ) -> None:
        """A chunk of state that came on a data connection of job ``job_id``: it goes to
        that job's tasks (see :func:`protocol.state_owner`), whatever task it names."""
        tag, rid, task, *rest = frame
        owner = protocol.state_owner(job_id, str(task))
        self.state.put_frame((tag, rid, owner, *rest), chunk, on_read)

    def data_failed(self, error: str, job_ids: set[str]) -> None:
        """A data connection broke the protocol: its job fails with the cause."""
        for job in self.jobs.values():
            if job.job_id not in job_ids:
                continue
            self.send(messages.WorkerError(job.job_id, f"worker {self.worker_id}: {error}"))

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Register with the coordinator, then obey it until it goes away or says
        ``shutdown``; everything the worker runs stops on the way out. Raises
        :class:`~runtime.registration.RegistrationRefused` or ``ConnectionError`` when
        it cannot register."""
        data_host, data_port = await self.data.start(self.host, 0)
        resources = messages.Register(
            host=self.host,
            pid=os.getpid(),
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            data_host=data_host,
            data_port=data_port,
            name=self.name,
            executor_id=self.executor_id,
        )
        reader, writer, self.worker_id = await registration.register(
            self.coordinator, self.secret, self.client_tls, resources
        )
        self._writer = writer
        logger.info("registered as %s (data %s:%s)", self.worker_id, data_host, data_port)
        beat_stop = threading.Event()
        beat = threading.Thread(
            target=registration.heartbeat,
            args=(self.coordinator, self.secret, self.client_tls, self.worker_id, beat_stop),
            name="heartbeat",
            daemon=True,
        )
        beat.start()
        reporter = asyncio.create_task(self._report_metrics())
        reader_of_copies = asyncio.create_task(self.state.read_copies(self.caught_up))
        try:
            await self._control_loop(reader)
        finally:
            beat_stop.set()
            reporter.cancel()
            reader_of_copies.cancel()
            for t in list(self._background):
                t.cancel()
            try:
                for job in list(self.jobs.values()):
                    await job.stop()
            finally:  # even if a second signal cuts the stop short
                self.checkpoint_writer.close()  # its local copies go before the process exits
                await self.data.close()
                writer.close()

    async def _control_loop(self, reader: asyncio.StreamReader) -> None:
        """Obey the coordinator's messages, in order, until it says ``shutdown`` or goes
        away. A message that does not decode is logged and dropped."""
        while True:
            try:
                frame = await protocol.read_frame(reader, "coordinator")
            except (EOFError, ConnectionError):
                logger.info("coordinator went away; exiting")
                return
            try:
                msg = messages.decode(frame, "coordinator", messages.ToWorker)
            except messages.MessageError as exc:
                logger.warning("refused a message: %s", exc)
                continue
            match msg:
                case messages.Deploy():
                    await worker_jobs.deploy(self, msg)
                case messages.Start(job_id=job_id, start_time=start_time):
                    if (job := self.jobs.get(job_id)) is not None:
                        job.start(start_time)
                case messages.InjectBarrier(job_id=job_id, kind=kind, barrier_id=barrier_id):
                    if (job := self.jobs.get(job_id)) is not None:
                        job.inject(Barrier(kind, barrier_id))
                case messages.StageStart(job_id, rid, stage, barrier_id, inject):
                    if (job := self.jobs.get(job_id)) is not None:
                        stages.start(job, rid, stage, barrier_id, list(inject))
                case messages.StageWithdraw(job_id, rid, stage, barrier_id, inject):
                    job = self.jobs.get(job_id)
                    clean = job is None or stages.withdraw(
                        job, rid, stage, barrier_id, list(inject)
                    )
                    self.send(messages.StageWithdrawn(job_id, rid, stage, clean))
                case messages.StagesEnd(job_id=job_id, rid=rid, last=last):
                    if (job := self.jobs.get(job_id)) is not None:
                        stages.end(job, rid, last)
                case messages.AbandonCheckpoint(job_id=job_id, checkpoint_id=checkpoint_id):
                    if (job := self.jobs.get(job_id)) is not None:
                        job.abort_barrier(checkpoint_id)
                case messages.CommitCheckpoint(job_id=job_id, checkpoint_id=checkpoint_id):
                    if (job := self.jobs.get(job_id)) is not None:
                        job.commit_checkpoint(checkpoint_id)
                case messages.Savepoint(job_id=job_id, barrier_id=barrier_id):
                    if (job := self.jobs.get(job_id)) is not None:
                        job.savepoint(barrier_id)
                case messages.Warm():
                    worker_jobs.warm(self, msg)
                case messages.ListPartitions():
                    self.background(worker_jobs.list_partitions(self, msg))
                case messages.EndInput(job_id=job_id, task=tid):
                    task = self.jobs[job_id].tasks.get(tid) if job_id in self.jobs else None
                    if isinstance(task, SourceTask):
                        task.end_input()
                case messages.Prepare():
                    await worker_jobs.prepare(self, msg)
                case messages.Update(job_id=job_id, rid=rid):
                    if (job := self.jobs.get(job_id)) is not None:
                        # Before a later prepare of this job is read.
                        reconfigure.update_received(job, rid)
                    self.background(worker_jobs.update(self, msg))
                case messages.Abort(job_id=job_id, rid=rid):
                    if (job := self.jobs.get(job_id)) is not None:
                        reconfigure.abort(job, rid)
                case messages.Stop(job_id=job_id):
                    final: dict[str, dict[str, Any]] = {}
                    if (job := self.jobs.pop(job_id, None)) is not None:
                        # The counts since the last report, so a stopped job's totals are whole.
                        final = {
                            tid: task.snapshot_metrics()
                            for tid, task in job.tasks.items()
                            if task.status == TaskStatus.RUNNING
                        }
                        await job.stop()
                    self.send(messages.Stopped(job_id, final))
                case messages.Shutdown():
                    return
                case messages.Registered() | messages.Refused():
                    logger.warning("coordinator: unexpected %s message, dropped", msg.TYPE)

    def background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` beside the control loop; it is cancelled if the worker shuts down."""
        t = asyncio.create_task(work)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    def forget(self, job: JobRuntime) -> None:
        """None of ``job``'s tasks is left here after a change: drop the job and let go of
        what it still holds. The coordinator sends the job again with a later change that
        places tasks here."""
        if self.jobs.get(job.job_id) is job:
            del self.jobs[job.job_id]
            self.background(job.stop())

    async def _report_metrics(self) -> None:
        proc = self._process
        proc.cpu_percent()
        while True:
            await asyncio.sleep(METRICS_INTERVAL_S)
            for job in list(self.jobs.values()):
                job.discover_partitions()
            jobs = {
                job_id: {
                    tid: task.snapshot_metrics()
                    for tid, task in job.tasks.items()
                    if task.status in (TaskStatus.RUNNING, TaskStatus.FINISHED)
                }
                for job_id, job in self.jobs.items()
            }
            self.send(
                messages.Metrics(
                    worker_id=self.worker_id,
                    time=time.time(),
                    cpu_percent=proc.cpu_percent(),
                    rss_mb=round(proc.memory_info().rss / 2**20, 1),
                    jobs=jobs,
                )
            )
            if self._writer is not None:
                with contextlib.suppress(ConnectionError):
                    await self._writer.drain()


def main(argv: list[str] | None = None) -> int:
    """Run a worker with the flags of ``argv`` (see :mod:`runtime.worker_cli`) until the
    coordinator goes away or a signal stops it; the process's exit code."""
    options = worker_cli.parse(argv, __doc__.splitlines()[0])
    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s worker %(name)s: %(message)s",
    )
    heap.reserve(options.reserve_mb)  # before the worker allocates: see runtime.heap
    worker = WorkerProcess(
        options.coordinator,
        options.secret,
        host=options.host,
        cpus=options.cpus,
        memory_mb=options.memory_mb,
        name=options.name,
        executor_id=options.executor_id,
        server_tls=options.server_tls,
        client_tls=options.client_tls,
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    else:
        runner = uvloop.run

    async def _main() -> None:
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, main_task.cancel)  # type: ignore[union-attr]
        await worker.run()

    try:
        runner(_main())
    except registration.RegistrationRefused as exc:
        print(f"worker refused by the coordinator: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ConnectionError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 1
    except (asyncio.CancelledError, KeyboardInterrupt):
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
