"""Issue 4 item 5: nothing a client sends can produce a 500. Schemathesis generates
requests from the app's own ``/openapi.json`` and sends them, with an admin token, to a
real server (uvicorn, 2 local workers, SQLite) that runs one job, so that generated ids
reach real jobs, abstractions and plans, not only 404s.

The operations to fuzz are those of ``create_app(...).openapi()``, read at collection
time (schemathesis' lazy ``from_fixture`` loader sets ``request.node._nodeid``, which
pytest 9.2 no longer has); ``test_the_fuzzed_schema_is_the_one_served`` checks that the
running server serves exactly that document at ``/openapi.json``.

Bounded and deterministic: ``derandomize`` and a fixed schemathesis seed give the same
requests on every run, ``MAX_EXAMPLES`` per operation keeps the file well under 90 s.

Checks: ``not_a_server_error`` (no 5xx) and ``response_schema_conformance`` (a response
whose status the OpenAPI declares matches the declared schema). Status codes the app does
not declare (401/403/404/409/503, all in the uniform error body) are not checked here;
test_api_*.py checks those.

Excluded: ``POST /workers`` and ``DELETE /workers/{worker_id}`` start and stop worker
processes (and ``POST`` blocks up to the workers timeout per example); test_api_workers.py
covers them. ``DELETE /tokens/{token_id}`` is fuzzed, except for the token the fuzzer
itself authenticates with (revoking it would turn every later example into a 401).
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import requests
import schemathesis
from api_support import ADMIN_TOKEN, Api, running_server
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from controlplane.app import create_app
from controlplane.config import Settings

MAX_EXAMPLES = 20
SEED = 4242
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# Paced: unthrottled (rate 0), it took both cores for the whole module and slowed every
# request; the fuzzer needs a running job, not its speed.
JOB = {
    "name": "fuzz-target",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, int]]:
    """A server of its own (the fuzzer stops jobs and revokes tokens: no other test must
    share its state), with one running job; yields it and the admin token's id."""
    with running_server("sqlite", str(tmp_path_factory.mktemp("fuzz"))) as server:
        with server.client() as http:
            r = http.post("/api/v1/jobs", json=JOB)
            assert r.status_code == 201, r.text
            tokens = http.get("/api/v1/tokens").json()["items"]
        assert len(tokens) == 1, tokens
        yield server, tokens[0]["id"]


@pytest.fixture(scope="module")
def http_session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


# Building the app touches no database (the lifespan does); the URL only has to parse.
OPENAPI = create_app(Settings(database_url="sqlite:///unused.db")).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI).exclude(
    path_regex=r"^/api/v1/workers", method=["POST", "DELETE"]
)
schema.config.seed = SEED


def test_the_fuzzed_schema_is_the_one_served(fuzz_server: tuple[Api, int]) -> None:
    server, _ = fuzz_server
    with server.client() as http:
        assert http.get("/openapi.json").json() == OPENAPI


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,  # a real server on a shared 2-core box: latency is not under test
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_no_request_makes_a_server_error(
    case: schemathesis.Case, fuzz_server: tuple[Api, int], http_session: requests.Session
) -> None:
    server, own_token_id = fuzz_server
    if case.path == "/api/v1/tokens/{token_id}" and case.method.upper() == "DELETE":
        hypothesis.assume(case.path_parameters.get("token_id") != own_token_id)
    case.call_and_validate(
        base_url=server.base_url,
        session=http_session,
        headers=HEADERS,
        checks=[not_a_server_error, response_schema_conformance],
        timeout=60,
    )
