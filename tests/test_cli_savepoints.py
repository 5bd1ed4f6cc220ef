"""The CLI's savepoint commands (Typer's CliRunner) against a real StreamManager: ``job
stop --savepoint``, ``savepoints trigger|list|show|delete`` and ``job submit
--from-savepoint`` at another parallelism, and their errors (one line, exit 1)."""

from __future__ import annotations

from api_support import Api, wait_until

from tests.test_cli_rest import cli, error_line, ok, ok_json

COUNTING = ["tests.e2e_jobs:counting_job", "-p", "records=0", "-p", "rate=2000"]


def checkpointed_job(api: Api) -> int:
    """A running counting job with a completed checkpoint, submitted through the CLI."""
    job = ok_json(cli(api, "job", "submit", *COUNTING, "--checkpoint-interval", "0.2", "--json"))
    assert job["status"] == "running", job["error"]

    def checkpointed() -> bool:
        page = ok_json(cli(api, "checkpoints", "list", job["id"], "--json"))
        return any(c["status"] == "completed" for c in page["items"])

    wait_until(checkpointed, 60, "a completed checkpoint", every=0.2)
    return job["id"]


def test_trigger_stop_with_a_savepoint_and_submit_from_it(api: Api) -> None:
    job_id = checkpointed_job(api)
    taken = ok_json(cli(api, "savepoints", "trigger", job_id, "--json"))
    assert taken["status"] == "completed" and taken["ref"] == f"{job_id}/{taken['savepoint_id']}"
    shown = ok(cli(api, "savepoints", "show", job_id, taken["savepoint_id"]))
    assert taken["ref"] in shown and "completed" in shown

    stopped = ok_json(cli(api, "job", "stop", job_id, "--savepoint", "--json"))
    assert stopped["status"] == "stopped"
    last = stopped["savepoint"]
    assert last["status"] == "completed" and last["savepoint_id"] > taken["savepoint_id"]
    listing = ok(cli(api, "savepoints", "list", job_id))
    assert last["ref"] in listing and taken["ref"] in listing and "2 of 2 savepoints" in listing

    job = ok_json(
        cli(
            api,
            "job",
            "submit",
            *COUNTING,
            "-p",
            "parallelism=3",
            "--checkpoint-interval",
            "0.2",
            "--from-savepoint",
            last["ref"],
            "--json",
        )
    )
    try:
        assert job["status"] == "running" and job["from_savepoint"] == last["ref"]
        assert last["ref"] in ok(cli(api, "job", "show", job["id"]))
    finally:
        ok(cli(api, "job", "stop", job["id"]))
    said = ok(cli(api, "savepoints", "delete", job_id, taken["savepoint_id"]))
    assert f"savepoint {taken['ref']} deleted" in said
    error_line(
        cli(api, "savepoints", "show", job_id, taken["savepoint_id"]),
        1,
        f"job {job_id} has no savepoint {taken['savepoint_id']}",
    )


def test_savepoint_refusals_are_one_line_and_exit_1(api: Api) -> None:
    job = ok_json(cli(api, "job", "submit", *COUNTING, "--checkpoint-interval", "off", "--json"))
    try:
        error_line(cli(api, "job", "stop", job["id"], "--savepoint"), 1, "takes no checkpoints")
        assert ok_json(cli(api, "job", "show", job["id"], "--json"))["status"] == "running"
    finally:
        ok(cli(api, "job", "stop", job["id"]))
    error_line(
        cli(api, "job", "submit", *COUNTING, "--from-savepoint", "999999/1"),
        1,
        "job 999999 does not exist",
    )
    error_line(cli(api, "savepoints", "trigger", 999999), 1, "job 999999 does not exist")
