"""The restart policy over REST against real servers (uvicorn, 2 local workers, SQLite or
PostgreSQL), and what a recorded job takes to be deployed again.

- A submission's ``restart`` settings over the server's defaults: the policy shown in the
  job, handed to the coordinator, refusals that name the field.
- :func:`~controlplane.jobs.service.rebuild_graph` of a row the server recorded gives the
  graph the submission deployed (operators, kinds, parallelism, edges, logic), in the same
  directory and with the same confinement of its sinks, and refuses a job whose code is
  no longer registered; :func:`~controlplane.jobs.service.policies_of` gives back the
  policies the job was deployed with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import (
    ADMIN_TOKEN,
    TEST_JOB_MODULES,
    Api,
    ServerThread,
    free_port,
    postgres_database,
)

from controlplane.checkpoints.policy import (
    restart_from_document,
    restart_policy_for,
    restart_to_document,
    to_document,
)
from controlplane.checkpoints.schemas import RestartSettings
from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, RestartPolicy
from controlplane.engine import job_key
from controlplane.errors import BadJob
from controlplane.jobs.build import job_dir
from controlplane.jobs.models import JobRecord
from controlplane.jobs.service import policies_of, rebuild_graph
from runtime.dataflow import JobGraph, logic_ref
from tests.test_api_checkpoints import BOUNDED, submit, unit_of_work

DEFAULTS = {"max_failures": 3, "window_s": 60.0, "delay_s": 0.0}
COUNTS = {"name": "counts", "job": "tests.jobs_for_tests:build_counts", "params": {"records": 50}}


# -- the policy a job runs with, on the shared servers ----------------------------------------


def test_a_job_submitted_without_a_restart_policy_runs_with_the_server_defaults(api: Api) -> None:
    with api.client() as http:
        job = submit(http, BOUNDED)
        assert job["restart"] == DEFAULTS
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["restart"] == DEFAULTS
        listed = http.get("/api/v1/jobs", params={"limit": 500}).json()["items"]
        assert next(j for j in listed if j["id"] == job["id"])["restart"] == DEFAULTS
        assert submit(http, {**BOUNDED, "restart": {}})["restart"] == DEFAULTS


@pytest.mark.parametrize(
    ("asked", "effective"),
    [
        ({"max_failures": 0}, {**DEFAULTS, "max_failures": 0}),
        ({"max_failures": 10}, {**DEFAULTS, "max_failures": 10}),
        ({"window_s": 300, "delay_s": 1.5}, {**DEFAULTS, "window_s": 300.0, "delay_s": 1.5}),
        (
            {"max_failures": 1, "window_s": 0.5, "delay_s": 0},
            {"max_failures": 1, "window_s": 0.5, "delay_s": 0.0},
        ),
        ({"max_failures": None, "window_s": None, "delay_s": None}, DEFAULTS),  # the defaults
    ],
)
def test_a_submission_s_restart_settings_go_over_the_defaults(
    api: Api, asked: dict[str, Any], effective: dict[str, Any]
) -> None:
    with api.client() as http:
        job = submit(http, {**BOUNDED, "restart": asked})
        assert job["restart"] == effective
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["restart"] == effective


@pytest.mark.parametrize(
    ("restart", "field", "words"),
    [
        ({"max_failures": -1}, "body.restart.max_failures", "greater than or equal to 0"),
        ({"max_failures": 2.5}, "body.restart.max_failures", "valid integer"),
        ({"max_failures": "often"}, "body.restart.max_failures", "valid integer"),
        ({"window_s": 0}, "body.restart.window_s", "greater than 0"),
        ({"window_s": -60}, "body.restart.window_s", "greater than 0"),
        ({"window_s": "inf"}, "body.restart.window_s", "finite number"),
        ({"delay_s": -0.5}, "body.restart.delay_s", "greater than or equal to 0"),
        ({"delay_s": "soon"}, "body.restart.delay_s", "valid number"),
        ({"retries": 3}, "body.restart.retries", "Extra inputs are not permitted"),
        (None, "body.restart", "valid dictionary"),
        (3, "body.restart", "valid dictionary"),
    ],
)
def test_bad_restart_settings_are_422_naming_the_field(
    api: Api, restart: Any, field: str, words: str
) -> None:
    with api.client() as http:
        before = http.get("/api/v1/jobs", params={"limit": 1}).json()["total"]
        r = http.post("/api/v1/jobs", json={**BOUNDED, "restart": restart})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_request"
        assert [d["field"] for d in error["details"]] == [field]
        assert field in error["message"] and words in error["message"]
        assert http.get("/api/v1/jobs", params={"limit": 1}).json()["total"] == before


def test_restart_policy_for_merges_a_request_over_the_settings() -> None:
    """The merge itself: a field left out or null takes the setting; 0 is a value."""
    settings = Settings(restart_max_failures=5, restart_window_s=120, restart_delay_s=2)
    assert restart_policy_for(settings, None) == RestartPolicy(5, 120.0, 2.0)
    assert restart_policy_for(settings, RestartSettings()) == RestartPolicy(5, 120.0, 2.0)
    asked = RestartSettings(max_failures=0, delay_s=0)
    assert restart_policy_for(settings, asked) == RestartPolicy(0, 120.0, 0.0)
    asked = RestartSettings(max_failures=None, window_s=10)
    policy = restart_policy_for(settings, asked)
    assert policy == RestartPolicy(5, 10.0, 2.0)
    assert restart_to_document(policy) == {"max_failures": 5, "window_s": 10.0, "delay_s": 2.0}
    assert restart_from_document(restart_to_document(policy), settings) == policy
    # A job recorded before restart policies were: the server's defaults.
    assert restart_from_document(None, settings) == RestartPolicy(5, 120.0, 2.0)
    assert restart_policy_for(Settings(), None) == RestartPolicy()


def test_restart_settings_are_validated_at_start_up() -> None:
    for bad in (
        {"restart_max_failures": -1},
        {"restart_max_failures": 1.5},
        {"restart_window_s": 0},
        {"restart_window_s": "inf"},
        {"restart_delay_s": -1},
        {"restart_delay_s": "nan"},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Settings(**bad)
    assert Settings(restart_max_failures=0).restart_max_failures == 0


# -- a server of its own: its defaults, its coordinator, its recorded rows --------------------


@dataclass
class Server:
    api: Api
    settings: Settings
    app: Any


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A server whose restart defaults are not the built-in ones (at most 1 failure in 5 s,
    0.25 s apart), on SQLite or PostgreSQL; yields it with its settings and application."""
    tmp = tmp_path_factory.mktemp("restart-policy")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp}/streampilot.db"
        else:
            url = stack.enter_context(postgres_database())
        settings = Settings(
            database_url=url,
            port=free_port(),
            local_workers=2,
            admin_token=ADMIN_TOKEN,
            log_level="WARNING",
            data_dir=tmp / "data",
            job_modules=TEST_JOB_MODULES,
            restart_max_failures=1,
            restart_window_s=5,
            restart_delay_s=0.25,
        )
        thread = ServerThread(settings)
        thread.start()
        stack.callback(thread.stop)
        yield Server(Api(thread.base_url, url, request.param), settings, thread.server.config.app)


