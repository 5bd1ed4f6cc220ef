"""The spark backend: each worker runs inside one long-running task of its own Spark job.

The control plane is the Spark driver. Starting a worker submits a one-partition job in its
own job group (``sc.setJobGroup(..., interruptOnCancel=True)``, from one thread per worker);
its task starts ``python -m runtime.worker`` as a child of Spark's Python worker, with the
coordinator's address, the executor's address and its executor id, and waits for it. The
cluster secret travels inside the task's function (a closure, as Spark ships it to the
executor) and reaches the worker through a pipe it inherits (``--secret-fd``), never a
command line or an environment. So Spark's cluster manager (standalone, YARN, Kubernetes, or ``local[N]``)
finds the cores: one task slot per worker (``spark.task.cpus`` each).

Lifecycle of one worker:

1. :meth:`SparkBackend.start_workers` submits the job and waits until the worker has
   registered with the coordinator under its name (``REGISTER_TIMEOUT_S``); a job that fails
   first (no Python, the worker cannot dial back) or never gets a core raises
   :class:`BackendError` with Spark's reason, and its job group is cancelled.
2. While it runs, the job's thread blocks in ``collect()``. If the job ends unasked
   (executor lost, task killed, the worker process died), the worker is reported lost to
   the coordinator with Spark's reason (:meth:`Coordinator.worker_failed`) at once.
3. :meth:`SparkBackend.stop_worker` asks the worker to exit through the coordinator, waits
   ``STOP_GRACE_S`` for its job to end, then cancels its job group; Spark then kills its
   Python worker, and the worker process, which dies with its parent, goes with it.
   Stopping returns once the job has ended and the coordinator has seen the worker go.

Spark never retries a worker's task (a retried attempt refuses to start): the control plane
replaces lost workers itself. The worker process dies with its parent, Spark's Python worker
(``PR_SET_PDEATHSIG``), which Spark kills when it cancels the task or shuts down. It runs
in its own session, like a local worker, so it gets the same share of the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .base import BackendError, WorkerBackend, WorkerRegistry
from .local import die_with_parent, secret_pipe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkBackend", "session_running", "spark_reason", "spark_session"]

logger = logging.getLogger(__name__)

SESSION_START_TIMEOUT_S = 90.0  # the JVM starts and the SparkContext is up within this
MASTER_CONNECT_TIMEOUT_S = 5.0  # a spark:// or k8s:// master accepts a TCP connection within this
REGISTER_TIMEOUT_S = 60.0  # a worker's task gets a core, starts the worker, which registers
STOP_GRACE_S = 5.0  # a worker asked to exit ends its Spark job within this, or it is cancelled
CANCEL_TIMEOUT_S = 15.0  # a cancelled job ends, and Spark kills its Python worker, within this
POLL_S = 0.05  # registrations and losses are noticed within this
REASON_CHARS = 600  # the longest Spark reason passed on (Spark's messages carry stack traces)

# Defaults under the user's spark_conf: a worker's task holds its Python worker for its
# whole life, so reusing Python workers gains nothing and leaves idle processes behind.
DEFAULT_CONF = {
    "spark.python.worker.reuse": "false",
    # A failed worker task is a lost worker, reported with its first reason: no retries.
    "spark.task.maxFailures": "1",
    "spark.app.name": "streampilot",
    "spark.ui.showConsoleProgress": "false",  # the control plane's output is its log
}


def spark_session(master: str, conf: Mapping[str, str] | None = None) -> SparkSession:
    """The SparkSession of this process: the one already running, as it is, or a new one
    with ``master`` and ``conf`` over :data:`DEFAULT_CONF`. Blocking; at most
    ``SESSION_START_TIMEOUT_S``. Raises :class:`BackendError` when pyspark is not installed,
    the master URL is malformed or its master cannot be reached."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise BackendError(
            "the spark backend needs pyspark: pip install 'streampilot[spark]'"
        ) from None
    _probe_master(master)
    if session_running():  # one SparkContext per process
        return SparkSession.builder.getOrCreate()  # no options: nothing is reconfigured
    options = {**DEFAULT_CONF, **(conf or {})}
    if master.startswith("local"):  # executors are this process's JVM: use this Python
        options.setdefault("spark.pyspark.python", sys.executable)
    outcome: list[Any] = []

    def build() -> None:
        try:
            builder = SparkSession.builder.master(master)
            for key, value in options.items():
                builder = builder.config(key, value)
            outcome.append(builder.getOrCreate())
        except BaseException as exc:
            outcome.append(exc)

    starter = threading.Thread(target=build, name="spark-session", daemon=True)
    starter.start()
    starter.join(SESSION_START_TIMEOUT_S)
    if not outcome:
        raise BackendError(
            f"Spark did not start within {SESSION_START_TIMEOUT_S:.0f}s with master {master!r}"
        )
    if isinstance(outcome[0], BaseException):
        raise BackendError(
            f"cannot start Spark with master {master!r}: {spark_reason(outcome[0])}"
        ) from outcome[0]
    session = outcome[0]
    if "spark.pyspark.python" in options:
        # PySpark's driver takes the executors' Python from PYSPARK_PYTHON only; the
        # setting says which Python runs the tasks (and so the workers).
        session.sparkContext.pythonExec = options["spark.pyspark.python"]
    return session


