"""Checkpoints and recoveries made visible, against real servers: the Prometheus families
at ``/metrics`` (parsed with prometheus_client's parser) agree with the REST lists of a
job's checkpoints and reconfigurations, and the events say that a job is recovering and
why, its first completed checkpoint and its abandoned ones, one event for a run of them.

The recovery test has a server of its own (one of its workers is killed); the abandoned
checkpoints run on the shared servers, SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import Api, running_server, wait_until
from prometheus_client.parser import text_string_to_metric_families

UNBOUNDED = {"name": "checkpointed", "job": "examples.wordcount:build"}
PARAMS = {"records": 0, "rate": 2000}
ALL = 500  # the API's largest page: more than the checkpoints a test's job takes
WAIT_S = 60.0  # for checkpoints, a recovery, a quiet moment between checkpoints

CHECKPOINT_FAMILIES = {
    "streampilot_checkpoint_last_age_seconds",
    "streampilot_checkpoint_last_id",
    "streampilot_checkpoint_last_duration_seconds",
    "streampilot_checkpoint_last_bytes",
    "streampilot_checkpoint_last_full_bytes",
    "streampilot_checkpoints_completed_total",
    "streampilot_checkpoints_abandoned_total",
}
RECOVERY_FAMILIES = {"streampilot_recoveries_total", "streampilot_recovery_last_duration_seconds"}


def scrape(http: httpx.Client) -> dict[str, dict[str, float]]:
    """``/metrics`` as {sample name: {its job or status label: value}}, every family
    checked to have a help text."""
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(r.text):
        assert family.documentation, f"{family.name} has no help text"
        for s in family.samples:
            label = s.labels.get("job", s.labels.get("status", ""))
            samples.setdefault(s.name, {})[label] = s.value
    return samples


def checkpoints(http: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    r = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"limit": ALL})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] < ALL, "more checkpoints than one page: the test ran too long"
    return body["items"]


def events(http: httpx.Client, job_id: int, kind: str) -> list[dict[str, Any]]:
    r = http.get("/api/v1/events", params={"job_id": job_id, "kind": kind})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def quiet_scrape(
    http: httpx.Client, job_id: int
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """A scrape and the job's checkpoints as REST lists them, read with no checkpoint
    recorded in between (the same list before and after the scrape): checkpoints come
    every 0.2 s, so this polls for such a moment."""

    def still() -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]] | None:
        before = checkpoints(http, job_id)
        samples = scrape(http)
        return (samples, before) if checkpoints(http, job_id) == before else None

    return wait_until(still, WAIT_S, "a scrape between two checkpoint records", every=0.01)


def assert_scrape_matches(samples: dict[str, dict[str, float]], items: list[dict]) -> None:
    """The job's checkpoint families say what its REST list does."""
    job = str(items[0]["job_id"])
    done = [c for c in items if c["status"] in ("completed", "discarded")]
    latest = next(c for c in items if c["status"] == "completed")
    abandoned = [c for c in items if c["status"] == "abandoned"]
    assert samples["streampilot_checkpoints_completed_total"][job] == len(done)
    assert samples["streampilot_checkpoints_abandoned_total"][job] == len(abandoned)
    assert samples["streampilot_checkpoint_last_id"][job] == latest["checkpoint_id"]
    assert samples["streampilot_checkpoint_last_bytes"][job] == latest["bytes"]
    assert samples["streampilot_checkpoint_last_full_bytes"][job] == latest["full_bytes"]
    assert samples["streampilot_checkpoint_last_duration_seconds"][job] == pytest.approx(
        latest["duration_ms"] / 1000
    )
    assert samples["streampilot_checkpoint_last_age_seconds"][job] >= 0


