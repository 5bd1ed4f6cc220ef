"""The REST API played as an attacker with a token: scopes that mean what they say, and
limits on what one request may ask, against a real server (the shared ``api`` fixture:
2 local workers, the default limits of :class:`controlplane.config.Settings`).

- Plans that start workers (``"new"``) need an admin token; an operate token is refused
  (403) whether the plan is posted, previewed or built by a helper.
- Starting workers counts against the server-wide ``max_workers`` (409 ``worker_limit``):
  through ``POST /workers`` and through plans.
- A body over ``max_request_bytes`` is refused with 413 before it is read whole (declared
  or chunked); a plan over ``max_plan_ops`` with 422; an error never echoes a huge value.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from api_support import Api

from controlplane.config import Settings
from controlplane.http import MAX_MESSAGE_CHARS

DEFAULTS = Settings()
WORDCOUNT = {
    "name": "wordcount-security",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 200},
}


@pytest.fixture(scope="module")
def operate_token(api: Api) -> str:
    with api.client() as admin:
        r = admin.post("/api/v1/tokens", json={"name": "security operate", "scopes": ["operate"]})
        assert r.status_code == 201, r.text
        return r.json()["token"]


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def _error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code, error
    return error["message"]


def _version(http: httpx.Client, job: int) -> int:
    r = http.get(f"/api/v1/jobs/{job}/abstraction")
    assert r.status_code == 200, r.text
    return r.json()["job"]["version"]


def _alive(http: httpx.Client) -> list[str]:
    return [w["id"] for w in http.get("/api/v1/workers").json() if w["status"] == "alive"]


def test_operate_cannot_start_workers_through_plans(api: Api, operate_token: str, job: int) -> None:
    with api.client(operate_token) as operator, api.client() as admin:
        workers_before = _alive(admin)
        version = _version(admin, job)
        asks = [
            ("migrate", {"task": "count-0", "worker": "new"}),
            ("scale", {"operator": "count", "parallelism": 4, "workers": ["new"]}),
            (
                "reconfigurations",
                {
                    "base_version": version,
                    "ops": [
                        {
                            "op": "assignResource",
                            "operator": "count",
                            "task": "count-0",
                            "worker": "new",
                        }
                    ],
                },
            ),
            ("reconfigurations/preview", {"origin": "migrate", "task": "count-0", "worker": "new"}),
            (
                "reconfigurations/preview",
                {"origin": "scale", "operator": "count", "parallelism": 128, "workers": ["new"]},
            ),
        ]
        for path, body in asks:
            r = operator.post(f"/api/v1/jobs/{job}/{path}", json=body)
            message = _error(r, 403, "forbidden")
            assert "admin token" in message and "new" in message, (path, message)
        # Nothing was started, and the job is where it was.
        assert _alive(admin) == workers_before
        assert _version(admin, job) == version
        assert admin.get(f"/api/v1/jobs/{job}").json()["status"] == "running"
        # The same preview with an admin token is allowed (nothing starts: a preview).
        r = admin.post(
            f"/api/v1/jobs/{job}/reconfigurations/preview",
            json={"origin": "migrate", "task": "count-0", "worker": "new"},
        )
        assert r.status_code == 200, r.text
        # Plans on existing workers stay open to operate.
        a = admin.get(f"/api/v1/jobs/{job}/abstraction").json()
        count = next(o for o in a["operators"] if o["name"] == "count")
        here = next(t for t in count["tasks"] if t["id"] == "count-0")["resources"]["worker"]
        there = next(w for w in workers_before if w != here)
        r = operator.post(
            f"/api/v1/jobs/{job}/reconfigurations/preview",
            json={"origin": "migrate", "task": "count-0", "worker": there},
        )
        assert r.status_code == 200, r.text


def test_starting_workers_counts_against_the_server_maximum(api: Api, job: int) -> None:
    most = DEFAULTS.max_workers
    with api.client() as admin:
        alive = len(_alive(admin))
        over = most - alive + 1
        assert 1 <= over <= 16  # POST /workers takes at most 16 at once
        message = _error(admin.post("/api/v1/workers", json={"count": over}), 409, "worker_limit")
        assert f"at most {most}" in message and "STREAMPILOT_MAX_WORKERS" in message
        # A plan asking for as many fresh workers is refused the same way, previewed or posted.
        scale = {"operator": "count", "parallelism": 2 + over, "workers": ["new"]}
        r = admin.post(
            f"/api/v1/jobs/{job}/reconfigurations/preview", json={"origin": "scale", **scale}
        )
        assert f"at most {most}" in _error(r, 409, "worker_limit")
        r = admin.post(f"/api/v1/jobs/{job}/scale", json=scale)
        assert f"at most {most}" in _error(r, 409, "worker_limit")
        assert len(_alive(admin)) == alive
        assert admin.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


def test_bodies_over_the_limit_are_refused_before_they_are_read(api: Api, job: int) -> None:
    limit = DEFAULTS.max_request_bytes
    big = b"{" + b" " * limit + b"}"
    with api.client() as admin:
        r = admin.post(
            f"/api/v1/jobs/{job}/reconfigurations",
            content=big,
            headers={"content-type": "application/json"},
        )
        assert str(limit) in _error(r, 413, "payload_too_large")

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            yield b'{"name": "'
            for _ in range(limit // 65536 + 2):
                yield b"x" * 65536
            yield b'"}'

        r = admin.post(
            "/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
        )
        assert str(limit) in _error(r, 413, "payload_too_large")
        assert admin.get("/healthz").status_code == 200


def test_a_plan_over_the_operation_limit_is_refused(api: Api, job: int) -> None:
    most = DEFAULTS.max_plan_ops
    with api.client() as admin:
        version = _version(admin, job)
        op = {"op": "assignLogic", "operator": "count", "ref": "examples.wordcount:count_word"}
        r = admin.post(
            f"/api/v1/jobs/{job}/reconfigurations",
            json={"base_version": version, "ops": [op] * (most + 1)},
        )
        message = _error(r, 422, "plan_too_large")
        assert str(most + 1) in message and str(most) in message


def test_errors_do_not_echo_huge_values(api: Api, job: int) -> None:
    huge = "x" * (DEFAULTS.max_request_bytes // 2)
    with api.client() as admin:
        for path, body in (
            ("scale", {"operator": huge, "parallelism": 2}),
            ("migrate", {"task": huge, "worker": huge}),
            ("logic", {"operator": "count", "logic": huge}),
        ):
            r = admin.post(f"/api/v1/jobs/{job}/{path}", json=body)
            assert 400 <= r.status_code < 500, r.text[:300]
            assert len(r.content) < 2 * MAX_MESSAGE_CHARS + 500, (path, len(r.content))
        # Many bad fields: the first are named, not all.
        r = admin.post("/api/v1/tokens", json={"name": "t", "scopes": ["nope"] * 50_000})
        assert r.status_code == 422 and len(r.content) < 20 * MAX_MESSAGE_CHARS, len(r.content)