def session_running() -> bool:
    """Whether this process already runs a SparkContext (:func:`spark_session` returns it)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None  # no public way to ask


def _probe_master(master: str) -> None:
    """Fail fast for a ``spark://`` (any of its hosts) or ``k8s://`` master that does not
    accept connections: Spark itself would retry for a minute, then leave jobs hanging."""
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
    elif master.startswith("k8s://"):
        url = master[len("k8s://") :]
        hosts = [re.sub(r"^[a-z]+://", "", url).split("/")[0]]
        if ":" not in hosts[0]:
            hosts = [f"{hosts[0]}:{80 if url.startswith('http://') else 443}"]
    else:
        return
    errors = []
    for hostport in hosts:
        host, _, port = hostport.rpartition(":")
        if not port.isdigit():
            raise BackendError(f"Spark master {master!r}: expected HOST:PORT, got {hostport!r}")
        try:
            with socket.create_connection((host, int(port)), MASTER_CONNECT_TIMEOUT_S):
                return
        except OSError as exc:
            errors.append(f"{hostport}: {exc}")
    raise BackendError(
        f"the Spark master {master} cannot be reached within "
        f"{MASTER_CONNECT_TIMEOUT_S:.0f}s ({'; '.join(errors)})"
    )


def spark_reason(exc: BaseException) -> str:
    """A short reason from a Spark exception: the cause Spark names (the task's own error,
    an executor lost, a cancellation), without the JVM stack traces."""
    text = str(exc)
    patterns = (
        r"(ExecutorLostFailure[^\n]*)",
        r"(Python worker exited unexpectedly[^\n]*)",
        r"(?:RuntimeError|OSError): (.+)",
        r"Job aborted due to stage failure: ([^\n]*)",
        r"((?:Job|Stage) \d+ cancelled[^\n]*)",
        r"(?:Exception|Error): ([^\n]+)",
    )
    for pattern in patterns:
        found = re.search(pattern, text)
        if found:
            reason = found.group(1).split(" Consider setting ")[0]  # Spark's advice on tracing
            return reason.strip()[:REASON_CHARS]
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first[:REASON_CHARS]


@dataclass
class _Handle:
    """One worker's Spark job, as the driver follows it."""

    name: str
    group: str
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    worker_id: str | None = None
    pid: int | None = None
    reason: str | None = None  # why the job ended, if it failed
    stopping: bool = False


