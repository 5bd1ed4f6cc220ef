"""Savepoints refused, through the REST API of a real server (the shared one): a job
submitted from a savepoint that does not fit it (a source at another parallelism, another
job's graph), that does not exist, or without checkpoints is 422 naming what to fix, and
nothing is submitted; a savepoint of a job without checkpoints, or of one that has ended,
is 409; a keyed operator at another parallelism is accepted (its key groups find their
new tasks)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import Api, wait_until

COUNTING = "tests.e2e_jobs:counting_job"
CHECKPOINTED = {"interval_s": 0.2}


def submit(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/api/v1/jobs", json={"name": "sp", "job": COUNTING, **body})
    assert r.status_code == 201, r.text
    return r.json()


def stopped_with_savepoint(http: httpx.Client, params: dict[str, Any]) -> dict[str, Any]:
    """A checkpointed counting job run until its first checkpoint, then stopped with a
    savepoint; returns the savepoint."""
    job = submit(http, params=params, checkpoints=CHECKPOINTED)

    def checkpointed() -> bool:
        page = http.get(f"/api/v1/jobs/{job['id']}/checkpoints", params={"status": "completed"})
        return bool(page.json()["items"])

    wait_until(checkpointed, 60, "a completed checkpoint")
    r = http.post(f"/api/v1/jobs/{job['id']}/savepoints", json={"stop": True})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(scope="module")
def savepoint(api: Api) -> dict[str, Any]:
    """A savepoint of an unbounded counting job (2 sources, count at 2) that it stopped."""
    with api.client() as http:
        return stopped_with_savepoint(http, {"records": 0, "rate": 2000})


def refused(http: httpx.Client, status: int, code: str, **body: Any) -> str:
    """Submit ``body`` expecting ``status`` with error ``code``; checks that no job was
    recorded; returns the message."""
    before = http.get("/api/v1/jobs").json()["total"]
    r = http.post("/api/v1/jobs", json={"name": "sp", "job": COUNTING, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code, error
    assert http.get("/api/v1/jobs").json()["total"] == before, "a refused job was recorded"
    return error["message"]


def test_a_keyed_operator_may_change_its_parallelism(api: Api, savepoint: dict[str, Any]) -> None:
    with api.client() as http:
        job = submit(
            http,
            params={"records": 0, "rate": 2000, "parallelism": 3},
            checkpoints=CHECKPOINTED,
            from_savepoint=savepoint["ref"],
        )
        try:
            assert job["status"] == "running", job["error"]
            assert job["from_savepoint"] == savepoint["ref"]
            abstraction = http.get(f"/api/v1/jobs/{job['id']}/abstraction").json()
            count = next(op for op in abstraction["operators"] if op["name"] == "count")
            assert len(count["tasks"]) == 3
        finally:
            http.delete(f"/api/v1/jobs/{job['id']}")


def test_a_source_at_another_parallelism_is_refused_naming_it(
    api: Api, savepoint: dict[str, Any]
) -> None:
    with api.client() as http:
        message = refused(
            http,
            422,
            "incompatible_savepoint",
            params={"records": 0, "sources": 3},
            from_savepoint=savepoint["ref"],
        )
    assert "source 'keys' ran 2 task(s) at the savepoint and would run 3" in message
    assert "keep its parallelism at 2" in message


def test_another_job_s_graph_is_refused_naming_an_operator(
    api: Api, savepoint: dict[str, Any]
) -> None:
    with api.client() as http:
        before = http.get("/api/v1/jobs").json()["total"]
        r = http.post(
            "/api/v1/jobs",
            json={
                "name": "other",
                "job": "examples.wordcount:build",
                "params": {"records": 100},
                "from_savepoint": savepoint["ref"],
            },
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "incompatible_savepoint"
        assert "'keys'" in r.json()["error"]["message"]
        assert http.get("/api/v1/jobs").json()["total"] == before


def test_a_savepoint_that_does_not_exist_is_refused_saying_so(
    api: Api, savepoint: dict[str, Any]
) -> None:
    job_id = savepoint["job_id"]
    with api.client() as http:
        message = refused(
            http, 422, "unknown_savepoint", params={}, from_savepoint=f"{job_id}/999999"
        )
        assert f"job {job_id} has no savepoint 999999" in message
        assert f"GET /jobs/{job_id}/savepoints" in message
        message = refused(http, 422, "unknown_savepoint", params={}, from_savepoint="999999/1")
        assert "job 999999 does not exist" in message
        for bad in ("abc", "3", "3/", "0/1", "1/-2", " 1/2"):
            r = http.post(
                "/api/v1/jobs", json={"name": "x", "job": COUNTING, "from_savepoint": bad}
            )
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["error"]["details"][0]["field"] == "body.from_savepoint"


def test_a_job_from_a_savepoint_must_take_checkpoints(api: Api, savepoint: dict[str, Any]) -> None:
    with api.client() as http:
        message = refused(
            http,
            422,
            "invalid_checkpoints",
            params={},
            checkpoints={"interval_s": None},
            from_savepoint=savepoint["ref"],
        )
    assert "takes checkpoints" in message


def test_a_savepoint_of_a_job_without_checkpoints_or_ended_is_409(
    api: Api, savepoint: dict[str, Any]
) -> None:
    with api.client() as http:
        job = submit(http, params={"records": 0, "rate": 100}, checkpoints={"interval_s": None})
        try:
            r = http.post(f"/api/v1/jobs/{job['id']}/savepoints")
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "savepoint_refused"
            assert "takes no checkpoints" in r.json()["error"]["message"]
            assert http.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "running"
        finally:
            http.delete(f"/api/v1/jobs/{job['id']}")
        r = http.post(f"/api/v1/jobs/{savepoint['job_id']}/savepoints", json={"stop": True})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "job_not_running"
        assert "stopped" in r.json()["error"]["message"]
        r = http.post(f"/api/v1/jobs/{savepoint['job_id']}/savepoints", json={"stop": "soon"})
        assert r.status_code == 422 and "stop" in r.text
        assert http.post("/api/v1/jobs/999999/savepoints").status_code == 404


def test_savepoints_need_a_token_and_404_names_what_is_missing(
    api: Api, savepoint: dict[str, Any]
) -> None:
    job_id, sid = savepoint["job_id"], savepoint["savepoint_id"]
    with api.client(token=None) as anonymous:
        assert anonymous.get(f"/api/v1/jobs/{job_id}/savepoints").status_code == 401
        assert anonymous.post(f"/api/v1/jobs/{job_id}/savepoints").status_code == 401
    with api.client() as http:
        r = http.get(f"/api/v1/jobs/{job_id}/savepoints/999999")
        assert r.status_code == 404
        assert r.json()["error"]["message"] == f"job {job_id} has no savepoint 999999"
        r = http.get("/api/v1/jobs/999999/savepoints")
        assert r.status_code == 404 and "job 999999 does not exist" in r.text
        listed = http.get(f"/api/v1/jobs/{job_id}/savepoints", params={"status": "completed"})
        assert [s["savepoint_id"] for s in listed.json()["items"]] == [sid]
        checkpoints = http.get(f"/api/v1/jobs/{job_id}/checkpoints").json()["items"]
        assert sid not in [c["checkpoint_id"] for c in checkpoints]