def recorded(server: Server, job_id: int) -> JobRecord:
    """The job's row as the server recorded it, read in a session of its own."""
    with unit_of_work(server.api.database_url) as session:
        job = session.get(JobRecord, job_id)
        assert job is not None
        return job


def test_the_server_s_restart_settings_are_the_defaults_and_the_coordinator_gets_the_policy(
    server: Server,
) -> None:
    coordinator = server.app.state.engine.coordinator
    with server.api.client() as http:
        plain = submit(http, BOUNDED)
        asked = submit(http, {**BOUNDED, "restart": {"max_failures": 4, "delay_s": 0}})
    assert plain["restart"] == {"max_failures": 1, "window_s": 5.0, "delay_s": 0.25}
    assert asked["restart"] == {"max_failures": 4, "window_s": 5.0, "delay_s": 0.0}
    assert coordinator.jobs[job_key(plain["id"])].failures.policy == RestartPolicy(1, 5.0, 0.25)
    assert coordinator.jobs[job_key(asked["id"])].failures.policy == RestartPolicy(4, 5.0, 0.0)


def structure(graph: JobGraph) -> list[tuple[Any, ...]]:
    """Per operator: name, kind, parallelism, key groups (keyed), inputs, logic's ref."""
    return [
        (
            op.name,
            op.kind,
            op.parallelism,
            op.max_parallelism if op.keyed else None,
            [(i.upstream, i.partitioning) for i in op.inputs],
            logic_ref(op.logic),
        )
        for op in graph.operators
    ]


def deployed(http: httpx.Client, job_id: int) -> list[tuple[Any, ...]]:
    """:func:`structure` of what the submission deployed: the job's abstraction version 1."""
    document = http.get(f"/api/v1/jobs/{job_id}/abstraction", params={"version": 1}).json()
    return [
        (
            op["name"],
            op["transform"],
            len(op["tasks"]),
            op["max_parallelism"],
            [(i["upstream"], i["partitioning"]) for i in op["inputs"]],
            op["tasks"][0]["logic"]["ref"],
        )
        for op in document["operators"]
    ]


