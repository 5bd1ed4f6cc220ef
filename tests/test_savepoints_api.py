"""Savepoints through the REST API, with a real server and real worker processes (a
server of its own: jobs are stopped and resubmitted): a running job is savepointed, its
savepoint outlives checkpoint retention, it is stopped with a savepoint, and a new job
running a new version of its logic, with another parallelism of its keyed operator,
starts from that savepoint and finishes with output exactly equal to the reference
(every count once, none missing); then the savepoint is deleted with its files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import msgpack
from api_support import running_server, wait_until

from runtime.checkpoints.store import open_store
from runtime.sinks import read_parts
from tests.e2e_jobs import counting_reference

RECORDS = 20_000

# A job module uploaded as code: keys -> keyed count -> Collect (every count), with the
# parallelisms and max_parallelism as params; VERSION makes each upload new logic.
MODULE = """
from runtime import Dataflow
from runtime.sinks import Collect
from runtime.sources import Generator

VERSION = {version}


def key_of(record):
    return record


def count(key, value, state):
    n = state.get(0) + 1
    state.set(n)
    return ((key, n),)


def build(params):
    flow = Dataflow("savepointed")
    source = Generator(
        records=int(params["records"]), rate=float(params.get("rate", 0)), keys=100,
        zipf=1.0, seed=3,
    )
    keys = flow.source("keys", source, parallelism=int(params.get("sources", 2)))
    counts = keys.key_by(key_of).process(
        "count", count, parallelism=int(params.get("count", 2)),
        max_parallelism=int(params.get("max_parallelism", 128)),
    )
    counts.sink("out", Collect(params["output"]), parallelism=2)
    return flow
"""


def upload(http: httpx.Client, version: int) -> str:
    """Upload :data:`MODULE` at ``version``; returns its job ref."""
    source = MODULE.format(version=version).encode()
    files = {"file": (f"savepointed_v{version}.py", source, "text/x-python")}
    r = http.post("/api/v1/code", files=files)
    assert r.status_code == 201, r.text
    return f"code:{r.json()['id']}:build"


def submit(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def completed_checkpoints(http: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    """The job's checkpoints that completed (those retention let go since too)."""
    page = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"limit": 500})
    assert page.status_code == 200, page.text
    return [c for c in page.json()["items"] if c["status"] in ("completed", "discarded")]


def referenced_files(store: Any, manifest_path: str) -> set[str]:
    """The manifest at ``manifest_path`` and every part file its chains read."""
    manifest = msgpack.unpackb(store.get(manifest_path), strict_map_key=False)
    found = {manifest_path}
    for part in manifest["tasks"].values():
        for chain in part["groups"].values():
            found |= {link[0] for link in chain}
    return found


