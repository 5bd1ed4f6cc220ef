"""Metrics over REST against a real server: a running word count's window per task,
operator and channel, and the Prometheus exposition at /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import Api, wait_until
from prometheus_client.parser import text_string_to_metric_families

WORDCOUNT = {
    "name": "wordcount-metrics",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    """A running word count (1000 sentences/s), stopped after the module."""
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def _window(api: Api, job_id: int, window_s: float = 2.0) -> dict[str, Any]:
    with api.client() as http:

        def flowing() -> dict[str, Any] | None:
            r = http.get(f"/api/v1/jobs/{job_id}/metrics", params={"window_s": window_s})
            assert r.status_code == 200, r.text
            body = r.json()
            sink = [o for o in body["operators"] if o["kind"] == "sink"]
            return body if sink and sink[0]["in_per_s"] > 0 and body["latency"]["count"] else None

        return wait_until(flowing, 15.0, "the word count's sink to report", every=0.25)


def test_job_metrics_window_is_plausible(api: Api, job: int) -> None:
    _window(api, job)
    time.sleep(2.0)  # the job runs on, so that the 2 s window measured is past the start-up
    body = _window(api, job)
    assert body["job_id"] == job and body["window_s"] == 2.0 and body["samples"] > 0

    ops = {o["operator"]: o for o in body["operators"]}
    assert set(ops) == {"sentences", "split", "count", "sink"}
    assert ops["sentences"]["kind"] == "source" and ops["count"]["kind"] == "keyed"
    # At most 1000 sentences/s; less on a box busy with the other tests' jobs.
    assert 0 < ops["sentences"]["out_per_s"] < 1500
    assert ops["split"]["out_per_s"] > ops["split"]["in_per_s"] > 0  # several words a sentence
    for o in body["operators"]:
        assert 0 <= o["busy"] <= 1 and 0 <= o["backpressure"] <= 1 and o["queued"] >= 0

    tasks = {t["task"]: t for t in body["tasks"]}
    counted = [t for t in tasks.values() if t["operator"] == "count"]
    assert counted and all(t["worker"] for t in counted)
    groups = {int(g): n for t in counted for g, n in t["key_groups"].items()}
    assert groups and all(0 <= g < 128 and n > 0 for g, n in groups.items())
    assert all(not t["key_groups"] for t in tasks.values() if t["operator"] != "count")
    assert all(isinstance(n, int) for t in tasks.values() for n in t["queued"].values())
    # Keyed tasks report the keys they hold and their state's estimated pickled size.
    assert all(0 < t["state_keys"] < t["state_bytes"] for t in counted), counted
    assert ops["count"]["state_bytes"] == sum(t["state_bytes"] for t in counted)
    unkeyed = [t for t in tasks.values() if t["operator"] != "count"]
    assert all(t["state_keys"] is None and t["state_bytes"] is None for t in unkeyed)
    assert all(o["state_bytes"] is None for name, o in ops.items() if name != "count")
    # The throttled generator's tasks say how far behind their schedule they are.
    sources = [t for t in tasks.values() if t["operator"] == "sentences"]
    assert sources and all(isinstance(t["lag"], int) and t["lag"] >= 0 for t in sources)
    assert all(t["lag"] is None for t in tasks.values() if t["operator"] != "sentences")

    cells = {(c["source"], c["target"]): c for c in body["traffic"]}
    assert cells and all(s in tasks and t in tasks for s, t in cells)
    assert any(
        tasks[s]["operator"] == "split" and tasks[t]["operator"] == "count" for s, t in cells
    )
    assert all(c["bytes_per_s"] >= c["records_per_s"] > 0 for c in cells.values())

    lat = body["latency"]
    assert 0 < lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 10_000
    assert body["workers"] and all(w["rss_mb"] > 0 for w in body["workers"])


def test_job_metrics_refuses_bad_windows_and_unknown_jobs(api: Api, job: int) -> None:
    with api.client() as http:
        for bad in (0, -1, 301, "soon"):
            r = http.get(f"/api/v1/jobs/{job}/metrics", params={"window_s": bad})
            assert r.status_code == 422, (bad, r.text)
            assert "window_s" in r.json()["error"]["message"]
        r = http.get("/api/v1/jobs/999999/metrics")
        assert r.status_code == 404 and "999999" in r.json()["error"]["message"]
    with api.client(token=None) as anonymous:
        assert anonymous.get(f"/api/v1/jobs/{job}/metrics").status_code == 401


def test_prometheus_text_parses_and_names_its_metrics(api: Api, job: int) -> None:
    _window(api, job)
    with api.client(token=None) as anonymous:  # scrapers carry no token
        r = anonymous.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    jobs = {s.labels["status"]: s.value for s in samples["streampilot_jobs"]}
    assert jobs["running"] >= 1 and set(jobs) >= {"starting", "failed", "stopped"}
    assert {s.labels["status"] for s in samples["streampilot_reconfigurations"]} >= {
        "pending",
        "completed",
    }
    rates = {s.labels["job"]: s.value for s in samples["streampilot_job_records_per_second"]}
    assert rates[str(job)] > 0
    p99 = {s.labels["job"]: s.value for s in samples["streampilot_job_sink_latency_p99_seconds"]}
    assert 0 < p99[str(job)] < 10
    state = {s.labels["job"]: s.value for s in samples["streampilot_job_state_bytes"]}
    assert state[str(job)] > 0
    assert samples["streampilot_workers"][0].value >= 2
