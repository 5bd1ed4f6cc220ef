"""A real Spark standalone cluster on loopback for the tests, and a StreamManager server
process whose spark backend runs on it.

:func:`standalone` starts a Spark master and two Spark workers from the pyspark package
(``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), each
a JVM in its own session with little memory, on ports of 127.0.0.1 chosen free, and
waits (bounded) until the master says it is alive with both workers registered (its
web UI's ``/json/``, on loopback too). Each Spark worker offers ``CORES`` cores; an
application gets one executor of ``CORES`` cores on each (``spark.executor.cores``), so
that a StreamManager worker (one task slot) lives on one executor of one Spark worker,
and killing a Spark worker's JVM and its executor's leaves the other's executor with its
slots.

:class:`SparkServer` is ``uvicorn controlplane.app:create_app`` in a subprocess (a
StreamManager has one SparkContext per process, and the test session runs its own
``local[2]`` one), configured by ``STREAMPILOT_*`` with ``backend=spark`` and the
cluster's master URL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pyspark

from tests.api_support import ADMIN_TOKEN, HTTP_TIMEOUT_S, TEST_JOB_MODULES, free_port, wait_until

__all__ = ["SparkServer", "Standalone", "standalone"]

SPARK_HOME = Path(pyspark.__file__).parent
CORES = 2  # per Spark worker, and per executor: two StreamManager workers fit on one
DAEMON_MEMORY = "256m"  # the master's and each worker's JVM heap
WORKER_MEMORY = "1g"  # what a Spark worker offers executors
EXECUTOR_MEMORY = "512m"  # Spark refuses less than 450 MB
READY_TIMEOUT_S = 120.0  # a JVM starts, the master is elected, workers register, on a busy box
STOP_TIMEOUT_S = 20.0  # a JVM asked to stop (SIGTERM) is gone within this, else it is killed
SERVER_START_TIMEOUT_S = 180.0  # the server's SparkContext and its workers' Spark jobs start
REPO = Path(__file__).resolve().parent.parent


def _spark_env(log_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_LOCAL_IP": "127.0.0.1",  # every port Spark opens, on loopback
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no fixed port 6066
        # Executors run the workers with this repository importable (jobs from tests/).
        "PYTHONPATH": str(REPO),
    }


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc`` (a JVM, or the server) and its session, then SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)


class Standalone:
    """A running master and its workers (see :func:`standalone`): ``master_url``
    (``spark://127.0.0.1:PORT``) and each Spark worker's JVM process."""

    def __init__(self, directory: Path, workers: int, procs: list[subprocess.Popen]) -> None:
        self.directory = directory
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._env = _spark_env(self.logs)
        port, ui = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui}"
        self.procs = procs  # every JVM it starts, for its owner to stop
        self.master = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
        )
        self.workers: list[subprocess.Popen] = []
        self._ports: dict[int, int] = {}  # each worker's RPC port, the end of its id at the master
        wait_until(self._master_alive, READY_TIMEOUT_S, "the Spark master", 0.5)
        self.workers = [self._start_worker(i) for i in range(workers)]
        self.revive()

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        with (self.logs / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: stopped, and killed, as a group
            )
        self.procs.append(proc)
        return proc

    def _start_worker(self, i: int) -> subprocess.Popen:
        port = free_port()
        self._ports[i] = port
        return self._start(
            f"worker-{i}",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--webui-port", str(free_port()), "--cores", str(CORES)),
            *("--memory", WORKER_MEMORY, "--work-dir", str(self.directory / f"work-{i}")),
        )

    def _master_alive(self) -> bool:
        assert self.master.poll() is None, f"the Spark master exited; see {self.logs}"
        with contextlib.suppress(httpx.HTTPError, json.JSONDecodeError):
            return self.state()["status"] == "ALIVE"
        return False

    def state(self) -> dict:
        """The master's view (its web UI's JSON): workers, cores, applications."""
        return httpx.get(f"{self.ui_url}/json/", timeout=HTTP_TIMEOUT_S).json()

    def revive(self) -> None:
        """Start again the Spark workers that died (a test killed them), and wait until
        the master has every one of them alive (by their ids, which end with their ports:
        one it lost may be listed a while longer)."""
        self.workers = [
            self._start_worker(i) if w.poll() is not None else w for i, w in enumerate(self.workers)
        ]

        def registered() -> bool:
            assert self._master_alive()
            with contextlib.suppress(httpx.HTTPError, json.JSONDecodeError):
                ports = {
                    w["id"].rpartition("-")[2]
                    for w in self.state()["workers"]
                    if w["state"] == "ALIVE"
                }
                return {str(p) for p in self._ports.values()} <= ports
            return False

        wait_until(registered, READY_TIMEOUT_S, f"{len(self.workers)} Spark workers alive", 0.5)

    def worker_hosting(self, pid: int) -> subprocess.Popen:
        """The Spark worker whose executor runs process ``pid`` (its JVM, an ancestor)."""
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        return next(w for w in self.workers if w.pid in ancestors)

    def executors_of(self, worker: subprocess.Popen) -> list[psutil.Process]:
        """The executor JVMs a Spark worker started and runs (its children; one that
        exited and is not reaped yet is not listed)."""
        found = []
        for child in psutil.Process(worker.pid).children():
            with contextlib.suppress(psutil.Error):
                if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                    found.append(child)
        return found


