"""A worker: one process, one asyncio event loop, any number of tasks.

Run as ``python -m runtime.worker --coordinator HOST:PORT --secret-fd N`` (or
``--secret-file PATH``). The worker:

1. reads the cluster secret from the inherited file descriptor ``N`` (a pipe its starter
   wrote it to; closed once read) or from a file only its user can read: never from its
   command line or environment, which other users and its children can see;
2. starts its data server (the address peers send records to; TLS with ``--tls-cert``,
   ``--tls-key``, mutual with ``--tls-ca``);
3. dials the coordinator, proves it holds the secret (:mod:`runtime.handshake`) and
   registers its resources (host, pid, cpus, memory, data address, and the Spark executor
   id when a Spark task started it); a refusal or a wrong secret ends the process with
   exit code 2 and the reason on stderr;
4. obeys ``deploy`` / ``start`` / ``stop`` / ``inject_barrier`` messages, and reports
   task outcomes, barrier acks and, every second, metrics (per task, plus CPU and RSS);
5. exits by itself when the control connection closes (the coordinator went away).

Workers are identical whatever started them (the local backend, Spark, a person).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import ssl
import stat
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

import psutil

from . import codeload, handshake, heap, protocol
from .channels import DataServer, InputChannel, wait_while
from .deployment import JobRuntime
from .handover import StateInbox
from .layout import Layout
from .records import Barrier, BarrierKind
from .task import BaseTask

__all__ = ["Worker", "main"]

logger = logging.getLogger(__name__)

METRICS_INTERVAL_S = 1.0  # how often tasks' metrics are reported to the coordinator
HEARTBEAT_INTERVAL_S = 1.0  # heartbeats come from a thread: a long UDF call does not stop them
REGISTER_TIMEOUT_S = 10.0  # the coordinator must answer a registration within this time
# Background work waits for the tasks to catch up with their input, but never longer
# than this per piece (so that it moves on under a steady load).
IDLE_WAIT_S = 0.05

EXIT_REFUSED = 2


class RegistrationRefused(RuntimeError):
    """The coordinator refused this worker (wrong secret, or it said why)."""


class Worker:
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

    def send(self, msg: dict[str, Any]) -> None:
        if self._writer is not None and not self._writer.is_closing():
            protocol.write_frame(self._writer, msg)

    def task_finished(self, task: BaseTask) -> None:
        job = self.jobs.get(task.job_id)  # type: ignore[attr-defined]
        if job is not None:
            job.task_ended(task)
        self.send(
            {
                "type": "task_finished",
                "job_id": task.job_id,
                "task": task.task_id,  # type: ignore[attr-defined]
                "metrics": task.snapshot_metrics(),
            }
        )

    def task_failed(self, task: BaseTask, error: str) -> None:
        self.send(
            {"type": "task_failed", "job_id": task.job_id, "task": task.task_id, "error": error}
        )  # type: ignore[attr-defined]

    def barrier_aligned(self, task: BaseTask, barrier: Barrier) -> bool:
        """Checkpoint barriers are acked; for a reconfiguration, the job says who pauses."""
        job = self.jobs.get(task.job_id)  # type: ignore[attr-defined]
        if barrier.kind is BarrierKind.RECONFIG:
            return job is not None and job.barrier_aligned(task, barrier)
        if job is not None and barrier.id == job.savepoint_id:
            job.snapshot_and_halt(task)
            return True
        self.send(
            {
                "type": "barrier_ack",
                "job_id": task.job_id,  # type: ignore[attr-defined]
                "task": task.task_id,
                "kind": barrier.kind.value,
                "id": barrier.id,
            }
        )
        return False

    def peer_failed(self, job: JobRuntime, peer: str, exc: BaseException) -> None:
        self.send(
            {
                "type": "worker_error",
                "job_id": job.job_id,
                "error": f"worker {self.worker_id}: data link to worker {peer} failed: {exc}",
            }
        )

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
            self.send(
                {
                    "type": "worker_error",
                    "job_id": job.job_id,
                    "error": f"worker {self.worker_id}: {error}",
                }
            )

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        data_host, data_port = await self.data.start(self.host, 0)
        where = f"{self.coordinator[0]}:{self.coordinator[1]}"
        try:
            reader, writer = await asyncio.open_connection(
                *self.coordinator,
                ssl=self.client_tls,
                ssl_handshake_timeout=REGISTER_TIMEOUT_S if self.client_tls else None,
            )
        except ssl.SSLError as exc:
            raise RegistrationRefused(f"TLS with the coordinator at {where} failed: {exc}") from exc
        except OSError as exc:
            raise ConnectionError(f"cannot reach the coordinator at {where}: {exc}") from exc
        try:
            await handshake.dial(
                reader, writer, handshake.control_key(self.secret), "control", REGISTER_TIMEOUT_S
            )
        except handshake.HandshakeError as exc:
            writer.close()
            raise RegistrationRefused(
                f"the coordinator at {where} did not accept this worker's proof of the cluster "
                f"secret (wrong cluster secret?): {exc}"
            ) from exc
        self._writer = writer
        self.send(
            {
                "type": "register",
                "host": self.host,
                "pid": os.getpid(),
                "cpus": self.cpus,
                "memory_mb": self.memory_mb,
                "data_host": data_host,
                "data_port": data_port,
                "name": self.name,
                "executor_id": self.executor_id,
            }
        )
        try:
            reply = await asyncio.wait_for(
                protocol.read_frame(reader, "coordinator"), REGISTER_TIMEOUT_S
            )
        except (EOFError, TimeoutError) as exc:
            raise RegistrationRefused(
                "the coordinator closed the connection without answering"
            ) from exc
        if reply.get("type") != "registered":
            raise RegistrationRefused(str(reply.get("reason", reply)))
        self.worker_id = reply["worker_id"]
        logger.info("registered as %s (data %s:%s)", self.worker_id, data_host, data_port)
        beat_stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(beat_stop,), name="heartbeat", daemon=True
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
            for job in list(self.jobs.values()):
                await job.stop()
            await self.data.close()
            writer.close()

    def _heartbeat(self, stop: threading.Event) -> None:
        """Thread: a second connection that says "alive" every second, whatever the loop does.

        The event loop may be busy in a long UDF call; the coordinator must still tell a
        slow worker from a dead or hung one (a hung process stops this thread too).
        """
        try:
            with contextlib.ExitStack() as stack:
                sock = stack.enter_context(socket.create_connection(self.coordinator, timeout=10))
                if self.client_tls is not None:
                    sock = stack.enter_context(self.client_tls.wrap_socket(sock))
                context = f"heartbeat:{self.worker_id}"
                handshake.dial_socket(sock, handshake.control_key(self.secret), context)
                beat = protocol.encode({"type": "hb"})
                while not stop.wait(HEARTBEAT_INTERVAL_S):
                    sock.sendall(beat)
        except OSError as exc:  # a HandshakeError too
            logger.info("heartbeat connection ended: %s", exc)

    async def _control_loop(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                msg = await protocol.read_frame(reader, "coordinator")
            except (EOFError, ConnectionError):
                logger.info("coordinator went away; exiting")
                return
            kind = msg.get("type")
            if kind == "deploy":
                await self._deploy(msg)
            elif kind == "start":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.start(float(msg["start_time"]))
                    self.send({"type": "started", "job_id": job.job_id})
            elif kind == "inject_barrier":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.inject(Barrier(BarrierKind(msg["kind"]), int(msg["id"])))
            elif kind == "stage":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.stage(
                        int(msg["rid"]),
                        int(msg["stage"]),
                        int(msg["barrier_id"]),
                        list(msg.get("inject", ())),
                    )
            elif kind == "stage_withdraw":
                job = self.jobs.get(msg["job_id"])
                clean = job is None or job.withdraw_stage(
                    int(msg["rid"]),
                    int(msg["stage"]),
                    int(msg["barrier_id"]),
                    list(msg.get("inject", ())),
                )
                self.send(
                    {
                        "type": "stage_withdrawn",
                        "job_id": msg["job_id"],
                        "rid": msg["rid"],
                        "stage": msg["stage"],
                        "clean": clean,
                    }
                )
            elif kind == "stages_end":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.end_stages(int(msg["rid"]), int(msg["last"]))
            elif kind == "savepoint":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.savepoint(int(msg["id"]))
            elif kind == "warm":
                self._warm(msg)
            elif kind == "prepare":
                await self._prepare(msg)
            elif kind == "update":
                job = self.jobs.get(msg["job_id"])
                if job is not None:  # before a later prepare of this job can be read
                    job.update_received(int(msg["rid"]))
                self.background(self._update(msg))
            elif kind == "abort":
                job = self.jobs.get(msg["job_id"])
                if job is not None:
                    job.abort(int(msg["rid"]))
                self.send({"type": "aborted", "job_id": msg["job_id"], "rid": msg["rid"]})
            elif kind == "stop":
                job = self.jobs.pop(msg["job_id"], None)
                final: dict[str, Any] = {}
                if job is not None:
                    # The counts since the last report, so a stopped job's totals are whole.
                    final = {
                        tid: task.snapshot_metrics()
                        for tid, task in job.tasks.items()
                        if task.status == "running"
                    }
                    await job.stop()
                self.send({"type": "stopped", "job_id": msg["job_id"], "metrics": final})
            elif kind == "shutdown":
                return
            else:
                logger.warning("ignoring unknown message %r", kind)

    def _warm(self, msg: dict[str, Any]) -> None:
        """Import a job's code before any of its tasks comes here (the coordinator sends it
        to the workers a job does not use), so that taking a task later does not wait for
        it. A failure is left to the prepare that needs the code, which reports it."""
        if msg["job_id"] in self.jobs:
            return
        try:
            codeload.install_many(msg.get("code", {}))
            pickle.loads(msg["graph"])
        except Exception:
            logger.debug("could not load the code of job %s ahead", msg["job_id"], exc_info=True)

    async def _prepare(self, msg: dict[str, Any]) -> None:
        job = self.jobs.get(msg["job_id"])
        reply = {"job_id": msg["job_id"], "rid": msg["rid"]}
        try:
            codeload.install_many(msg.get("code", {}))  # before any logic is unpickled
            if "graph" in msg:  # the coordinator places none of the job's tasks here
                if job is not None:
                    # Tasks of the job were here before; what this worker knew of the job
                    # when the last one left is stale once the job changed elsewhere.
                    if job.tasks:
                        raise RuntimeError(
                            f"tasks {sorted(job.tasks)[:10]} of job {job.job_id} run here, "
                            "but the coordinator places none here"
                        )
                    await self._drop_job(job.job_id)
                # This worker joins the job: it hosts none of its tasks yet.
                job = JobRuntime(self, {**msg, "layout": msg["current_layout"]})
                job.start_time = float(msg["start_time"])
                self.jobs[job.job_id] = job
            if job is None:
                raise RuntimeError(f"job {msg['job_id']} does not run here")
            peers = {w: (a[0], int(a[1])) for w, a in msg.get("workers", {}).items()}
            await job.prepare(
                int(msg["rid"]),
                int(msg["barrier_id"]),
                Layout.from_wire(msg["layout"]),
                set(msg["affected"]),
                peers,
                fluid=bool(msg.get("fluid", False)),
                stages=[Layout.from_wire(x) for x in msg.get("stages") or ()],
                stage_barriers=[int(b) for b in msg.get("stage_barriers") or ()],
                precopy_min_bytes=msg.get("precopy_min_bytes"),
                precopy_budget_s=float(msg.get("precopy_s", 0.0)),
                precopy_pause_s=float(msg.get("precopy_pause_s", 0.0)),
            )
        except Exception as exc:
            logger.debug("prepare failed", exc_info=True)
            self._prepare_failed(reply, exc)
            return
        copying = job.precopying(int(msg["rid"]))
        if copying is None:
            self.send({"type": "prepared", **reply})
            return
        # Replied once the state is copied ahead; the control loop goes on meanwhile (an
        # abort can come).
        self.background(self._prepared_after(copying, reply))

    async def _prepared_after(self, copying: asyncio.Task, reply: dict[str, Any]) -> None:
        try:
            copied = await copying
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("copying state ahead failed", exc_info=True)
            self._prepare_failed(reply, exc, "copying state ahead: ")
            return
        self.send({"type": "prepared", **reply, "precopy": copied})

    def _prepare_failed(self, reply: dict[str, Any], exc: BaseException, what: str = "") -> None:
        error = f"worker {self.worker_id}: {what}{type(exc).__name__}: {exc}"
        self.send({"type": "prepare_failed", **reply, "error": error})

    async def _update(self, msg: dict[str, Any]) -> None:
        job = self.jobs.get(msg["job_id"])
        reply = {"job_id": msg["job_id"], "rid": msg["rid"]}
        try:
            if job is None:
                raise RuntimeError(f"job {msg['job_id']} does not run here")
            await job.update(int(msg["rid"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("update failed", exc_info=True)
            self.send(
                {
                    "type": "update_failed",
                    **reply,
                    "error": f"worker {self.worker_id}: {type(exc).__name__}: {exc}",
                }
            )

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

    async def _drop_job(self, job_id: str) -> None:
        """Forget job ``job_id`` here, stopping what its runtime still runs or holds open."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            await job.stop()

    async def _deploy(self, msg: dict[str, Any]) -> None:
        job_id = msg["job_id"]
        try:
            codeload.install_many(msg.get("code", {}))  # before the graph is unpickled
            await self._drop_job(job_id)  # left from when tasks of the job were here
            job = JobRuntime(self, msg)
            self.jobs[job_id] = job
            await job.deploy()
        except Exception as exc:
            logger.debug("deploy of %s failed", job_id, exc_info=True)
            await self._drop_job(job_id)
            self.send(
                {
                    "type": "deploy_failed",
                    "job_id": job_id,
                    "error": f"worker {self.worker_id}: {type(exc).__name__}: {exc}",
                }
            )
            return
        self.send({"type": "deployed", "job_id": job_id, "tasks": sorted(job.tasks)})

    async def _report_metrics(self) -> None:
        proc = self._process
        proc.cpu_percent()
        while True:
            await asyncio.sleep(METRICS_INTERVAL_S)
            jobs = {
                job_id: {
                    tid: task.snapshot_metrics()
                    for tid, task in job.tasks.items()
                    if task.status in ("running", "finished")
                }
                for job_id, job in self.jobs.items()
            }
            self.send(
                {
                    "type": "metrics",
                    "worker_id": self.worker_id,
                    "time": time.time(),
                    "cpu_percent": proc.cpu_percent(),
                    "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                    "jobs": jobs,
                }
            )
            if self._writer is not None:
                with contextlib.suppress(ConnectionError):
                    await self._writer.drain()


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB, 0 or more, got {text!r}")
    return int(text)


