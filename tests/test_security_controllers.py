"""Controllers and uploaded code run in a real sandbox (issue 30, part 4): a script that
plays the attacker from ``decide()`` against a real server with real workers and a running
job, each escape of the issue tried and recorded in the controller's log, every one
blocked; a controller that forks then hangs is failed with the reason and leaves no
process; an uploaded script's import-time code runs once, in the process that then serves
the controller; and :mod:`controlplane.sandbox` itself against real bubblewrap, no
mocking."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from api_support import Api, free_port, running_server, wait_until

from controlplane import sandbox
from controlplane.config import Settings
from controlplane.errors import BadCode
from controlplane.isolation import run_check

REPO = Path(__file__).resolve().parents[1]
HOST_DIR = Path("/var/tmp")  # on the host, visible to a sandbox (unlike /tmp): where the
# tests put what a sandbox must not see, so that only the hiding hides it
RUN_TIMEOUT_S = 60.0  # a sandboxed interpreter starts, imports numpy and tries everything
GONE_TIMEOUT_S = 10.0  # a killed sandbox's processes have all exited within this
TIMEOUT_S = 5.0  # controller_timeout_s of this module's server: decide returns within it
# Paced (unthrottled, it took both cores while the module's tests ran): the attacks need a
# running job, not its speed.
WORDCOUNT = {
    "name": "attacked",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}

# Each attempt prints one line, "attempt <name>: blocked (...)" or "... ESCAPED ...".
ATTACKS = textwrap.dedent(
    """
    import os, signal, socket

    def _attempt(name, fn):
        try:
            detail = fn()
        except BaseException as exc:
            print(f"attempt {name}: blocked ({type(exc).__name__}: {exc})"[:400], flush=True)
        else:
            print(f"attempt {name}: ESCAPED {detail!r}"[:400], flush=True)

    def _read(path, must_contain=b""):
        with open(path, "rb") as f:
            data = f.read()
        if must_contain not in data:
            raise LookupError(f"{path} is not what was looked for")
        return f"read {len(data)} bytes of {path}"

    def _connect(port):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return f"connected to port {port}"

    def _unix(path):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(path)
        s.close()
        return f"connected to {path}"

    def _write(path):
        with open(path, "w") as f:
            f.write("escaped")
        return f"wrote {path}"

    def _listdir(path):
        if not os.listdir(path):
            raise LookupError(f"{path} is empty")
        return f"listed {path}: {os.listdir(path)}"

    def _find_worker():
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
            if b"runtime.worker" in line or b"--secret" in line or b"pytest" in line:
                return f"process {pid}: {line[:200]!r}"
        raise LookupError("no other process in sight")

    def _fork(n):
        r, w = os.pipe()
        pids = []
        try:
            for _ in range(n):
                pid = os.fork()
                if pid == 0:
                    os.close(w)
                    os.read(r, 1)
                    os._exit(0)
                pids.append(pid)
        finally:
            os.close(w)
            for pid in pids:
                os.waitpid(pid, 0)
            os.close(r)
        return f"forked {len(pids)} processes"

    def _kill(pid):
        os.kill(pid, signal.SIGKILL)  # a pid namespace's init ignores it from inside
        os.kill(pid, 0)  # had it died, the sandbox (or the test run) would be gone too
        raise LookupError(f"{pid} is still alive")

    def attack(c):
        _attempt("read_database", lambda: _read(c["database"]))
        _attempt("read_database_wal", lambda: _read(c["database"] + "-wal"))
        _attempt("read_data_dir", lambda: _listdir(c["data_dir"]))
        _attempt("read_server_environ", lambda: _read(f"/proc/{c['server_pid']}/environ"))
        _attempt("read_worker_cmdline", lambda: _read(
            f"/proc/{c['worker_pid']}/cmdline", b"runtime.worker"))
        _attempt("find_worker_in_proc", _find_worker)
        _attempt("connect_rest_port", lambda: _connect(c["rest_port"]))
        _attempt("connect_coordinator_port", lambda: _connect(c["coordinator_port"]))
        _attempt("connect_postgresql_socket", lambda: _unix("/run/postgresql/.s.PGSQL.5432"))
        _attempt("read_etc_shadow", lambda: _read("/etc/shadow"))
        _attempt("write_repo", lambda: _write(c["repo_file"]))
        _attempt("fork_30", lambda: _fork(30))
        _attempt("kill_parent", lambda: _kill(os.getppid()))
        _attempt("kill_server", lambda: _kill(c["server_pid"]))
        # Its own /tmp is writable, and private: the host's file must not appear.
        with open(c["tmp_file"], "w") as f:
            f.write("private")
        print("attacks done", flush=True)
    """
)

ATTACKER = ATTACKS + textwrap.dedent(
    """
        from controllers import Controller

        class Attacker(Controller):
            interval_s = 0.3
            done = False

            def decide(self, view):
                if not self.done:
                    self.done = True
                    attack(self.config)
                return None
        """
)

FORK_THEN_HANG = textwrap.dedent(
    """
    import os, time
    from controllers import Controller

    class ForkThenHang(Controller):
        interval_s = 0.3

        def decide(self, view):
            for _ in range(3):
                if os.fork() == 0:  # holds the pipes the host reads
                    time.sleep(3600)
                    os._exit(0)
            time.sleep(3600)
    """
)

QUIET = textwrap.dedent(
    """
    class Quiet(Controller):
        interval_s = 0.3

        def decide(self, view):
            print("decided", flush=True)
            return None
    """
)

ATTEMPTS = (
    "read_database",
    "read_database_wal",
    "read_data_dir",
    "read_server_environ",
    "read_worker_cmdline",
    "find_worker_in_proc",
    "connect_rest_port",
    "connect_coordinator_port",
    "connect_postgresql_socket",
    "read_etc_shadow",
    "write_repo",
    "fork_30",
    "kill_parent",
    "kill_server",
)


def outcomes(lines: list[str]) -> dict[str, str]:
    """{attempt: what became of it} from lines ``attempt <name>: <outcome>``."""
    found = {}
    for line in lines:
        _, sep, rest = line.partition("attempt ")
        if sep:
            name, _, outcome = rest.partition(": ")
            found[name] = outcome
    return found


def assert_all_blocked(found: dict[str, str]) -> None:
    assert sorted(found) == sorted(ATTEMPTS), found
    escaped = {k: v for k, v in found.items() if not v.startswith("blocked")}
    assert not escaped, escaped
    for hidden in ("read_database", "read_database_wal", "read_data_dir"):
        assert "FileNotFoundError" in found[hidden], found  # absent, not merely forbidden


def marked(marker: str) -> list[psutil.Process]:
    """Processes (anywhere on the host) with ``marker`` as an argument."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if marker in p.cmdline():
                found.append(p)
    return found