@pytest.mark.parametrize(
    "body",
    [
        {**BOUNDED, "params": {"records": 200, "output": "out"}},
        {
            **COUNTS,
            "params": {"records": 50, "parallelism": 3},
            "checkpoints": {"interval_s": None},
        },
        {"name": "by-entry-point", "job": "wordcount", "params": {"records": 100}},
    ],
    ids=["wordcount", "counts-3", "entry-point"],
)
def test_rebuild_graph_gives_the_graph_the_submission_deployed(
    server: Server, body: dict[str, Any]
) -> None:
    with server.api.client() as http:
        job = submit(http, body)
        submitted = deployed(http, job["id"])
    row = recorded(server, job["id"])
    assert (row.job_ref, row.params, row.write_anywhere) == (body["job"], body["params"], True)
    graph = rebuild_graph(settings=server.settings, job=row)
    running = server.app.state.engine.coordinator.jobs[job_key(job["id"])].graph
    assert structure(graph) == structure(running) == submitted
    assert graph.name == running.name


def test_policies_of_gives_back_the_policies_the_job_was_deployed_with(server: Server) -> None:
    with server.api.client() as http:
        asked = submit(
            http,
            {
                **BOUNDED,
                "checkpoints": {"interval_s": 2, "retained": 4},
                "restart": {"max_failures": 0, "window_s": 30},
            },
        )
        off = submit(http, {**BOUNDED, "checkpoints": {"interval_s": None}})
    checkpoints, restart = policies_of(recorded(server, asked["id"]), server.settings)
    assert checkpoints == CheckpointPolicy(interval_s=2.0, timeout_s=60.0, retained=4)
    assert restart == RestartPolicy(max_failures=0, window_s=30.0, delay_s=0.25)
    assert to_document(checkpoints) == asked["checkpoints"]
    assert restart_to_document(restart) == asked["restart"]
    assert policies_of(recorded(server, off["id"]), server.settings) == (
        None,
        RestartPolicy(1, 5.0, 0.25),
    )


def test_a_rebuilt_job_s_sinks_are_confined_as_its_submission_s_were(
    server: Server, tmp_path: Path
) -> None:
    """An admin's job may write anywhere, and so may its rebuilt graph; an operate token's
    job is recorded confined to its directory, which the rebuild applies again."""
    outside = str(tmp_path / "anywhere")
    body = {**BOUNDED, "params": {"records": 100, "output": outside}}
    with server.api.client() as admin:
        anywhere = submit(admin, body)
        token = admin.post("/api/v1/tokens", json={"name": "op", "scopes": ["operate"]}).json()
    with server.api.client(token["token"]) as operate:
        confined = submit(operate, {**body, "params": {"records": 100, "output": "out"}})
        r = operate.post("/api/v1/jobs", json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "sink_path_refused"

    row = recorded(server, anywhere["id"])
    assert row.write_anywhere is True
    rebuild_graph(settings=server.settings, job=row)
    row.write_anywhere = False  # the row as an operate token's submission (not written)
    with pytest.raises(BadJob) as refused:
        rebuild_graph(settings=server.settings, job=row)
    assert refused.value.code == "sink_path_refused"
    assert outside in refused.value.message
    assert str(job_dir(server.settings, job_key(anywhere["id"]))) in refused.value.message

    row = recorded(server, confined["id"])
    assert row.write_anywhere is False
    graph = rebuild_graph(settings=server.settings, job=row)
    assert [op.name for op in graph.operators] == ["sentences", "split", "count", "sink"]


def test_rebuild_graph_refuses_a_job_whose_code_is_no_longer_registered(server: Server) -> None:
    with server.api.client() as http:
        job = submit(http, COUNTS)
    row = recorded(server, job["id"])
    assert structure(rebuild_graph(settings=server.settings, job=row))  # registered: builds

    # The installation no longer declares the job's module.
    without = server.settings.model_copy(update={"job_modules": []})
    with pytest.raises(BadJob) as gone:
        rebuild_graph(settings=without, job=row)
    assert gone.value.code == "bad_job_ref"
    message = gone.value.message
    assert message.startswith(
        f"job {job['id']} (counts) cannot be built again: its code is no longer registered: "
        "job 'tests.jobs_for_tests:build_counts' is not registered code: module "
        "'tests.jobs_for_tests' is not registered"
    )
    assert "STREAMPILOT_JOB_MODULES" in message  # how to register it

    # The module no longer defines the callable.
    row.job_ref = "tests.jobs_for_tests:build_removed"
    with pytest.raises(BadJob) as gone:
        rebuild_graph(settings=server.settings, job=row)
    assert gone.value.code == "bad_job_ref"
    assert f"job {job['id']} (counts) cannot be built again" in gone.value.message
    assert "'build_removed' is not a function or class defined" in gone.value.message
