"""Checkpoints over REST against a real server (uvicorn, 2 local workers, SQLite or
PostgreSQL): the policy a job is submitted with (a submission's settings over the server's
defaults, shown in the job and handed to the coordinator), refusals that name the field,
and the records the checkpoints service writes (``record`` with a real database session,
from real :class:`CheckpointReport` reports) read back: newest first, by status, by page,
one by one, 404 naming the job or the checkpoint.

The coordinator does not take checkpoints here: the jobs whose records are written are
submitted with checkpoints off, so that only the rows the tests write are there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
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
    wait_until,
)

from controlplane import db
from controlplane.checkpoints import service as checkpoints
from controlplane.checkpoints.policy import from_document, policy_for, to_document
from controlplane.checkpoints.schemas import CheckpointSettings
from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, CheckpointReport
from controlplane.engine import job_key
from controlplane.errors import NotFound
from controlplane.jobs.models import JobRecord
from controlplane.statuses import CheckpointStatus

BOUNDED: dict[str, Any] = {
    "name": "checkpointed",
    "job": "examples.wordcount:build",
    "params": {"records": 200},
}
UNCHECKPOINTED = {**BOUNDED, "name": "records-only", "checkpoints": {"interval_s": None}}
DEFAULTS = {"interval_s": 10.0, "timeout_s": 60.0, "retained": 3, "full_every": 8}
STARTED = 1_790_000_000.25  # epoch seconds of the first checkpoint the tests record


def submit(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


@contextlib.contextmanager
def unit_of_work(database_url: str) -> Iterator[Any]:
    """A session on the server's database, committed at the end (as the engine's writes
    are)."""
    engine = db.make_engine(database_url)
    try:
        with db.unit_of_work(db.session_factory(engine)) as session:
            yield session
    finally:
        engine.dispose()


def report(checkpoint_id: int, job_id: int, **fields: Any) -> dict[str, Any]:
    """What the coordinator reports of a checkpoint of job ``job_id``."""
    fields.setdefault("version", 1)
    fields.setdefault("started_at", STARTED + checkpoint_id)
    return CheckpointReport(id=checkpoint_id, job_id=job_key(job_id), **fields).reported()


def record_history(database_url: str, job_id: int) -> None:
    """Checkpoints 3, 5, 8 and 9 of the job, reported as a coordinator would: 3 completed
    and later discarded by retention, 5 completed (and a late ``in_progress`` report of it
    ignored), 8 abandoned, 9 in progress then completed."""
    done = CheckpointStatus.COMPLETED
    reports = [
        report(3, job_id, version=1, tasks=8),
        report(3, job_id, version=1, status=done, path="ck/3", bytes=4096, full_bytes=4096,
               tasks=8, duration_ms=41.5),
        report(5, job_id, version=1, status=done, path="ck/5", bytes=512, full_bytes=4200,
               tasks=8, duration_ms=12.0),
        report(8, job_id, version=2, status=CheckpointStatus.ABANDONED,
               error="timed out after 60s: count-1 did not report", tasks=8, duration_ms=60000.0),
        report(9, job_id, version=2, tasks=8),
        report(3, job_id, version=1, status=CheckpointStatus.DISCARDED, path="ck/3",
               bytes=4096, full_bytes=4096, tasks=8, duration_ms=41.5),
        report(5, job_id, version=1, tasks=3),  # late: 5 has completed
        report(9, job_id, version=2, status=done, path="ck/9", bytes=700, full_bytes=4300,
               tasks=8, duration_ms=15.25),
    ]  # fmt: skip
    for reported in reports:
        with unit_of_work(database_url) as session:
            checkpoints.record(session=session, job_db_id=job_id, reported=reported)


@pytest.fixture(scope="module")
def recorded(api: Api) -> int:
    """A job (per server) with the checkpoints of :func:`record_history` recorded."""
    with api.client() as http:
        job_id = submit(http, UNCHECKPOINTED)["id"]
    record_history(api.database_url, job_id)
    return job_id


# -- the policy a job runs with ----------------------------------------------------------------


def test_a_job_submitted_without_checkpoints_runs_with_the_server_defaults(api: Api) -> None:
    with api.client() as http:
        job = submit(http, BOUNDED)
        assert job["checkpoints"] == DEFAULTS
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["checkpoints"] == DEFAULTS
        listed = http.get("/api/v1/jobs", params={"limit": 500}).json()["items"]
        assert next(j for j in listed if j["id"] == job["id"])["checkpoints"] == DEFAULTS
        assert submit(http, {**BOUNDED, "checkpoints": {}})["checkpoints"] == DEFAULTS


@pytest.mark.parametrize(
    ("asked", "effective"),
    [
        ({"interval_s": 2.5}, {**DEFAULTS, "interval_s": 2.5}),
        ({"retained": 5}, {**DEFAULTS, "retained": 5}),
        (
            {"interval_s": 30, "timeout_s": 5, "retained": 1},
            {**DEFAULTS, "interval_s": 30.0, "timeout_s": 5.0, "retained": 1},
        ),
        ({"timeout_s": None, "retained": None}, DEFAULTS),  # null: the server's default
        ({"interval_s": None}, None),
        ({"interval_s": None, "retained": 7}, None),
    ],
)
def test_a_submission_s_checkpoint_settings_go_over_the_defaults(
    api: Api, asked: dict[str, Any], effective: dict[str, Any] | None
) -> None:
    with api.client() as http:
        job = submit(http, {**BOUNDED, "checkpoints": asked})
        assert job["checkpoints"] == effective
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["checkpoints"] == effective


@pytest.mark.parametrize(
    ("checkpoints", "delivery"),
    [
        ({}, {"committed": "exactly-once", "plain": "at-least-once"}),
        ({"interval_s": None}, {"committed": "none", "plain": "none"}),
    ],
)
def test_a_job_says_what_each_sink_guarantees_through_failures(
    api: Api, checkpoints: dict[str, Any], delivery: dict[str, str]
) -> None:
    body = {"name": "two-sinks", "job": "tests.e2e_jobs:two_sinks_job", "checkpoints": checkpoints}
    with api.client() as http:
        job = submit(http, body)
        assert job["delivery"] == delivery
        assert http.get(f"/api/v1/jobs/{job['id']}").json()["delivery"] == delivery
        (submitted,) = [
            e
            for e in http.get("/api/v1/events", params={"job_id": job["id"]}).json()["items"]
            if e["kind"] == "job.submitted"
        ]
        assert submitted["data"]["delivery"] == delivery


@pytest.mark.parametrize(
    ("checkpoints", "field", "words"),
    [
        ({"interval_s": 0}, "body.checkpoints.interval_s", "greater than or equal to 0.1"),
        ({"interval_s": 0.01}, "body.checkpoints.interval_s", "greater than or equal to 0.1"),
        ({"interval_s": -5}, "body.checkpoints.interval_s", "greater than or equal to 0.1"),
        ({"interval_s": "often"}, "body.checkpoints.interval_s", "valid number"),
        ({"timeout_s": 0}, "body.checkpoints.timeout_s", "greater than 0"),
        ({"retained": 0}, "body.checkpoints.retained", "greater than or equal to 1"),
        ({"retained": 2.5}, "body.checkpoints.retained", "valid integer"),
        ({"every": 10}, "body.checkpoints.every", "Extra inputs are not permitted"),
        (None, "body.checkpoints", "valid dictionary"),
        ("off", "body.checkpoints", "valid dictionary"),
    ],
)
def test_bad_checkpoint_settings_are_422_naming_the_field(
    api: Api, checkpoints: Any, field: str, words: str
) -> None:
    with api.client() as http:
        before = http.get("/api/v1/jobs", params={"limit": 1}).json()["total"]
        r = http.post("/api/v1/jobs", json={**BOUNDED, "checkpoints": checkpoints})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_request"
        assert [d["field"] for d in error["details"]] == [field]
        assert field in error["message"] and words in error["message"]
        assert http.get("/api/v1/jobs", params={"limit": 1}).json()["total"] == before


def test_policy_for_merges_a_request_over_the_settings() -> None:
    """The merge itself, over server defaults a test cannot give the shared server."""
    off = Settings(checkpoint_interval_s=0, checkpoint_timeout_s=20, checkpoints_retained=2)
    assert policy_for(off, None) is None
    assert policy_for(off, CheckpointSettings()) is None
    assert policy_for(off, CheckpointSettings(retained=4)) is None
    assert policy_for(off, CheckpointSettings(interval_s=5)) == CheckpointPolicy(5.0, 20.0, 2)
    on = Settings(checkpoint_interval_s=1.5)
    assert policy_for(on, None) == CheckpointPolicy(1.5, 60.0, 3)
    assert policy_for(on, CheckpointSettings(interval_s=None)) is None
    policy = policy_for(on, CheckpointSettings(timeout_s=9))
    assert policy == CheckpointPolicy(1.5, 9.0, 3)
    assert from_document(to_document(policy)) == policy
    assert to_document(None) is None and from_document(None) is None


def test_checkpoint_settings_are_validated_at_start_up(tmp_path: Path) -> None:
    for bad in (
        {"checkpoint_interval_s": -1},
        {"checkpoint_interval_s": "inf"},
        {"checkpoint_timeout_s": 0},
        {"checkpoints_retained": 0},
        {"checkpoint_dir": ""},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Settings(**bad)
    here = Settings(data_dir=tmp_path / "data")
    assert here.checkpoint_location() == str((tmp_path / "data" / "checkpoints").resolve())
    ck = tmp_path / "ck"
    assert Settings(checkpoint_dir=str(ck)).checkpoint_location() == str(ck.resolve())
    uri = "s3://bucket/prefix?endpoint_override=127.0.0.1:9000"
    assert Settings(checkpoint_dir=uri).checkpoint_location() == uri


@pytest.fixture(scope="module")
def off_by_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Any]]:
    """A server of its own whose jobs are not checkpointed unless they ask
    (``checkpoint_interval_s=0``), on SQLite; yields it and its application."""
    tmp = tmp_path_factory.mktemp("checkpoints-off")
    settings = Settings(
        database_url=f"sqlite:///{tmp}/streampilot.db",
        port=free_port(),
        local_workers=2,
        admin_token=ADMIN_TOKEN,
        log_level="WARNING",
        data_dir=tmp / "data",
        job_modules=TEST_JOB_MODULES,
        checkpoint_interval_s=0,
        checkpoint_timeout_s=30,
        checkpoints_retained=2,
    )
    server = ServerThread(settings)
    server.start()
    try:
        yield Api(server.base_url, settings.database_url, "sqlite"), server.server.config.app
    finally:
        server.stop()


def test_a_server_default_of_0_means_no_checkpoints_and_the_coordinator_gets_the_policy(
    off_by_default: tuple[Api, Any],
) -> None:
    api, app = off_by_default
    coordinator = app.state.engine.coordinator
    with api.client() as http:
        plain = submit(http, BOUNDED)
        asked = submit(http, {**BOUNDED, "checkpoints": {"interval_s": 4}})
    assert plain["checkpoints"] is None
    assert asked["checkpoints"] == {
        "interval_s": 4.0,
        "timeout_s": 30.0,
        "retained": 2,
        "full_every": 8,
    }
    assert coordinator.jobs[job_key(plain["id"])].checkpoint_policy is None
    assert coordinator.jobs[job_key(asked["id"])].checkpoint_policy == CheckpointPolicy(
        4.0, 30.0, 2
    )


# -- the records ------------------------------------------------------------------------------


def test_checkpoints_are_listed_newest_first_as_last_reported(api: Api, recorded: int) -> None:
    with api.client() as http:
        r = http.get(f"/api/v1/jobs/{recorded}/checkpoints")
        assert r.status_code == 200, r.text
        page = r.json()
    assert (page["total"], page["limit"], page["offset"]) == (4, 50, 0)
    items = page["items"]
    assert [c["checkpoint_id"] for c in items] == [9, 8, 5, 3]
    assert [c["status"] for c in items] == ["completed", "abandoned", "completed", "discarded"]
    assert {c["job_id"] for c in items} == {recorded}
    nine, eight, five, _ = items
    assert {k: nine[k] for k in ("version", "path", "bytes", "full_bytes", "tasks")} == {
        "version": 2,
        "path": "ck/9",
        "bytes": 700,
        "full_bytes": 4300,
        "tasks": 8,
    }
    assert nine["duration_ms"] == 15.25 and nine["error"] is None
    assert datetime.fromisoformat(nine["started_at"]) == datetime.fromtimestamp(STARTED + 9, UTC)
    assert eight["error"] == "timed out after 60s: count-1 did not report"
    assert eight["path"] is None and eight["bytes"] == 0
    assert five["tasks"] == 8 and five["path"] == "ck/5"  # the late report changed nothing
    assert set(nine) == {
        "checkpoint_id",
        "job_id",
        "version",
        "status",
        "error",
        "path",
        "bytes",
        "full_bytes",
        "tasks",
        "started_at",
        "duration_ms",
        "created_at",
        "updated_at",
    }
    assert datetime.fromisoformat(nine["updated_at"]) >= datetime.fromisoformat(nine["created_at"])


@pytest.mark.parametrize(
    ("status", "ids"),
    [("completed", [9, 5]), ("abandoned", [8]), ("discarded", [3]), ("in_progress", [])],
)
def test_checkpoints_by_status(api: Api, recorded: int, status: str, ids: list[int]) -> None:
    with api.client() as http:
        page = http.get(f"/api/v1/jobs/{recorded}/checkpoints", params={"status": status}).json()
    assert [c["checkpoint_id"] for c in page["items"]] == ids
    assert page["total"] == len(ids)


def test_checkpoints_are_paginated(api: Api, recorded: int) -> None:
    url = f"/api/v1/jobs/{recorded}/checkpoints"
    with api.client() as http:
        seen = []
        for offset in (0, 2, 4):
            page = http.get(url, params={"limit": 2, "offset": offset}).json()
            assert (page["total"], page["limit"], page["offset"]) == (4, 2, offset)
            seen += [c["checkpoint_id"] for c in page["items"]]
        assert seen == [9, 8, 5, 3]
        page = http.get(url, params={"status": "completed", "limit": 1, "offset": 1}).json()
        assert [c["checkpoint_id"] for c in page["items"]] == [5] and page["total"] == 2
        r = http.get(url, params={"limit": 0})
        assert r.status_code == 422 and "query.limit" in r.json()["error"]["message"]


def test_one_checkpoint_and_404s_naming_what_is_missing(api: Api, recorded: int) -> None:
    with api.client() as http:
        listed = http.get(f"/api/v1/jobs/{recorded}/checkpoints").json()["items"]
        for expected in listed:
            r = http.get(f"/api/v1/jobs/{recorded}/checkpoints/{expected['checkpoint_id']}")
            assert r.status_code == 200, r.text
            assert r.json() == expected

        r = http.get(f"/api/v1/jobs/{recorded}/checkpoints/4")
        assert r.status_code == 404
        assert r.json()["error"] == {
            "code": "not_found",
            "message": f"job {recorded} has no checkpoint 4",
        }
        for path in ("/checkpoints", "/checkpoints/9"):
            r = http.get(f"/api/v1/jobs/987654{path}")
            assert r.status_code == 404
            assert r.json()["error"] == {
                "code": "not_found",
                "message": "job 987654 does not exist",
            }
        other = submit(http, UNCHECKPOINTED)["id"]  # checkpoint 9 is another job's
        r = http.get(f"/api/v1/jobs/{other}/checkpoints/9")
        assert r.status_code == 404 and f"job {other} has no checkpoint 9" in r.text
        assert http.get(f"/api/v1/jobs/{other}/checkpoints").json() == {
            "items": [],
            "total": 0,
            "limit": 50,
            "offset": 0,
        }


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/checkpoints?status=done", "query.status"),
        ("/checkpoints/0", "path.checkpoint_id"),
        (f"/checkpoints/{2**31}", "path.checkpoint_id"),
        ("/checkpoints/first", "path.checkpoint_id"),
    ],
)
def test_bad_queries_are_422_naming_the_parameter(
    api: Api, recorded: int, url: str, field: str
) -> None:
    with api.client() as http:
        r = http.get(f"/api/v1/jobs/{recorded}{url}")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == field


def test_reading_checkpoints_needs_a_token(api: Api, recorded: int) -> None:
    with api.client(token=None) as http:
        r = http.get(f"/api/v1/jobs/{recorded}/checkpoints")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database of its own at the schema's head (what the service does to every
    row, e.g. :func:`abandon_unfinished`, stays off the shared servers)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path}/checkpoints.db"
        else:
            url = stack.enter_context(postgres_database())
        db.upgrade(url)
        yield url


def test_latest_completed_and_unfinished_ones_abandoned(database: str) -> None:
    with unit_of_work(database) as session:
        job = JobRecord(name="j", job_ref="examples.wordcount:build", params={}, status="running")
        session.add(job)
        session.flush()
        job_id = job.id
        assert checkpoints.latest_completed(session=session, job_db_id=job_id) is None
        with pytest.raises(NotFound, match="job 987654 does not exist"):
            checkpoints.record(session=session, job_db_id=987654, reported=report(1, 987654))
    record_history(database, job_id)
    with unit_of_work(database) as session:
        latest = checkpoints.latest_completed(session=session, job_db_id=job_id)
        assert latest is not None and (latest.checkpoint_id, latest.path) == (9, "ck/9")
        rec = checkpoints.record(session=session, job_db_id=job_id, reported=report(11, job_id))
        assert (rec.checkpoint_id, rec.status, rec.bytes) == (11, "in_progress", 0)
    with unit_of_work(database) as session:
        latest = checkpoints.latest_completed(session=session, job_db_id=job_id)
        assert latest is not None and latest.checkpoint_id == 9  # 11 has not completed
        assert checkpoints.abandon_unfinished(session=session, reason="the server restarted") == 1
    with unit_of_work(database) as session:
        eleven = checkpoints.get(session=session, job_id=job_id, checkpoint_id=11)
        assert (eleven.status, eleven.error, eleven.duration_ms) == (
            "abandoned",
            "the server restarted",
            None,
        )
        assert checkpoints.abandon_unfinished(session=session, reason="again") == 0
        # A report written late, after the restart, does not bring it back.
        checkpoints.record(session=session, job_db_id=job_id, reported=report(11, job_id, tasks=2))
        assert checkpoints.get(session=session, job_id=job_id, checkpoint_id=11).tasks == 0


def test_a_running_job_s_checkpoints_are_recorded_as_the_coordinator_takes_them(api: Api) -> None:
    body = {
        "name": "checkpointed-live",
        "job": "examples.wordcount:build",
        "params": {"records": 0, "rate": 2000},
        "checkpoints": {"interval_s": 0.2, "retained": 2},
    }
    with api.running_job(body) as job_id, api.client() as http:

        def completed() -> list[dict[str, Any]] | None:
            r = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"status": "completed"})
            assert r.status_code == 200, r.text
            items = r.json()["items"]
            return items if len(items) >= 2 else None

        latest, _ = wait_until(completed, 60, f"2 completed checkpoints of job {job_id}")
        assert latest["version"] == 1 and latest["tasks"] > 0
        assert latest["bytes"] > 0 and latest["full_bytes"] >= latest["bytes"]
        assert latest["path"].endswith("_manifest.msgpack") and latest["duration_ms"] >= 0
        one = http.get(f"/api/v1/jobs/{job_id}/checkpoints/{latest['checkpoint_id']}")
        assert one.status_code == 200 and one.json()["status"] == "completed"

        def discarded() -> list[dict[str, Any]] | None:
            r = http.get(f"/api/v1/jobs/{job_id}/checkpoints", params={"status": "discarded"})
            return r.json()["items"] or None

        wait_until(discarded, 60, f"a checkpoint of job {job_id} discarded by retention")
