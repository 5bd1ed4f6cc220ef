"""Support for the API tests: a real uvicorn server in a background thread, throwaway
PostgreSQL databases, and a small HTTP client that polls with bounded waits."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import psutil
import pytest
import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from controlplane.app import create_app
from controlplane.config import Settings
from controlplane.reconfigurations.models import TERMINAL_RECONFIGURATION_STATUSES as ENDED

T = TypeVar("T")

PG_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"  # trust auth, see issue 4
PG_HINT = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
SERVER_START_TIMEOUT_S = 60.0  # migrations + 2 worker processes importing numpy on a busy box
SERVER_STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 60.0  # one request (a submission deploys within 30 s)
ADMIN_TOKEN = "sp_test-admin-" + secrets.token_hex(8)
CONTROLLER_TIMEOUT_S = 2.0  # a controller's decide that hangs is killed after this
CONTROLLER_MAX_FAILURES = 2  # failures in a row that mark a controller failed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, uniquely named database on the local PostgreSQL server, dropped after.
    Fails (never skips) the test when PostgreSQL is not reachable."""
    name = f"streampilot_test_{secrets.token_hex(6)}"
    admin = create_engine(PG_SERVER_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.fail(
            f"PostgreSQL is not reachable at 127.0.0.1:5432 as user postgres ({exc.orig}); "
            f"{PG_HINT}",
            pytrace=False,
        )
    try:
        yield PG_SERVER_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def wait_until(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


class ServerThread:
    """``create_app(settings)`` served by uvicorn on a background thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="api-server", daemon=True)
        self.base_url = f"http://{settings.host}:{settings.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the API server failed to start (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API server did not start within {SERVER_START_TIMEOUT_S}s")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(SERVER_STOP_TIMEOUT_S)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(5)
        assert not self.thread.is_alive(), "the API server did not stop"


@dataclass
class Api:
    """A running server and clients for it."""

    base_url: str
    database_url: str
    backend: str

    def client(self, token: str | None = ADMIN_TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=HTTP_TIMEOUT_S)

    def wait_reconfiguration(
        self, http: httpx.Client, job_id: int, rid: int, timeout: float = 30.0
    ) -> dict[str, Any]:
        """Poll a reconfiguration until it has ended; returns its record."""

        def ended() -> dict[str, Any] | None:
            r = http.get(f"/api/v1/jobs/{job_id}/reconfigurations/{rid}")
            assert r.status_code == 200, r.text
            body = r.json()
            return body if body["status"] in ENDED else None

        return wait_until(ended, timeout, f"reconfiguration {rid} of job {job_id} to end")

    @contextlib.contextmanager
    def running_job(self, body: dict[str, Any]) -> Iterator[int]:
        """Submit job ``body``; yields its id, and stops it on exit."""
        with self.client() as http:
            r = http.post("/api/v1/jobs", json=body)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            try:
                yield job_id
            finally:
                http.delete(f"/api/v1/jobs/{job_id}")

    def wait_job(self, http: httpx.Client, job_id: int, statuses: set[str], timeout: float = 30.0):
        def reached() -> dict[str, Any] | None:
            body = http.get(f"/api/v1/jobs/{job_id}").json()
            return body if body["status"] in statuses else None

        return wait_until(reached, timeout, f"job {job_id} to be {sorted(statuses)}", every=0.1)


# The tests' own job modules, registered code of the servers they start.
TEST_JOB_MODULES = ["tests.e2e_jobs", "tests.jobs_for_tests", "tests.time_jobs"]


@contextlib.contextmanager
def running_server(backend: str, tmp_dir: str, **overrides: Any) -> Iterator[Api]:
    """A server with 2 local workers on SQLite (a file in ``tmp_dir``) or on a fresh
    PostgreSQL database, its data root ``tmp_dir/data`` and :data:`TEST_JOB_MODULES`
    registered (``overrides`` replace settings); stopped (workers included) on exit,
    checked to leave no process of its own (its workers and controller processes; other
    tests' processes, such as a shared Spark session's, are not its to stop)."""
    before = {p.pid for p in psutil.Process().children()}
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_dir}/streampilot.db"
        else:
            url = stack.enter_context(postgres_database())
        options: dict[str, Any] = {
            "database_url": url,
            "host": "127.0.0.1",
            "port": free_port(),
            "local_workers": 2,
            "admin_token": ADMIN_TOKEN,
            "log_level": "WARNING",
            "controller_timeout_s": CONTROLLER_TIMEOUT_S,
            "controller_max_failures": CONTROLLER_MAX_FAILURES,
            "data_dir": f"{tmp_dir}/data",
            "job_modules": TEST_JOB_MODULES,
        }
        settings = Settings(**{**options, **overrides})
        server = ServerThread(settings)
        server.start()
        stack.callback(server.stop)
        yield Api(server.base_url, url, backend)
    wait_until(
        lambda: not (_own_processes() - before),
        10.0,
        "the server's worker and controller processes to exit",
        every=0.1,
    )


SERVER_PROGRAMS = (
    "runtime.worker",
    "controlplane.hosted_controllers.child",
    "runtime.codecheck",
    "runtime.jobbuild",
)


def _own_processes() -> set[int]:
    """This process's children that run a program a server in it starts."""
    own = set()
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any(program in " ".join(p.cmdline()) for program in SERVER_PROGRAMS):
                own.add(p.pid)
    return own
