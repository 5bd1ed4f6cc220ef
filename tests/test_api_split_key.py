"""Splitting a hot key over REST against a real server (SQLite and PostgreSQL): a
``splitKey`` plan carried out live, the split in the abstraction and the diff, merged
back, and bad splits refused with 422 naming what to fix."""

from __future__ import annotations

from typing import Any

import httpx
from api_support import Api

from runtime.keygroups import key_group

JOB = {
    "name": "wordcount-aggregate",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000, "parallelism": 2, "aggregate": True},
}
WAIT_S = 60.0


def operator(http: httpx.Client, job: int, name: str) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job}/abstraction")
    assert r.status_code == 200, r.text
    return next(o for o in r.json()["operators"] if o["name"] == name)


def split(http: httpx.Client, job: int, key: Any, tasks: list[str], op: str = "count"):
    version = http.get(f"/api/v1/jobs/{job}").json()["version"]
    body = {"op": "splitKey", "operator": op, "key": key, "tasks": tasks}
    return http.post(
        f"/api/v1/jobs/{job}/reconfigurations", json={"base_version": version, "ops": [body]}
    )


def test_a_key_split_live_shows_in_the_abstraction_and_the_diff(api: Api) -> None:
    with api.running_job(JOB) as job, api.client() as http:
        count = operator(http, job, "count")
        assert count["combinable"] is True and count["split_keys"] == []
        assert operator(http, job, "count.merge")["combinable"] is False
        r = split(http, job, "w1", ["count-0", "count-1"])
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"], WAIT_S)
        assert rec["status"] == "completed", rec
        (entry,) = operator(http, job, "count")["split_keys"]
        assert entry["key"] == "w1" and len(entry["groups"]) == 2
        assert entry["groups"][0] == key_group("w1", count["max_parallelism"])
        v = rec["result_version"]
        d = http.get(f"/api/v1/jobs/{job}/abstraction/diff", params={"from": v - 1, "to": v})
        assert d.status_code == 200, d.text
        (changed,) = [o for o in d.json()["operators"] if o["operator"] == "count"]
        assert changed["split_changes"] == [{"key": "w1", "before": [], "after": entry["groups"]}]
        # Merged back.
        r = split(http, job, "w1", [])
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"], WAIT_S)
        assert rec["status"] == "completed", rec
        assert operator(http, job, "count")["split_keys"] == []
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


def test_bad_splits_are_refused_with_422_naming_what_to_fix(api: Api) -> None:
    with api.running_job(JOB) as job, api.client() as http:
        cases = [
            (("w1", ["count-0", "count-1"], "count.merge"), "not a combinable aggregation"),
            (("w1", ["count-0"], "count"), "two tasks or more"),
            (("w1", ["count-0", "count-7"], "count"), "count-7"),
            (("w1", [], "count"), "is not split"),
            (({"a": 1}, ["count-0", "count-1"], "count"), "key"),
        ]
        for (key, tasks, op), fragment in cases:
            r = split(http, job, key, tasks, op)
            assert r.status_code == 422, (key, tasks, op, r.text)
            assert fragment in r.text, (fragment, r.text)
        assert operator(http, job, "count")["split_keys"] == []
