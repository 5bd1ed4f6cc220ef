"""Responses are gzip-compressed for clients that accept it, against a real server: the
series a console reads every few seconds (a keyed operator's heat map is the bulk of it)
arrives compressed and decodes to the same document; a client that asks for ``identity``
gets it plain, and a small body is never compressed."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from api_support import Api, wait_until

WORDCOUNT = {
    "name": "wordcount-gzip",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 500},
}
LOADS_TIMEOUT_S = 20.0  # deployment, then a step of key-group reports


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def _raw(api: Api, path: str, encoding: str) -> tuple[dict[str, str], bytes]:
    """Headers and the body as sent (not decoded) for ``Accept-Encoding: encoding``."""
    with (
        api.client() as http,
        http.stream("GET", path, headers={"Accept-Encoding": encoding}) as r,
    ):
        assert r.status_code == 200, r.read()
        return dict(r.headers), b"".join(r.iter_raw())


def _with_loads(api: Api, job_id: int) -> str:
    """The series path, once the count operator's key-group loads are in it."""
    path = f"/api/v1/jobs/{job_id}/metrics/series?window_s=300&step_s=2"

    def loaded() -> bool:
        with api.client() as http:
            body: dict[str, Any] = http.get(path).json()
        return any(any(row) for k in body["key_groups"] for row in k["records_per_s"])

    wait_until(loaded, LOADS_TIMEOUT_S, "key-group loads in the series", every=0.5)
    return path


@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_the_series_is_gzipped_for_a_client_that_accepts_it(api: Api, job: int) -> None:
    path = _with_loads(api, job)
    headers, sent = _raw(api, path, "gzip")
    assert headers["content-encoding"] == "gzip"
    body = json.loads(gzip.decompress(sent))
    assert body["job_id"] == job and body["key_groups"]
    assert len(sent) < len(gzip.decompress(sent))
    plain_headers, plain = _raw(api, path, "identity")
    assert "content-encoding" not in plain_headers
    assert set(json.loads(plain)) == set(body)


@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_a_small_body_is_sent_as_it_is(api: Api) -> None:
    headers, sent = _raw(api, "/healthz", "gzip")
    assert "content-encoding" not in headers
    assert json.loads(sent)["status"] == "ok"
