"""``GET /jobs/{id}/metrics/series`` against a real server running a word count: steps on
multiples of ``step_s``, every operator's lines, the count operator's key-group load, the
workers' usage; bad windows and steps are 422 naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from api_support import Api, wait_until

WORDCOUNT = {
    "name": "wordcount-series",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}
FLOWING_TIMEOUT_S = 20.0  # deployment, then a few 2-s steps of reports


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    """A running word count (1000 sentences/s), stopped after the module."""
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def hosting(api: Api, job_id: int) -> set[str]:
    """The workers the job's tasks run on."""
    with api.client() as http:
        a = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
    return {t["resources"]["worker"] for op in a["operators"] for t in op["tasks"]}


def _series(api: Api, job_id: int, **params: Any) -> dict[str, Any]:
    """The series once the sink has taken records with latency in some step and every
    worker hosting the job has reported its usage."""
    workers = hosting(api, job_id)
    with api.client() as http:

        def flowing() -> dict[str, Any] | None:
            r = http.get(f"/api/v1/jobs/{job_id}/metrics/series", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            sink = next(o for o in body["operators"] if o["kind"] == "sink")
            rated = [x for x in sink["in_per_s"] if x]
            latency = [x for x in sink["p99_ms"] if x]
            reported = {w["worker"] for w in body["workers"]} >= workers
            return body if rated and latency and reported else None

        return wait_until(flowing, FLOWING_TIMEOUT_S, "the sink's rate in the series", every=0.5)


def test_series_has_every_operator_key_group_and_worker_per_step(api: Api, job: int) -> None:
    body = _series(api, job, window_s=60, step_s=2)
    assert (body["job_id"], body["window_s"], body["step_s"]) == (job, 60.0, 2.0)
    times = body["times"]
    assert len(times) == 30 and all(t % 2 == 0 for t in times)
    assert [b - a for a, b in pairwise(times)] == [2.0] * 29
    steps = len(times)

    ops = {o["operator"]: o for o in body["operators"]}
    assert list(ops) == ["sentences", "split", "count", "sink"]  # source to sink
    for o in ops.values():
        lines = ("in_per_s", "out_per_s", "busy", "backpressure", "queued")
        assert all(len(o[k]) == steps for k in lines), o["operator"]
        assert all(0 <= x <= 1 for k in ("busy", "backpressure") for x in o[k] if x is not None)
        assert (o["p99_ms"] is None) == (o["kind"] != "sink")
    # Each step with reports: at most 1000 sentences/s, several words to a sentence.
    reported = [i for i, x in enumerate(ops["split"]["out_per_s"]) if x]
    assert reported
    assert all(0 < ops["sentences"]["out_per_s"][i] < 1500 for i in reported)
    assert all(ops["split"]["out_per_s"][i] > ops["split"]["in_per_s"][i] for i in reported)

    (heat,) = body["key_groups"]
    assert heat["operator"] == "count"
    assert heat["groups"] == sorted(heat["groups"]) and set(heat["groups"]) <= set(range(128))
    assert len(heat["records_per_s"]) == len(heat["groups"])
    assert all(len(row) == steps for row in heat["records_per_s"])
    loaded = [sum(row[i] for row in heat["records_per_s"]) for i in range(steps)]
    counted = ops["count"]["in_per_s"]
    # A step's key groups add up to the operator's input (the same reports, divided alike).
    for i in range(steps):
        assert loaded[i] == pytest.approx(counted[i] or 0.0, rel=0.01, abs=0.5), i

    workers = {w["worker"]: w for w in body["workers"]}
    assert set(workers) == hosting(api, job)
    for w in workers.values():
        assert len(w["cpu_percent"]) == len(w["rss_mb"]) == steps
        assert any(x for x in w["rss_mb"]) and all(x is None or x > 0 for x in w["rss_mb"])


def test_series_defaults_to_five_minutes_in_two_second_steps(api: Api, job: int) -> None:
    body = _series(api, job)
    assert (body["window_s"], body["step_s"], len(body["times"])) == (300.0, 2.0, 150)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": 301}, "window_s"),
        ({"window_s": "soon"}, "window_s"),
        ({"step_s": 0.5}, "step_s"),
        ({"step_s": -2}, "step_s"),
        ({"step_s": "x"}, "step_s"),
        ({"window_s": 10, "step_s": 20}, "step_s (20) must not be longer than window_s (10)"),
    ],
)
def test_series_refuses_bad_windows_and_steps(
    api: Api, job: int, params: dict[str, Any], named: str
) -> None:
    with api.client() as http:
        r = http.get(f"/api/v1/jobs/{job}/metrics/series", params=params)
    assert r.status_code == 422, (params, r.text)
    assert named in r.json()["error"]["message"]


def test_series_of_an_unknown_job_or_without_a_token(api: Api, job: int) -> None:
    with api.client() as http:
        r = http.get("/api/v1/jobs/999999/metrics/series")
    assert r.status_code == 404 and "999999" in r.json()["error"]["message"]
    with api.client(token=None) as anonymous:
        assert anonymous.get(f"/api/v1/jobs/{job}/metrics/series").status_code == 401
