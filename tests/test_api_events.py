"""Events and worker history over REST against a real server: a job's life (submitted,
running, reconfigured, finished), workers registered and drained, uploaded code, each
recorded once, in order, filterable by job and kind."""

from __future__ import annotations

from typing import Any

import httpx
from api_support import Api, wait_until


def events(http: httpx.Client, **query: Any) -> list[dict[str, Any]]:
    r = http.get("/api/v1/events", params={"limit": 500, **query})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_a_jobs_life_is_in_its_events(api: Api) -> None:
    body = {
        "name": "eventful",
        "job": "examples.wordcount:build",
        "params": {"records": 20_000, "rate": 10_000},
    }
    with api.client() as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        r = http.post(f"/api/v1/jobs/{job}/scale", json={"operator": "count", "parallelism": 3})
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed"
        api.wait_job(http, job, {"finished"}, timeout=60)
        kinds = wait_until(
            lambda: (
                "job.finished" in (k := [e["kind"] for e in reversed(events(http, job_id=job))])
                and k
            ),
            10,
            "the job's end in its events",
        )
        assert kinds == [
            "job.submitted",
            "job.running",
            "reconfiguration.completed",
            "job.finished",
        ]
        mine = events(http, job_id=job)
        done = next(e for e in mine if e["kind"] == "reconfiguration.completed")
        assert done["data"]["reconfiguration"] == rec["id"]
        assert f"reconfiguration {rec['id']} (scale) of job {job} completed in" in done["message"]
        assert [e["kind"] for e in events(http, job_id=job, kind="job.")] == [
            "job.finished",
            "job.running",
            "job.submitted",
        ]


def test_workers_are_recorded_with_their_end(api: Api) -> None:
    with api.client() as http:
        registered = {e["data"]["worker"] for e in events(http, kind="worker.registered")}
        live = {w["id"] for w in http.get("/api/v1/workers").json() if w["status"] == "alive"}
        assert live <= registered
        new = http.post("/api/v1/workers", json={"count": 1}).json()[0]
        assert http.delete(f"/api/v1/workers/{new['id']}").status_code == 200

        def ended() -> dict[str, Any] | None:
            rows = http.get("/api/v1/workers/history").json()["items"]
            row = next((w for w in rows if w["worker_id"] == new["id"]), None)
            return row if row and row["status"] != "alive" else None

        row = wait_until(ended, 15, "the drained worker's end in the history")
        assert row["pid"] == new["pid"] and row["ended_at"] is not None
        ends = [e for e in events(http, kind="worker.") if e["data"]["worker"] == new["id"]]
        assert [e["kind"] for e in reversed(ends)] == [
            "worker.registered",
            f"worker.{row['status']}",
        ]


def test_events_need_a_token_and_check_their_filters(api: Api) -> None:
    with api.client(None) as anonymous:
        assert anonymous.get("/api/v1/events").status_code == 401
    with api.client() as http:
        assert http.get("/api/v1/events", params={"job_id": 0}).status_code == 422
        assert http.get("/api/v1/events", params={"kind": "x" * 41}).status_code == 422
        assert events(http, kind="no.such.kind") == []
