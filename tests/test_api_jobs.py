"""Jobs over REST against a real server (uvicorn, 2 local workers, SQLite or PostgreSQL):
submit, read, list, stop, the abstraction, and errors that say what to fix."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import Api

WORDCOUNT: dict[str, Any] = {
    "name": "wordcount",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}


def bounded(records: int) -> dict[str, Any]:
    return {**WORDCOUNT, "name": f"wordcount-{records}", "params": {"records": records}}


def test_healthz_needs_no_token(api: Api) -> None:
    r = httpx.get(f"{api.base_url}/healthz", timeout=10)
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["workers"] >= 2


def test_submit_read_and_stop_a_job(api: Api) -> None:
    with api.client() as http:
        r = http.post("/api/v1/jobs", json=WORDCOUNT)
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["status"] == "running"
        assert job["version"] == 1
        assert job["error"] is None
        assert job["job"] == WORDCOUNT["job"] and job["params"] == WORDCOUNT["params"]

        assert http.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "running"
        listed = http.get("/api/v1/jobs", params={"status": "running"}).json()
        assert job["id"] in [j["id"] for j in listed["items"]]

        a = http.get(f"/api/v1/jobs/{job['id']}/abstraction").json()
        assert a["job"] == {
            "id": str(job["id"]),
            "name": "wordcount",
            "version": 1,
            "status": "running",
        }
        ops = {op["name"]: op for op in a["operators"]}
        assert list(ops) == ["sentences", "split", "count", "sink"]
        count = ops["count"]
        assert count["kind"] == "keyed" and count["max_parallelism"] == 128
        groups = sorted(g for t in count["tasks"] for g in t["workload"]["key_groups"])
        assert groups == list(range(128))
        assert all("weight" not in t["workload"] for t in count["tasks"])
        assert {t["resources"]["worker"] for t in count["tasks"]} <= {w["id"] for w in a["workers"]}

        versions = http.get(f"/api/v1/jobs/{job['id']}/abstraction/versions").json()
        assert [v["version"] for v in versions["items"]] == [1]
        assert versions["items"][0]["reconfiguration_id"] is None

        r = http.delete(f"/api/v1/jobs/{job['id']}")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "stopped"
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "stopped"
        assert http.delete(f"/api/v1/jobs/{job['id']}").json()["status"] == "stopped"

        r = http.post(
            f"/api/v1/jobs/{job['id']}/scale", json={"operator": "count", "parallelism": 3}
        )
        assert r.status_code == 409
        assert r.json()["error"]["code"] == "job_not_running"
        assert "stopped" in r.json()["error"]["message"]


def test_bounded_jobs_finish_and_are_paginated(api: Api) -> None:
    with api.client() as http:
        ids = []
        for records in (300, 400):
            r = http.post("/api/v1/jobs", json=bounded(records))
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        for job_id in ids:
            assert api.wait_job(http, job_id, {"finished"})["error"] is None

        first = http.get("/api/v1/jobs", params={"limit": 1}).json()
        second = http.get("/api/v1/jobs", params={"limit": 1, "offset": 1}).json()
        assert first["total"] == second["total"] >= 2
        assert (first["limit"], first["offset"], second["offset"]) == (1, 0, 1)
        assert [j["id"] for j in first["items"] + second["items"]] == ids[::-1]  # newest first

        finished = http.get("/api/v1/jobs", params={"status": "finished", "limit": 500}).json()
        assert set(ids) <= {j["id"] for j in finished["items"]}

        r = http.get("/api/v1/jobs", params={"limit": 0})
        assert r.status_code == 422
        assert "query.limit" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        ({**WORDCOUNT, "job": "examples.nope:build"}, "bad_job_ref", ["examples.nope"]),
        ({**WORDCOUNT, "job": "examples.wordcount"}, "bad_job_ref", ["module:callable"]),
        ({**WORDCOUNT, "job": "examples.wordcount:nope"}, "bad_job_ref", ["nope"]),
        ({**WORDCOUNT, "params": {"records": "lots"}}, "bad_params", ["records", "lots"]),
        ({**WORDCOUNT, "params": {"recrods": 5}}, "bad_params", ["recrods"]),
        ({**WORDCOUNT, "params": {"keys": 0}}, "bad_params", ["keys"]),
        ({"name": "x", "params": {}}, "invalid_request", ["body.job", "required"]),
        ({**WORDCOUNT, "name": ""}, "invalid_request", ["body.name"]),
        ({**WORDCOUNT, "colour": "red"}, "invalid_request", ["body.colour"]),
        ([1, 2], "invalid_request", ["body", "JSON object"]),
    ],
)
def test_bad_submissions_say_what_to_fix(api: Api, body: Any, code: str, words: list[str]) -> None:
    with api.client() as http:
        r = http.post("/api/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == code
    for word in words:
        assert word in error["message"]


def test_unknown_things_are_404_and_bad_paths_422(api: Api) -> None:
    with api.client() as http:
        r = http.get("/api/v1/jobs/987654")
        assert r.status_code == 404
        assert r.json()["error"] == {"code": "not_found", "message": "job 987654 does not exist"}
        for path in ("/abstraction", "/abstraction/versions", "/reconfigurations"):
            assert http.get(f"/api/v1/jobs/987654{path}").status_code == 404
        r = http.get("/api/v1/jobs/first")
        assert r.status_code == 422
        assert "path.job_id" in r.json()["error"]["message"]
        r = http.get("/api/v1/nothing-here")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = http.put("/api/v1/jobs")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


TOO_BIG = 2**31  # one past a PostgreSQL INTEGER; 2**63 and up overflowed SQLite's driver


@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("GET", f"/api/v1/jobs/{2**63}", "path.job_id"),
        ("GET", f"/api/v1/jobs/{TOO_BIG}", "path.job_id"),
        ("GET", f"/api/v1/jobs/-{2**70}", "path.job_id"),
        ("GET", f"/api/v1/jobs?offset={2**81}", "query.offset"),
        ("GET", f"/api/v1/jobs/1/abstraction?version={TOO_BIG}", "query.version"),
        ("GET", f"/api/v1/jobs/1/abstraction/diff?from={TOO_BIG}", "query.from"),
        ("GET", f"/api/v1/jobs/1/reconfigurations/{2**65}", "path.reconfiguration_id"),
        ("DELETE", f"/api/v1/tokens/{2**64}", "path.token_id"),
    ],
)
def test_out_of_range_ids_are_422_not_500(api: Api, method: str, url: str, field: str) -> None:
    """Found by test_api_fuzz.py: an id beyond the database's INTEGER reached the driver
    and failed there (a 500); it is refused up front, naming the parameter and its bound."""
    with api.client() as http:
        r = http.request(method, url)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"][0]["field"] == field
    assert "2147483647" in error["message"] or "greater than or equal to" in error["message"]
