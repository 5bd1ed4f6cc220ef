"""A worker killed under a running job, seen through the REST API (a server of its own:
its worker is killed): the job recovers from its last complete checkpoint as a new
version with origin ``recovery``, the reason naming the lost worker, and its final
output equals the in-process reference."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from api_support import running_server, wait_until

from examples.wordcount import reference
from runtime.sinks import read_parts

PARAMS = {"records": 30_000, "rate": 5_000, "output": "out"}


def test_a_killed_worker_s_job_recovers_as_a_new_version_and_its_output_is_exact(
    tmp_path: Path,
) -> None:
    with running_server("sqlite", str(tmp_path)) as api, api.client() as http:
        body = {
            "name": "recovered-wordcount",
            "job": "examples.wordcount:build",
            "params": PARAMS,
            "checkpoints": {"interval_s": 0.2},
        }
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        def two_completed() -> list[dict[str, Any]] | None:
            page = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"status": "completed"})
            items = page.json()["items"]
            return items if len(items) >= 2 else None

        wait_until(two_completed, 60, "2 completed checkpoints")
        abstraction = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
        count = next(op for op in abstraction["operators"] if op["kind"] == "keyed")
        victim = count["tasks"][-1]["resources"]["worker"]
        pid = next(w["pid"] for w in http.get("/api/v1/workers").json() if w["id"] == victim)
        os.kill(pid, signal.SIGKILL)

        job = api.wait_job(http, job_id, {"finished", "failed"}, timeout=120)
        assert job["status"] == "finished", job["error"]
        assert job["version"] == 2
        recs = http.get(f"/api/v1/jobs/{job_id}/reconfigurations").json()["items"]
        (recovery,) = [rec for rec in recs if rec["origin"] == "recovery"]
        assert recovery["status"] == "completed" and recovery["result_version"] == 2
        assert victim in recovery["recovery"]["reason"]
        assert recovery["recovery"]["lost_workers"] == [victim]
        assert recovery["timings_ms"]["total"] > 0 and recovery["ops"] == []
        assert set(recovery["recovery"]["timings_ms"]) == {"halt", "place", "restore", "total"}
        v2 = http.get(f"/api/v1/jobs/{job_id}/abstraction", params={"version": 2}).json()
        workers = {t["resources"]["worker"] for op in v2["operators"] for t in op["tasks"]}
        assert victim not in workers
        events = http.get("/api/v1/events", params={"job_id": job_id}).json()["items"]
        assert any(e["kind"] == "job.recovered" for e in events)
    out = list(tmp_path.glob("data/jobs/*/out"))
    assert len(out) == 1
    lines = read_parts(out[0])
    assert not [w for w, n in Counter(w for w, _ in lines).items() if n > 1], "a word twice"
    assert dict(lines) == reference(PARAMS)
