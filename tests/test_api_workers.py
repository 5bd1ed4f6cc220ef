"""Workers over REST against a real server: list, add (the backend starts them), drain
(refused while a running job has tasks there; once they moved away, the job runs on)."""

from __future__ import annotations

import time

import psutil
from api_support import Api, wait_until

WORDCOUNT = {
    "name": "wordcount-workers",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 200},
}


def test_add_list_and_drain_workers(api: Api) -> None:
    with api.client() as http:
        before = http.get("/api/v1/workers")
        assert before.status_code == 200, before.text
        alive = [w for w in before.json() if w["status"] == "alive"]
        assert len(alive) >= 2
        assert all(w["pid"] > 0 and w["cpus"] > 0 and w["memory_mb"] > 0 for w in alive)

        r = http.post("/api/v1/jobs", json=WORDCOUNT)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        try:
            listed = {w["id"]: w for w in http.get("/api/v1/workers").json()}
            busy = next(w for w in listed.values() if w["status"] == "alive" and w["tasks"])
            assert any(t.startswith(f"{job_id}/") for t in busy["tasks"])
            r = http.delete(f"/api/v1/workers/{busy['id']}")
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert error["code"] == "worker_busy"
            assert busy["id"] in error["message"] and busy["tasks"][0] in error["message"]
        finally:
            http.delete(f"/api/v1/jobs/{job_id}")

        r = http.post("/api/v1/workers", json={"count": 1})
        assert r.status_code == 201, r.text
        (new,) = r.json()
        assert new["status"] == "alive" and new["tasks"] == [] and new["id"] not in listed
        assert psutil.pid_exists(new["pid"])
        assert new["id"] in {w["id"] for w in http.get("/api/v1/workers").json()}

        r = http.delete(f"/api/v1/workers/{new['id']}")
        assert r.status_code == 200, r.text
        assert r.json()["id"] == new["id"]
        wait_until(lambda: not psutil.pid_exists(new["pid"]), 10.0, "the drained worker to exit")

        def gone() -> bool:
            rows = {w["id"]: w for w in http.get("/api/v1/workers").json()}
            return new["id"] not in rows or rows[new["id"]]["status"] != "alive"

        wait_until(gone, 10.0, "the drained worker to leave the registry")
        assert http.delete(f"/api/v1/workers/{new['id']}").status_code == 404


def test_worker_requests_are_checked(api: Api) -> None:
    with api.client() as http:
        for body in ({"count": 0}, {"count": 17}, {}, {"count": 1, "extra": 1}):
            assert http.post("/api/v1/workers", json=body).status_code == 422, body
        r = http.delete("/api/v1/workers/no-such-worker")
        assert r.status_code == 404 and "no-such-worker" in r.json()["error"]["message"]
    with api.client(token=None) as anonymous:
        assert anonymous.get("/api/v1/workers").status_code == 401


def test_a_worker_whose_tasks_moved_away_drains_while_the_job_runs_on(api: Api) -> None:
    """How a worker is taken out of service: move its tasks away, then drain it. Here a new
    worker takes split-1, which sends to both count tasks, and gives it back; the drain
    then ends the worker and the job runs on. Before, the other workers took the drained
    worker's connections for split-1's channels failing ("worker w3 disconnected before the
    end of ...>count-0") and the job failed."""
    body = {**WORDCOUNT, "name": "wordcount-drain", "params": {"records": 0, "rate": 2_000}}
    with api.running_job(body) as job, api.client() as http:
        r = http.post("/api/v1/workers", json={"count": 1})
        assert r.status_code == 201, r.text
        (new,) = r.json()
        abstraction = http.get(f"/api/v1/jobs/{job}/abstraction").json()
        split = next(o for o in abstraction["operators"] if o["name"] == "split")
        home = next(t for t in split["tasks"] if t["id"] == "split-1")["resources"]["worker"]
        for target in (new["id"], home):
            r = http.post(f"/api/v1/jobs/{job}/migrate", json={"task": "split-1", "worker": target})
            assert r.status_code == 202, r.text
            rec = api.wait_reconfiguration(http, job, r.json()["id"])
            assert rec["status"] == "completed", rec

        r = http.delete(f"/api/v1/workers/{new['id']}")
        assert r.status_code == 200, r.text
        wait_until(lambda: not psutil.pid_exists(new["pid"]), 10.0, "the drained worker to exit")
        # A span in which a failure would show (it comes as soon as the other workers see the
        # connections go); nothing waits for it: on a slow machine it only shows later.
        time.sleep(1.0)
        state = http.get(f"/api/v1/jobs/{job}").json()
        assert state["status"] == "running", state