class SparkBackend(WorkerBackend):
    """Workers as long-running Spark tasks of ``session`` (see the module docstring).

    ``python`` is the interpreter the tasks start the worker with (default: the executor's
    own Python). ``owns_session`` stops the session in :meth:`close` (the control plane's
    session; tests share one)."""

    name = "spark"

    def __init__(
        self,
        coordinator: WorkerRegistry,
        secret: str,
        session: SparkSession,
        *,
        log_level: str = "WARNING",
        python: str | None = None,
        register_timeout_s: float = REGISTER_TIMEOUT_S,
        owns_session: bool = False,
        reserve_mb: int = 0,
        extra_args: list[str] | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.secret = secret
        self.session = session
        self.log_level = log_level
        self.python = python
        self.register_timeout_s = register_timeout_s
        self.owns_session = owns_session
        self.reserve_mb = reserve_mb
        self.extra_args = list(extra_args or [])  # more runtime.worker options (TLS files)
        self.handles: dict[str, _Handle] = {}  # by name, while the job runs
        self._token = secrets.token_hex(4)
        self._ids = itertools.count(1)
        master = session.sparkContext.master
        self._env = _local_env() if master.startswith("local") else {}

    async def start_workers(self, n: int) -> list[int]:
        if n < 0:
            raise BackendError(f"cannot start {n} workers")
        loop = asyncio.get_running_loop()
        handles = [self._launch(loop) for _ in range(n)]
        try:
            await self._wait_registered(handles)
        except BaseException:
            await asyncio.gather(*(self._stop(h) for h in handles), return_exceptions=True)
            raise
        return [h.pid for h in handles if h.pid is not None]

    def owns(self, pid: int) -> bool:
        return any(h.pid == pid and not h.stopping for h in self.handles.values())

    async def stop_worker(self, pid: int) -> None:
        handle = next((h for h in self.handles.values() if h.pid == pid), None)
        if handle is None or handle.stopping:
            raise BackendError(f"no spark worker with pid {pid}")
        await self._stop(handle)

    async def close(self) -> None:
        handles = list(self.handles.values())
        outcomes = await asyncio.gather(*(self._stop(h) for h in handles), return_exceptions=True)
        if self.owns_session:
            await asyncio.to_thread(self.session.stop)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]

    # -- one worker's job ----------------------------------------------------------------------

    def _launch(self, loop: asyncio.AbstractEventLoop) -> _Handle:
        name = f"spark-{self._token}-{next(self._ids)}"
        handle = _Handle(name, group=f"streampilot-{name}")
        self.handles[name] = handle
        host, port = self._dial_address()
        spec = {
            "coordinator": [host, port],
            "name": name,
            "log_level": self.log_level,
            "reserve_mb": self.reserve_mb,
            "python": self.python,
            "env": self._env,
            "extra_args": self.extra_args,
        }
        thread = threading.Thread(
            target=self._run_job, args=(handle, spec, loop), name=f"job-{name}", daemon=True
        )
        thread.start()
        return handle

    def _run_job(
        self, handle: _Handle, spec: dict[str, Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Thread: run the worker's job until it ends, then tell the loop why."""
        sc = self.session.sparkContext
        reason = None
        try:
            sc.setJobGroup(handle.group, f"streampilot worker {handle.name}", True)
            task = functools.partial(_worker_task, secret=self.secret)
            sc.parallelize([spec], 1).mapPartitions(task).collect()
        except Exception as exc:
            reason = spark_reason(exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(self._ended, handle, reason)

    def _ended(self, handle: _Handle, reason: str | None) -> None:
        handle.reason = reason
        handle.ended.set()
        self.handles.pop(handle.name, None)
        if handle.stopping:
            return
        why = f"its Spark task ended: {reason or 'the worker exited'}"
        logger.warning("spark worker %s (%s): %s", handle.name, handle.worker_id, why)
        if handle.worker_id is not None:
            self.coordinator.worker_failed(handle.worker_id, why)

    def _dial_address(self) -> tuple[str, int]:
        """Where executors dial the coordinator: its address, or, when it listens on every
        interface, the driver's advertised host (executors reach the driver there anyway)."""
        host, port = self.coordinator.address
        if host in ("0.0.0.0", "::", ""):
            host = self.session.sparkContext.getConf().get("spark.driver.host") or host
        return host, port

    async def _wait_registered(self, handles: list[_Handle]) -> None:
        deadline = time.monotonic() + self.register_timeout_s
        while True:
            by_name = {w.name: w for w in list(self.coordinator.workers.values())}
            for h in handles:
                info = by_name.get(h.name)
                if info is not None and h.worker_id is None:
                    h.worker_id, h.pid = info.id, info.pid
                if h.ended.is_set() and h.worker_id is None:
                    raise BackendError(
                        f"the Spark task of worker {h.name} failed before it registered: "
                        f"{h.reason or 'the worker exited'}"
                    )
            if all(h.worker_id is not None for h in handles):
                return
            if time.monotonic() > deadline:
                waiting = [h.name for h in handles if h.worker_id is None]
                raise BackendError(
                    f"{len(waiting)} of {len(handles)} Spark workers did not register within "
                    f"{self.register_timeout_s:g}s ({self._why_waiting()}); are there enough free "
                    "executor cores, and can executors reach the coordinator at "
                    "{}:{}?".format(*self._dial_address())
                )
            await asyncio.sleep(POLL_S)

    def _why_waiting(self) -> str:
        sc = self.session.sparkContext
        try:
            cores = sc.defaultParallelism
            running = len(self.handles)
        except Exception as exc:  # the SparkContext itself is gone
            return f"Spark: {spark_reason(exc)}"
        return f"{running} worker jobs submitted, default parallelism {cores}"

    async def _stop(self, handle: _Handle) -> None:
        """Step 3 of the module docstring: ask, wait, cancel, then wait for the worker to go."""
        handle.stopping = True
        asked = handle.worker_id is not None and self.coordinator.shutdown_worker(handle.worker_id)
        if asked:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(handle.ended.wait(), STOP_GRACE_S)
        if not handle.ended.is_set():
            await asyncio.to_thread(self.session.sparkContext.cancelJobGroup, handle.group)
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while not handle.ended.is_set() or self._connected(handle):
            if time.monotonic() > deadline:
                raise BackendError(
                    f"spark worker {handle.name} (job group {handle.group}) did not end within "
                    f"{CANCEL_TIMEOUT_S:.0f}s of its cancellation"
                )
            await asyncio.sleep(POLL_S)
        self.handles.pop(handle.name, None)

    def _connected(self, handle: _Handle) -> bool:
        info = self.coordinator.workers.get(handle.worker_id or "")
        return info is not None and info.status == "alive"


def _local_env() -> dict[str, str]:
    """With a local master the executors are this machine: let workers import what the
    control plane imports (as the local backend does)."""
    paths = [os.getcwd(), *(p for p in sys.path if p)]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


# -- executor side -------------------------------------------------------------------------------


def _worker_task(specs: Iterator[dict[str, Any]], secret: str) -> Iterator[dict[str, Any]]:
    """The task of a worker's job, on an executor: run one worker process until it exits,
    handing it the cluster ``secret`` through a pipe.

    Raises (failing the job, whose reason the driver reports) when the task is a retry, the
    worker cannot be started, or it exits with an error (its stderr's tail is the reason).
    """
    from pyspark import TaskContext

    spec = next(iter(specs))
    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() > 0:
        raise RuntimeError(
            "a worker's Spark task is not retried (attempt "
            f"{ctx.attemptNumber()}): the control plane replaces lost workers itself"
        )
    host, port = spec["coordinator"]
    python = spec["python"] or sys.executable
    command = [
        python,
        "-m",
        "runtime.worker",
        "--coordinator",
        f"{host}:{port}",
        "--host",
        _route_address(host),
        "--cpus",
        str(ctx.cpus() if ctx is not None else 1),
        "--executor-id",
        _executor_id(),
        "--name",
        spec["name"],
        "--log-level",
        spec["log_level"],
        "--reserve-mb",
        str(spec["reserve_mb"]),
        *spec.get("extra_args", ()),
    ]
    env = {k: v for k, v in os.environ.items() if k not in _SPARK_PRIVATE} | spec["env"]
    with tempfile.TemporaryFile() as stderr:
        secret_fd = secret_pipe(secret)
        try:
            proc = subprocess.Popen(
                [*command, "--secret-fd", str(secret_fd)],
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(secret_fd,),
                stderr=stderr,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
                # Its own session, as a local worker: the kernel shares CPU between
                # sessions (autogroups), and a worker must not share one with the executor.
                start_new_session=True,
            )
        except OSError as exc:
            raise RuntimeError(f"cannot start a worker with {python}: {exc}") from None
        finally:
            os.close(secret_fd)
        code = proc.wait()
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace").strip()
    if code != 0:
        raise RuntimeError(f"runtime.worker exited with code {code}: {errors[-REASON_CHARS:]}")
    if errors:
        print(errors, file=sys.stderr)
    yield {"pid": proc.pid, "code": code}


# Spark's own secrets in its Python worker's environment: not the worker's business.
_SPARK_PRIVATE = ("PYTHON_WORKER_FACTORY_SECRET", "PYSPARK_GATEWAY_SECRET")


def _route_address(coordinator_host: str) -> str:
    """The address of this machine on the route to the coordinator: what peers and the
    coordinator can reach this worker at (127.0.0.1 when the coordinator is local)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((coordinator_host, 9))  # no packet is sent for a UDP connect
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _executor_id() -> str:
    """The id of the executor running this task: the ``--executor-id`` of the executor JVM
    above this Python worker, or ``driver`` when tasks run in the driver (local mode)."""
    import psutil

    for proc in psutil.Process().parents():
        try:
            command = proc.cmdline()
        except psutil.Error:
            continue
        if "--executor-id" in command[:-1]:
            return command[command.index("--executor-id") + 1]
        if command and os.path.basename(command[0]) == "java":
            return "driver"
    return "driver"