def test_savepoint_stop_and_resubmit_at_another_parallelism_is_exact(tmp_path: Path) -> None:
    output = tmp_path / "out"  # both jobs' sink: the new one goes on with the old one's parts
    with running_server("sqlite", str(tmp_path)) as api, api.client() as http:
        store = open_store(str(tmp_path / "data" / "checkpoints"))
        params = {"records": RECORDS, "rate": 2_500, "output": str(output)}
        first = submit(
            http,
            {
                "name": "before",
                "job": upload(http, 1),
                "params": {**params, "count": 2},
                "checkpoints": {"interval_s": 0.2, "retained": 1},
            },
        )
        job_id = first["id"]
        wait_until(lambda: completed_checkpoints(http, job_id), 60, "a completed checkpoint")

        # A savepoint of the running job: it runs on.
        r = http.post(f"/api/v1/jobs/{job_id}/savepoints")
        assert r.status_code == 201, r.text
        kept = r.json()
        assert kept["status"] == "completed" and kept["ref"] == f"{job_id}/{kept['savepoint_id']}"
        assert kept["path"].endswith(f"chk-{kept['savepoint_id']}/_savepoint.msgpack")
        assert http.get(f"/api/v1/jobs/{job_id}").json()["status"] == "running"
        files = referenced_files(store, kept["path"])

        # Retention (1 kept) lets checkpoints go, never the savepoint nor what it reads.
        def past_retention() -> bool:
            done = completed_checkpoints(http, job_id)
            return len([c for c in done if c["checkpoint_id"] > kept["savepoint_id"]]) >= 3

        wait_until(past_retention, 60, "3 checkpoints after the savepoint")
        statuses = {c["status"] for c in completed_checkpoints(http, job_id)}
        assert statuses == {"completed", "discarded"}  # retention let some go
        assert all(store.exists(f) for f in files), "retention removed a savepoint's file"
        ids = [c["checkpoint_id"] for c in completed_checkpoints(http, job_id)]
        assert kept["savepoint_id"] not in ids  # /checkpoints lists checkpoints only

        # Stop with a savepoint.
        r = http.post(f"/api/v1/jobs/{job_id}/savepoints", json={"stop": True})
        assert r.status_code == 201, r.text
        last = r.json()
        assert last["status"] == "completed" and last["savepoint_id"] > kept["savepoint_id"]
        assert http.get(f"/api/v1/jobs/{job_id}").json()["status"] == "stopped"
        listed = http.get(f"/api/v1/jobs/{job_id}/savepoints").json()
        assert [s["savepoint_id"] for s in listed["items"]] == [
            last["savepoint_id"],
            kept["savepoint_id"],
        ]
        assert listed["total"] == 2
        one = http.get(f"/api/v1/jobs/{job_id}/savepoints/{last['savepoint_id']}").json()
        assert one["status"] == "completed" and one["ref"] == last["ref"]

        # A new version of the logic, the count at 3 tasks, from the last savepoint.
        second = submit(
            http,
            {
                "name": "after",
                "job": upload(http, 2),
                "params": {**params, "count": 3},
                "checkpoints": {"interval_s": 0.2},
                "from_savepoint": last["ref"],
            },
        )
        assert second["status"] == "running", second["error"]
        assert second["from_savepoint"] == last["ref"]
        # The savepoint can go at once: the new job runs on a copy of its files.
        r = http.delete(f"/api/v1/jobs/{job_id}/savepoints/{last['savepoint_id']}")
        assert r.status_code == 204, r.text
        assert not store.exists(last["path"])
        r = http.get(f"/api/v1/jobs/{job_id}/savepoints/{last['savepoint_id']}")
        assert r.status_code == 404 and "no savepoint" in r.json()["error"]["message"]

        done = api.wait_job(http, second["id"], {"finished", "failed"}, timeout=120)
        assert done["status"] == "finished", done["error"]
    assert_exact(output)


def assert_exact(output: Path) -> None:
    """Every (key, n) once, and per key n from 1 to the reference's count."""
    lines = [tuple(line) for line in read_parts(output)]
    twice = [pair for pair, n in Counter(lines).items() if n > 1]
    assert not twice, f"counts written twice: {twice[:5]}"
    reference = counting_reference(RECORDS)
    seen: dict[str, set[int]] = {}
    for key, n in lines:
        seen.setdefault(key, set()).add(n)
    assert {k: max(ns) for k, ns in seen.items()} == reference
    assert all(ns == set(range(1, reference[k] + 1)) for k, ns in seen.items())


def test_deleting_a_running_job_s_savepoint_and_a_corrupt_or_missing_one(tmp_path: Path) -> None:
    with running_server("sqlite", str(tmp_path)) as api, api.client() as http:
        store = open_store(str(tmp_path / "data" / "checkpoints"))
        job = submit(
            http,
            {
                "name": "counting",
                "job": "tests.e2e_jobs:counting_job",
                "params": {"records": 0, "rate": 2000},
                "checkpoints": {"interval_s": 0.2},
            },
        )
        job_id = job["id"]
        wait_until(lambda: completed_checkpoints(http, job_id), 60, "a completed checkpoint")
        r = http.post(f"/api/v1/jobs/{job_id}/savepoints", json={})
        assert r.status_code == 201, r.text
        running = r.json()
        assert store.exists(running["path"])
        r = http.delete(f"/api/v1/jobs/{job_id}/savepoints/{running['savepoint_id']}")
        assert r.status_code == 204, r.text
        wait_until(lambda: not store.exists(running["path"]), 10, "its manifest to go")
        assert http.get(f"/api/v1/jobs/{job_id}/savepoints").json()["total"] == 0
        assert http.get(f"/api/v1/jobs/{job_id}").json()["status"] == "running"

        r = http.post(f"/api/v1/jobs/{job_id}/savepoints", json={"stop": True})
        assert r.status_code == 201, r.text
        last = r.json()
        body = {
            "name": "again",
            "job": "tests.e2e_jobs:counting_job",
            "params": {"records": 0},
            "from_savepoint": last["ref"],
        }
        store.put(last["path"], b"\xc1 not msgpack")
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "corrupt_savepoint", error
        assert last["path"] in error["message"] and "start from another" in error["message"]
        store.delete(last["path"])
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "savepoint_unreadable"
        assert http.get("/api/v1/jobs").json()["total"] == 1