@contextlib.contextmanager
def standalone(directory: Path, workers: int = 2) -> Iterator[Standalone]:
    """A master and ``workers`` Spark workers (module docstring), stopped on exit."""
    procs: list[subprocess.Popen] = []
    try:
        cluster = Standalone(directory, workers, procs)
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)


class SparkServer:
    """The StreamManager in its own process, its workers Spark tasks on ``cluster``: 2 at
    start-up, with checkpoints under ``data/checkpoints`` of ``directory`` (one machine:
    every executor reaches it)."""

    def __init__(self, cluster: Standalone, directory: Path, workers: int = 2) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.data = directory / "data"
        conf = {
            "spark.pyspark.python": sys.executable,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": EXECUTOR_MEMORY,
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": str(CORES),
            "spark.ui.enabled": "false",
        }
        env = {
            **os.environ,
            "STREAMPILOT_DATABASE_URL": f"sqlite:///{directory}/streampilot.db",
            "STREAMPILOT_ADMIN_TOKEN": ADMIN_TOKEN,
            "STREAMPILOT_BACKEND": "spark",
            "STREAMPILOT_SPARK_MASTER": cluster.master_url,
            "STREAMPILOT_SPARK_CONF": json.dumps(conf),
            "STREAMPILOT_LOCAL_WORKERS": str(workers),
            # A new worker waits this long for a free executor slot before a recovery
            # places the lost tasks on the survivors instead.
            "STREAMPILOT_WORKERS_TIMEOUT_S": "20",
            "STREAMPILOT_LOG_LEVEL": "WARNING",
            "STREAMPILOT_JOB_MODULES": json.dumps(TEST_JOB_MODULES),
            "STREAMPILOT_DATA_DIR": str(self.data),
        }
        self.log = (directory / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "controlplane.app:create_app", "--factory"),
                *("--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"),
            ],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=HTTP_TIMEOUT_S,
        )
        try:
            wait_until(
                lambda: self._healthy(workers), SERVER_START_TIMEOUT_S, "the server's workers", 0.5
            )
        except BaseException:
            self.close()
            raise

    def _healthy(self, workers: int) -> bool:
        assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}"
        try:
            r = self.http.get("/healthz")
        except httpx.TransportError:
            return False
        return r.status_code == 200 and r.json()["workers"] >= workers

    def close(self) -> None:
        """Stop the server (SIGTERM: it stops its workers' Spark jobs and its SparkContext)."""
        try:
            _stop(self.proc)
        finally:
            self.http.close()
            self.log.close()