@pytest.fixture(scope="module")
def host_dir() -> Iterator[Path]:
    """A directory on the host outside /tmp (a sandbox's /tmp is its own), removed after."""
    path = Path(tempfile.mkdtemp(prefix="streampilot-sandbox-", dir=HOST_DIR))
    path.chmod(0o755)  # as a server's directory usually is: only the hiding hides
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def escape_paths(tag: str) -> dict[str, str]:
    return {
        "repo_file": str(REPO / f".sandbox-escape-{tag}"),
        "tmp_file": f"/tmp/sandbox-escape-{tag}",
    }


def assert_no_escape_files(config: dict[str, Any]) -> None:
    for key in ("repo_file", "tmp_file"):
        assert not Path(config[key]).exists(), f"{config[key]} was written on the host"


# -- controlplane.sandbox against real bubblewrap ----------------------------------------------


def sandbox_settings(db_dir: Path, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "database_url": f"sqlite:///{db_dir}/streampilot.db",
        "data_dir": str(db_dir / "data"),
        "controller_memory_mb": 512,
        "controller_cpu_s": 30,
        "controller_max_processes": 8,
        "controller_max_open_files": 64,
    }
    return Settings(**{**options, **overrides})


def make_secrets(db_dir: Path) -> None:
    (db_dir / "streampilot.db").write_bytes(b"SQLite format 3\x00 tokens")
    (db_dir / "streampilot.db-wal").write_bytes(b"wal pages")
    (db_dir / "data").mkdir()
    (db_dir / "data" / "output.txt").write_text("a job's output")


