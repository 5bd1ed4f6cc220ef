"""An event-time job over REST against a real server: its watermarks and late records in
``GET /jobs/{id}/metrics`` and in Prometheus, and a windowed job rescaled and rebalanced
live through the API with its windows exactly the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_support import Api, wait_until
from prometheus_client.parser import text_string_to_metric_families

from tests.time_jobs import read_windows, window_reference

WAIT_S = 120.0  # a watermark reaches every task, a change completes, a bounded job ends


def metrics(http: Any, job_id: int) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job_id}/metrics", params={"window_s": 5})
    assert r.status_code == 200, r.text
    return r.json()


# One database (~6 s each): watermarks and windows come from the workers, not storage;
# the reconfigurations it records are stored on both by test_api_reconfigurations.py.
@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_a_windowed_job_shows_its_watermarks_and_stays_exact_through_live_changes(
    api: Api, tmp_path: Path, held_end: Path
) -> None:
    params = {
        "events": 40_000,
        "rate": 10_000,
        "window": "sliding",
        "output": str(tmp_path / "out"),
        "held": str(held_end),
    }
    body = {"name": "windows", "job": "tests.time_jobs:windowed_job", "params": params}
    with api.client() as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        try:
            api.wait_job(http, job_id, {"running"})

            def watermarked() -> dict[str, Any] | None:
                m = metrics(http, job_id)
                ops = {o["operator"]: o for o in m["operators"]}
                windowed = [t for t in m["tasks"] if t["operator"] == "window"]
                done = (
                    ops.get("window", {}).get("watermark")
                    and ops.get("out", {}).get("watermark")
                    and windowed
                    and all(t["watermark"] is not None for t in windowed)
                )
                return m if done else None

            m = wait_until(watermarked, WAIT_S, "watermarks in the metrics", every=0.25)
            ops = {o["operator"]: o for o in m["operators"]}
            assert ops["events"]["watermark"] <= ops["window"]["watermark"] + 1.0
            assert all(ops[o]["watermark_lag_s"] >= 0 for o in ("events", "window", "out"))
            assert all(o["late_records"] == 0 for o in m["operators"])
            windowed = [t for t in m["tasks"] if t["operator"] == "window"]
            assert windowed and all(t["watermark"] is not None for t in windowed)

            with api.client(token=None) as anonymous:
                text = anonymous.get("/metrics").text
            lags = {
                s.labels["operator"]: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "streampilot_watermark_lag_seconds" and s.labels["job"] == str(job_id)
            }
            assert set(lags) >= {"events", "window", "out"} and min(lags.values()) >= 0

            r = http.post(
                f"/api/v1/jobs/{job_id}/scale", json={"operator": "window", "parallelism": 3}
            )
            assert r.status_code == 202, r.text
            assert api.wait_reconfiguration(http, job_id, r.json()["id"])["status"] == "completed"
            a = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
            window = next(o for o in a["operators"] if o["name"] == "window")
            groups = {t["id"]: t["workload"]["key_groups"] for t in window["tasks"]}
            moved = groups["window-0"][:8]
            plan = {
                "base_version": a["job"]["version"],
                "mode": "fluid",
                "ops": [
                    {
                        "op": "assignWorkload",
                        "operator": "window",
                        "workload": {
                            "window-0": groups["window-0"][8:],
                            "window-2": groups["window-2"] + moved,
                        },
                    }
                ],
            }
            r = http.post(f"/api/v1/jobs/{job_id}/reconfigurations", json=plan)
            assert r.status_code == 202, r.text
            assert api.wait_reconfiguration(http, job_id, r.json()["id"])["status"] == "completed"
        finally:
            held_end.unlink(missing_ok=True)
        job = api.wait_job(http, job_id, {"finished", "failed"}, timeout=WAIT_S)
        assert job["status"] == "finished", job
    del params["held"]
    assert read_windows(params["output"]) == window_reference(params)