MAX_SECRET_BYTES = 4096  # a cluster secret is a short string, not a file's worth


def read_secret(fd: int | None = None, path: str | None = None) -> str:
    """The cluster secret, from the inherited file descriptor ``fd`` (read to its end, then
    closed) or from the file ``path``, which must belong to this process's user and be
    unreadable by anyone else. One trailing newline is dropped. Raises ValueError saying
    what is wrong."""
    if fd is not None:
        try:
            with os.fdopen(fd, "rb") as pipe:
                data = pipe.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--secret-fd {fd}: cannot read it: {exc}") from exc
        where = f"--secret-fd {fd}"
    else:
        assert path is not None
        try:
            with open(path, "rb") as file:
                info = os.fstat(file.fileno())
                if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                    raise ValueError(
                        f"--secret-file {path}: it must belong to this user and be readable "
                        f"by no one else (run: chmod 600 {path})"
                    )
                data = file.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--secret-file {path}: cannot read it: {exc}") from exc
        where = f"--secret-file {path}"
    text = data.decode("utf-8", errors="surrogateescape").removesuffix("\n").removesuffix("\r")
    if not text or len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"{where}: expected the cluster secret, 1 to {MAX_SECRET_BYTES} bytes")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--coordinator", required=True, type=_parse_address, help="HOST:PORT of the coordinator"
    )
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument(
        "--secret-fd",
        type=int,
        metavar="N",
        help="read the cluster secret from inherited file descriptor N (a pipe), then close it",
    )
    secret.add_argument(
        "--secret-file",
        metavar="PATH",
        help="read the cluster secret from PATH (owned by this user, mode 600)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate: serve and dial with TLS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-ca", help="PEM CA that peers' certificates must chain to (mutual TLS)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address peers reach this worker at")
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument(
        "--reserve-mb",
        type=_non_negative,
        default=0,
        help="heap memory (MiB) faulted in at start and kept for state that comes later",
    )
    parser.add_argument("--name", default=None)
    parser.add_argument("--executor-id", default=None, help="the Spark executor hosting it")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    try:
        cluster_secret = read_secret(args.secret_fd, args.secret_file)
    except ValueError as exc:
        parser.error(str(exc))
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_ca and not args.tls_cert):
        parser.error("--tls-cert and --tls-key go together (and --tls-ca with them)")
    server_tls = client_tls = None
    if args.tls_cert is not None:
        try:
            server_tls = handshake.server_tls(args.tls_cert, args.tls_key, args.tls_ca)
            client_tls = handshake.client_tls(args.tls_cert, args.tls_key, args.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"cannot load the TLS files: {exc}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s worker %(name)s: %(message)s",
    )
    heap.reserve(args.reserve_mb)  # before the worker allocates: see runtime.heap
    worker = Worker(
        args.coordinator,
        cluster_secret,
        host=args.host,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        name=args.name,
        executor_id=args.executor_id,
        server_tls=server_tls,
        client_tls=client_tls,
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
    except RegistrationRefused as exc:
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