def run_in_sandbox(settings: Settings, source: str, config: dict[str, Any], name: str) -> str:
    """Load ``source`` as a controller (``child --check``) in a sandbox; what it printed."""
    command = sandbox.command(settings, "controlplane.hosted_controllers.child", ["--check", name])
    done = subprocess.run(
        command.argv,
        input=json.dumps({"source": source, "config": config}),
        env=command.env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["type"] == "loaded", reply
    return done.stderr


def test_bubblewrap_is_available_here(tmp_path: Path) -> None:
    assert sandbox.unavailable(sandbox_settings(tmp_path)) is None


def test_an_unknown_sandbox_user_says_what_to_set(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the sandbox user is used only when the server runs as root")
    missing = sandbox.unavailable(sandbox_settings(tmp_path, sandbox_user="no-such-user-x"))
    assert missing is not None and "STREAMPILOT_SANDBOX_USER" in missing


@pytest.mark.parametrize("importable", [False, True], ids=["db-apart", "db-next-to-code"])
def test_each_escape_fails_in_the_sandbox(
    host_dir: Path, importable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The escapes, from a script's constructor in a bare sandbox. With ``importable`` the
    database's directory is on the import path (as ``./streampilot.db`` next to the code
    is): its other files stay readable, the database does not."""
    db_dir = host_dir / ("code" if importable else "apart")
    db_dir.mkdir()
    make_secrets(db_dir)
    (db_dir / "neighbour.py").write_text("VALUE = 42\n")
    if importable:
        monkeypatch.syspath_prepend(str(db_dir))
    settings = sandbox_settings(db_dir)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        worker = psutil.Process().children()[0].pid if psutil.Process().children() else 1
        config = {
            "database": str(db_dir / "streampilot.db"),
            "data_dir": str(db_dir / "data"),
            "server_pid": os.getpid(),
            "worker_pid": worker,
            "rest_port": port,
            "coordinator_port": port,
            **escape_paths(secrets.token_hex(4)),
        }
        probe = ATTACKS + textwrap.dedent(
            """
            import resource, sys
            from controllers import Controller

            class Probe(Controller):
                def __init__(self, config):
                    super().__init__(config)
                    attack(self.config)
                    print("uid", os.getuid(), "cwd", os.getcwd(), flush=True)
                    print("limits", [resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0]
                        for n in ("AS", "CPU", "NPROC", "NOFILE")], flush=True)
                    print("env", sorted(os.environ), flush=True)
                    try:
                        import neighbour
                        print("neighbour", neighbour.VALUE, flush=True)
                    except ImportError as exc:
                        print("neighbour", exc, flush=True)
            """
        )
        printed = run_in_sandbox(settings, probe, config, "probe.py").splitlines()
    assert_all_blocked(outcomes(printed))
    assert "attacks done" in printed
    assert_no_escape_files(config)
    assert (db_dir / "streampilot.db").read_bytes().startswith(b"SQLite format 3")
    assert f"limits {[512 << 20, 30, 8, 64]}" in printed
    env = next(line for line in printed if line.startswith("env "))
    assert "STREAMPILOT" not in env
    if os.geteuid() == 0:
        assert next(line for line in printed if line.startswith("uid ")).startswith("uid 65534")
    # Next to the code, the database's neighbours are still there to import.
    assert ("neighbour 42" in printed) == importable, printed


def test_killing_the_sandbox_kills_every_process_in_it(tmp_path: Path) -> None:
    """A script that forks children holding its pipes, then hangs: killing the process the
    caller started ends them all (and the pipes reach their end)."""
    marker = f"hang-{secrets.token_hex(4)}.py"
    source = (
        "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        time.sleep(3600)\n"
    )
    source += "print('forked', flush=True)\ntime.sleep(3600)\n"
    command = sandbox.command(sandbox_settings(tmp_path), "runtime.codecheck", [marker])
    proc = subprocess.Popen(
        command.argv,
        env=command.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(source)
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "forked"
        assert len(marked(marker)) >= 5  # bwrap, its init, the script, its 3 children
    finally:
        proc.kill()
        proc.wait(timeout=GONE_TIMEOUT_S)
    wait_until(lambda: not marked(marker), GONE_TIMEOUT_S, "the sandbox's processes to exit")
    with proc.stdout, proc.stderr:  # nothing holds the pipes any more: at their end
        assert proc.stdout.read() == "" and "Traceback" not in proc.stderr.read()


def test_code_checks_run_in_the_sandbox_and_are_killed_on_timeout(tmp_path: Path) -> None:
    settings = sandbox_settings(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        source = textwrap.dedent(
            f"""
            import os, socket
            assert len([p for p in os.listdir("/proc") if p.isdigit()]) < 5, "processes"
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
            except OSError:
                pass
            else:
                raise SystemExit("reached the network")

            def build():
                return None
            """
        )
        result = run_check(
            "runtime.codecheck",
            ["sandboxed.py"],
            source,
            timeout=RUN_TIMEOUT_S,
            error=BadCode,
            doing="checking",
            settings=settings,
        )
    assert result == {"callables": ["build"]}
    marker = f"slow-{secrets.token_hex(4)}.py"
    slow = "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\ntime.sleep(3600)\n"
    with pytest.raises(BadCode, match="did not finish within 2s"):
        run_check(
            "runtime.codecheck",
            [marker],
            slow,
            timeout=2,
            error=BadCode,
            doing="checking",
            settings=settings,
        )
    wait_until(lambda: not marked(marker), GONE_TIMEOUT_S, "the check's processes to exit")


# -- against a real server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(host_dir: Path) -> Iterator[tuple[Api, Settings]]:
    """A server on SQLite whose database and data root are outside /tmp (so that only the
    sandbox's hiding hides them), 2 workers, a fixed coordinator port."""
    root = host_dir / "server"
    root.mkdir()
    coordinator_port = free_port()
    with running_server(
        "sqlite",
        str(root),
        coordinator_port=coordinator_port,
        controller_timeout_s=TIMEOUT_S,
    ) as api:
        (root / "data").mkdir(exist_ok=True)
        (root / "data" / "output.txt").write_text("a job's output")
        settings = Settings(
            database_url=api.database_url,
            data_dir=str(root / "data"),
            coordinator_port=coordinator_port,
        )
        yield api, settings


@pytest.fixture
def job(server: tuple[Api, Settings]) -> Iterator[int]:
    with server[0].running_job(WORDCOUNT) as job_id:
        yield job_id


def attach(http: httpx.Client, job: int, source: str, config: dict[str, Any]) -> int:
    files = {"file": ("ctl.py", source.encode(), "text/x-python")}
    data = {"name": "attacker", "job_id": str(job), "config": json.dumps(config)}
    r = http.post("/api/v1/controllers", data=data, files=files)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def log_lines(http: httpx.Client, cid: int) -> list[str]:
    items = http.get(f"/api/v1/controllers/{cid}/logs?limit=500").json()["items"]
    return [i["message"] for i in reversed(items)]


def test_a_controller_that_attacks_from_decide_gets_nowhere(
    server: tuple[Api, Settings], job: int
) -> None:
    api, settings = server
    workers = [p for p in psutil.Process().children() if "runtime.worker" in " ".join(p.cmdline())]
    assert workers, "the server's workers"
    database = settings.database_url.removeprefix("sqlite:///")
    config = {
        "database": database,
        "data_dir": str(settings.data_dir),
        "server_pid": os.getpid(),  # the server runs in this process, on a thread
        "worker_pid": workers[0].pid,
        "rest_port": int(api.base_url.rsplit(":", 1)[1]),
        "coordinator_port": settings.coordinator_port,
        **escape_paths(secrets.token_hex(4)),
    }
    assert Path(database).is_file() and Path(database + "-wal").is_file()
    with api.client() as http:
        cid = attach(http, job, ATTACKER, config)
        lines = wait_until(
            lambda: (ls := log_lines(http, cid)) and "attacks done" in ls and ls,
            RUN_TIMEOUT_S,
            "the attacker's report in its log",
        )
        assert_all_blocked(outcomes(lines))
        assert_no_escape_files(config)
        # The server, its workers and the job are unharmed; the controller goes on.
        assert http.get("/healthz").json()["workers"] == 2
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"
        assert all(w.is_running() for w in workers)
        c = http.get(f"/api/v1/controllers/{cid}").json()
        assert (c["status"], c["failures"]) == ("running", 0), c
        assert http.post(f"/api/v1/controllers/{cid}/stop").status_code == 200


def test_a_controller_that_forks_then_hangs_is_failed_and_leaves_nothing(
    server: tuple[Api, Settings], job: int
) -> None:
    api, _ = server
    with api.client() as http:
        cid = attach(http, job, FORK_THEN_HANG, {})
        marker = f"controller-{cid}"
        wait_until(lambda: len(marked(marker)) >= 5, RUN_TIMEOUT_S, "the forked children")
        c = wait_until(
            lambda: (
                (c := http.get(f"/api/v1/controllers/{cid}").json())["status"] == "failed" and c
            ),
            RUN_TIMEOUT_S,
            "the controller to be failed",
        )
        assert f"did not return within {TIMEOUT_S:g}s" in c["error"], c
        assert c["failures"] >= 1 and c["restarts"] >= 1, c
        wait_until(lambda: not marked(marker), GONE_TIMEOUT_S, "its processes to exit")
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


def noting_imports(path: Path, body: str) -> str:
    """A script that, when imported, connects once to the unix socket at ``path`` and
    prints ``imported``; then ``body``. (A sandbox writes nowhere the test could look, but
    reaches a socket anyone may connect to: see :mod:`controlplane.sandbox`.)"""
    head = textwrap.dedent(
        f"""
        import socket
        from controllers import Controller

        with socket.socket(socket.AF_UNIX) as _note:
            _note.settimeout({TIMEOUT_S})
            _note.connect({str(path)!r})
        print("imported", flush=True)
        """
    )
    return head + body


@contextlib.contextmanager
def counting_connections(path: Path) -> Iterator[Callable[[], int]]:
    """A unix socket at ``path`` that anyone may connect to; yields a function returning
    how many connections it has had so far (each is accepted and closed)."""
    seen = 0

    def connections() -> int:
        nonlocal seen
        while True:
            try:
                conn, _ = listening.accept()
            except BlockingIOError:
                return seen
            conn.close()
            seen += 1

    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        try:
            path.chmod(0o777)  # the sandbox's user connects too
            listening.listen(16)
            listening.setblocking(False)
            yield connections
        finally:
            path.unlink()


def test_an_uploaded_scripts_import_time_code_runs_once(
    server: tuple[Api, Settings], job: int, host_dir: Path
) -> None:
    """Issue 30, item 4: the upload is checked by the sandboxed process that then serves
    the controller, so the script is imported once for an upload that then runs (not once
    to check it, then again to run it), and once for one refused at import (its process
    killed, nothing recorded). What it printed at import is in the controller's log."""
    api, _ = server
    path = host_dir / f"imports-{secrets.token_hex(4)}.sock"
    with counting_connections(path) as imports, api.client() as http:
        broken = noting_imports(path, "raise RuntimeError('refused at import')\n")
        files = {"file": ("ctl.py", broken.encode(), "text/x-python")}
        r = http.post("/api/v1/controllers", data={"name": "x", "job_id": str(job)}, files=files)
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        assert "ctl.py, line 9: importing the script raised RuntimeError" in message, message
        assert imports() == 1
        assert http.get(f"/api/v1/controllers?job_id={job}").json()["total"] == 0
        cid = attach(http, job, noting_imports(path, QUIET), {})
        c = wait_until(
            lambda: (
                (c := http.get(f"/api/v1/controllers/{cid}").json())["decisions_without_plan"] >= 2
                and c
            ),
            RUN_TIMEOUT_S,
            "two decisions",
        )
        lines = wait_until(
            lambda: (ls := log_lines(http, cid)).count("decided") >= 2 and ls,
            RUN_TIMEOUT_S,
            "the decisions in the log",
        )
        assert http.post(f"/api/v1/controllers/{cid}/stop").status_code == 200
        assert (c["restarts"], c["failures"]) == (0, 0), c
        assert imports() == 2, "imported more than once for one upload"
        assert lines.count("imported") == 1, lines
        assert lines.index("imported") < lines.index("decided")


def test_without_a_sandbox_uploads_are_refused_and_builtins_run(tmp_path: Path) -> None:
    """A server whose sandbox cannot start (here: its sandbox user does not exist) answers
    503 ``sandbox_unavailable`` to a script, saying what to do, and still runs built-ins."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox user is used only when the server runs as root")
    with (
        running_server("sqlite", str(tmp_path), sandbox_user="no-such-user-x") as api,
        api.running_job(WORDCOUNT) as job,
        api.client() as http,
    ):
        files = {"file": ("ctl.py", ATTACKER.encode(), "text/x-python")}
        r = http.post("/api/v1/controllers", data={"name": "x", "job_id": str(job)}, files=files)
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "sandbox_unavailable"
        assert "STREAMPILOT_SANDBOX_USER" in error["message"]
        assert "built-in" in error["message"]
        # Deciding every 0.3 s, not the default 10 s: its first decision comes 10 s sooner.
        data = {"name": "lb", "job_id": str(job), "builtin": "load_balancer"}
        data["config"] = json.dumps({"interval_s": 0.3})
        r = http.post("/api/v1/controllers", data=data)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        wait_until(
            lambda: http.get(f"/api/v1/controllers/{cid}").json()["last_decision_at"],
            RUN_TIMEOUT_S,
            "the built-in's first decision",
        )
        assert http.post(f"/api/v1/controllers/{cid}/stop").status_code == 200


def test_the_probe_really_escapes_outside_a_sandbox(host_dir: Path) -> None:
    """The attacks are real: run plainly (no sandbox), some of them succeed."""
    db_dir = host_dir / "plain"
    db_dir.mkdir()
    make_secrets(db_dir)
    config = {
        "database": str(db_dir / "streampilot.db"),
        "data_dir": str(db_dir / "data"),
        "server_pid": os.getpid(),
        "worker_pid": os.getpid(),
        "rest_port": 1,
        "coordinator_port": 1,
        "repo_file": str(db_dir / "written"),
        "tmp_file": str(db_dir / "tmp-written"),
    }
    harmless = ATTACKS.replace('_attempt("kill_parent"', "# ").replace(
        '_attempt("kill_server"', "# "
    )
    script = harmless + f"\nattack({config!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    found = outcomes(done.stdout.splitlines())
    for name in ("read_database", "read_database_wal", "read_data_dir", "read_server_environ"):
        assert found[name].startswith("ESCAPED"), found
    assert (db_dir / "written").exists()
