"""Durability: the StreamManager process is killed (SIGKILL) or stopped (SIGTERM) while
jobs run and a reconfiguration is under way, then started again on the same database.

Jobs, abstraction versions, reconfiguration history and uploaded code survive; a job
that takes checkpoints resumes from its last complete one on the new workers, and its
output is exact; a job that takes none is reported failed (not running) with the reason;
the reconfiguration the kill interrupted is failed with the reason; a clean stop records
the jobs as stopped. Runs the real ``streampilot server`` in a subprocess on SQLite and
PostgreSQL.
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
import pytest
from api_support import (
    ADMIN_TOKEN,
    HTTP_TIMEOUT_S,
    TEST_JOB_MODULES,
    free_port,
    postgres_database,
    wait_until,
)

from examples.wordcount import reference
from runtime.sinks import read_parts

SERVER_START_TIMEOUT_S = 60.0
SERVER_EXIT_TIMEOUT_S = 30.0
WORDS = b"def split(sentence):\n    return sentence.split()\n"


@contextlib.contextmanager
def database(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/durable.db"
    else:
        with postgres_database() as url:
            yield url


class Server:
    """The app under uvicorn in its own process, configured by ``STREAMPILOT_*`` as in a
    container (so it can be killed like a real one)."""

    def __init__(self, url: str, log: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "STREAMPILOT_DATABASE_URL": url,
            "STREAMPILOT_ADMIN_TOKEN": ADMIN_TOKEN,
            "STREAMPILOT_LOCAL_WORKERS": "2",
            "STREAMPILOT_LOG_LEVEL": "WARNING",
            "STREAMPILOT_JOB_MODULES": json.dumps(TEST_JOB_MODULES),
            "STREAMPILOT_DATA_DIR": str(log.parent / "data"),
        }
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "controlplane.app:create_app", "--factory"),
                *("--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"),
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=HTTP_TIMEOUT_S,
        )
        try:
            wait_until(self._healthy, SERVER_START_TIMEOUT_S, "the server's /healthz", 0.2)
        except BaseException:
            self.end(signal.SIGKILL)
            raise

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}"
        try:
            r = self.http.get("/healthz")
        except httpx.TransportError:
            return False
        return r.status_code == 200 and r.json()["workers"] == 2

    def end(self, sig: signal.Signals) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(SERVER_EXIT_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self.http.close()
            self.log.close()
        return code


def submit(
    http: httpx.Client, name: str, job: str, params: dict, checkpoints: dict | None = None
) -> int:
    """Submit a job (without checkpoints unless ``checkpoints`` says otherwise)."""
    body = {"name": name, "job": job, "params": params, "checkpoints": {"interval_s": None}}
    if checkpoints is not None:
        body["checkpoints"] = checkpoints
    r = http.post("/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "running", r.json()
    return r.json()["id"]


def reconfiguration(http: httpx.Client, job: int, rid: int) -> dict:
    r = http.get(f"/api/v1/jobs/{job}/reconfigurations/{rid}")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_restart_keeps_history_and_reports_the_truth(
    kind: str, tmp_path: Path, no_leftover_processes: None
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    with database(kind, tmp_path) as url:
        # A first run: two jobs, one completed reconfiguration, one stuck in its sync.
        first = Server(url, tmp_path / "server.log")
        try:
            http = first.http
            code = http.post(
                "/api/v1/code",
                files={"file": ("words.py", WORDS, "text/x-python")},
            ).json()
            counted = submit(
                http, "counted", "examples.wordcount:build", {"records": 0, "rate": 2000}
            )
            r = http.post(
                f"/api/v1/jobs/{counted}/scale", json={"operator": "count", "parallelism": 3}
            )
            assert r.status_code == 202, r.text
            scaled = r.json()["id"]
            wait_until(
                lambda: reconfiguration(http, counted, scaled)["status"] == "completed",
                30,
                "the scale-out to complete",
            )
            # An unthrottled source in front of a map that takes 5 ms a record: the map's
            # input is full batches (credits x batch size, about 20 s of work) whatever the
            # machine's speed, and the scale's sync barrier queues behind them.
            held = submit(
                http,
                "held",
                "tests.e2e_jobs:held_job",
                {"records": 10**6, "rate": 0, "hold": str(hold), "output": str(tmp_path / "o")},
            )
            wait_until(  # the registry is mirrored every half second: let it reach the db
                lambda: http.get("/api/v1/workers/history").json()["total"] == 2,
                30,
                "the first run's workers in the history",
            )
            r = http.post(
                f"/api/v1/jobs/{held}/scale", json={"operator": "count", "parallelism": 3}
            )
            assert r.status_code == 202, r.text
            stuck = r.json()["id"]

            def syncing() -> bool:
                rec = reconfiguration(http, held, stuck)
                assert rec["status"] not in ("completed", "failed", "aborted"), rec
                return rec["status"] == "syncing"

            wait_until(syncing, 30, "the held job's reconfiguration to be syncing")
        except BaseException:
            first.end(signal.SIGKILL)
            raise
        assert first.end(signal.SIGKILL) == -signal.SIGKILL

        # The second run finds everything, and tells the truth about it.
        second = Server(url, tmp_path / "server.log")
        try:
            http = second.http
            jobs = {j["id"]: j for j in http.get("/api/v1/jobs").json()["items"]}
            for job in (counted, held):
                assert jobs[job]["status"] == "failed", jobs[job]
                assert "control plane restarted" in jobs[job]["error"]
                assert "no checkpoints to resume from" in jobs[job]["error"]
            assert jobs[counted]["version"] == 2
            versions = http.get(f"/api/v1/jobs/{counted}/abstraction/versions").json()
            assert [v["version"] for v in versions["items"]] == [2, 1]
            old = http.get(f"/api/v1/jobs/{counted}/abstraction?version=1").json()
            count = next(o for o in old["operators"] if o["name"] == "count")
            assert len(count["tasks"]) == 2
            done = reconfiguration(http, counted, scaled)
            assert done["status"] == "completed"
            assert done["timings_ms"]["total"] > 0
            interrupted = reconfiguration(http, held, stuck)
            assert interrupted["status"] == "failed"
            assert (
                interrupted["error"] == "interrupted: the control plane restarted (it was syncing)"
            )
            assert http.get(f"/api/v1/code/{code['id']}").json()["callables"] == ["split"]
            # The first run's workers are in the history, lost with the reason; the jobs'
            # failure is in the events.
            history = http.get("/api/v1/workers/history").json()["items"]
            earlier = [w for w in history if w["status"] != "alive"]
            assert len(earlier) == 2, history
            assert all("control plane restarted" in w["error"] for w in earlier)
            failed = http.get("/api/v1/events", params={"kind": "job.failed"}).json()["items"]
            assert {e["job_id"] for e in failed} == {counted, held}
            # Uploaded code is installed again: a logic swap to it works after the restart.
            again = submit(http, "again", "examples.wordcount:build", {"records": 0, "rate": 1000})
            r = http.post(
                f"/api/v1/jobs/{again}/logic",
                json={"operator": "split", "logic": f"code:{code['id']}:split"},
            )
            assert r.status_code == 202, r.text
            rid = r.json()["id"]
            wait_until(
                lambda: reconfiguration(http, again, rid)["status"] == "completed",
                30,
                "the swap to uploaded code to complete",
            )
        except BaseException:
            second.end(signal.SIGKILL)
            raise
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert second.end(signal.SIGTERM) in (0, -signal.SIGTERM)

        # A clean stop records the job as stopped, with why.
        third = Server(url, tmp_path / "server.log")
        try:
            job = third.http.get(f"/api/v1/jobs/{again}").json()
            assert job["status"] == "stopped", job
            assert job["error"] == "stopped: the control plane shut down"
        finally:
            third.end(signal.SIGTERM)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_checkpointed_job_resumes_from_its_last_checkpoint_after_a_kill(
    kind: str, tmp_path: Path, no_leftover_processes: None
) -> None:
    params = {"records": 40_000, "rate": 4_000, "output": "out"}
    with database(kind, tmp_path) as url:
        first = Server(url, tmp_path / "server.log")
        try:
            http = first.http
            job = submit(http, "resumed", "examples.wordcount:build", params, {"interval_s": 0.3})

            def completed() -> bool:
                page = http.get(f"/api/v1/jobs/{job}/checkpoints", params={"status": "completed"})
                return page.json()["total"] >= 2

            wait_until(completed, 60, "2 completed checkpoints")
        except BaseException:
            first.end(signal.SIGKILL)
            raise
        assert first.end(signal.SIGKILL) == -signal.SIGKILL

        second = Server(url, tmp_path / "server.log")
        try:
            http = second.http

            def ended() -> dict | None:
                body = http.get(f"/api/v1/jobs/{job}").json()
                return body if body["status"] in ("finished", "failed", "stopped") else None

            final = wait_until(ended, 120, "the resumed job to end", 0.2)
            assert final["status"] == "finished", final
            assert final["version"] == 2
            recs = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"]
            (resumed,) = [r for r in recs if r["origin"] == "recovery"]
            assert resumed["recovery"]["reason"] == "the control plane restarted"
            assert resumed["result_version"] == 2
            ids = [
                c["checkpoint_id"]
                for c in http.get(f"/api/v1/jobs/{job}/checkpoints").json()["items"]
            ]
            assert len(ids) == len(set(ids))  # the resumed job's checkpoints come after
        finally:
            second.end(signal.SIGTERM)
    (out,) = list(tmp_path.glob("data/jobs/*/out"))
    lines = read_parts(out)
    assert len({w for w, _ in lines}) == len(lines), "a word written twice"
    assert dict(lines) == reference(params)