def test_a_recovered_job_s_checkpoints_and_recovery_are_in_the_metrics_and_events(
    tmp_path: Path,
) -> None:
    with running_server("sqlite", str(tmp_path)) as api, api.client() as http:
        body = {**UNBOUNDED, "params": PARAMS, "checkpoints": {"interval_s": 0.2}}
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        job = str(job_id)
        wait_until(
            lambda: len([c for c in checkpoints(http, job_id) if c["status"] == "completed"]) >= 2,
            WAIT_S,
            "2 completed checkpoints",
        )
        samples, items = quiet_scrape(http, job_id)
        assert set(samples) >= CHECKPOINT_FAMILIES
        assert_scrape_matches(samples, items)
        assert samples["streampilot_recoveries_total"][job] == 0
        assert job not in samples.get("streampilot_recovery_last_duration_seconds", {})
        assert "recovering" in samples["streampilot_jobs"]

        abstraction = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
        count = next(op for op in abstraction["operators"] if op["kind"] == "keyed")
        victim = count["tasks"][-1]["resources"]["worker"]
        pid = next(w["pid"] for w in http.get("/api/v1/workers").json() if w["id"] == victim)
        os.kill(pid, signal.SIGKILL)

        def recovered() -> dict[str, Any] | None:
            recs = http.get(f"/api/v1/jobs/{job_id}/reconfigurations").json()["items"]
            return next((rec for rec in recs if rec["origin"] == "recovery"), None)

        recovery = wait_until(recovered, WAIT_S, f"job {job_id} to recover")
        assert api.wait_job(http, job_id, {"running"})["version"] == 2
        since = recovery["recovery"]["checkpoint_id"]
        wait_until(
            lambda: any(
                c["status"] == "completed" and c["checkpoint_id"] > since
                for c in checkpoints(http, job_id)
            ),
            WAIT_S,
            "a checkpoint completed after the recovery",
        )
        samples, items = quiet_scrape(http, job_id)
        assert set(samples) >= CHECKPOINT_FAMILIES | RECOVERY_FAMILIES
        assert_scrape_matches(samples, items)
        assert samples["streampilot_recoveries_total"][job] == 1
        assert samples["streampilot_recovery_last_duration_seconds"][job] == pytest.approx(
            recovery["timings_ms"]["total"] / 1000
        )

        # Events: the recovery begun, with its cause, then made; the first completed
        # checkpoint only; each abandoned checkpoint told is one of the REST list's.
        (recovering,) = events(http, job_id, "job.recovering")
        (made,) = events(http, job_id, "job.recovered")
        assert recovering["id"] < made["id"]
        assert victim in recovering["data"]["cause"] and victim in recovering["message"]
        # The recovery began with the first failure heard (maybe a survivor's broken data
        # link to the victim); its reason leads with the victim's loss and keeps that.
        assert recovering["data"]["cause"] in recovery["recovery"]["reason"]
        (first,) = events(http, job_id, "checkpoint.first_completed")
        done = [c for c in items if c["status"] in ("completed", "discarded")]
        oldest = min(done, key=lambda c: c["checkpoint_id"])
        assert first["data"]["checkpoint_id"] == oldest["checkpoint_id"]
        assert first["data"]["full_bytes"] == oldest["full_bytes"]
        by_id = {c["checkpoint_id"]: c for c in items}
        for told in events(http, job_id, "checkpoint.abandoned"):
            abandoned = by_id[told["data"]["checkpoint_id"]]
            assert abandoned["status"] == "abandoned"
            assert (
                told["data"]["error"] == abandoned["error"]
                and abandoned["error"] in told["message"]
            )
        http.delete(f"/api/v1/jobs/{job_id}")


def test_checkpoints_that_keep_failing_are_counted_and_told_once(api: Api) -> None:
    body = {
        **UNBOUNDED,
        "name": "never-checkpointed",
        "params": PARAMS,
        "checkpoints": {"interval_s": 0.1, "timeout_s": 1e-4},  # none can complete in time
    }
    with api.running_job(body) as job_id, api.client() as http:
        wait_until(
            lambda: len(checkpoints(http, job_id)) >= 4 or None,
            WAIT_S,
            f"4 checkpoints of job {job_id}",
        )
        samples, items = quiet_scrape(http, job_id)
        job = str(job_id)
        ended = [c for c in items if c["status"] != "in_progress"]
        assert ended and all(c["status"] == "abandoned" for c in ended)
        assert samples["streampilot_checkpoints_abandoned_total"][job] == len(ended)
        assert samples["streampilot_checkpoints_completed_total"][job] == 0
        assert job not in samples.get("streampilot_checkpoint_last_id", {})
        assert job not in samples.get("streampilot_checkpoint_last_age_seconds", {})

        (told,) = events(http, job_id, "checkpoint.abandoned")
        first = min(ended, key=lambda c: c["checkpoint_id"])
        assert told["data"]["checkpoint_id"] == first["checkpoint_id"]
        assert "not complete within" in told["data"]["error"]
        assert told["data"]["error"] == first["error"]
        assert not events(http, job_id, "checkpoint.first_completed")
        assert len(events(http, job_id, "checkpoint.")) == 1
