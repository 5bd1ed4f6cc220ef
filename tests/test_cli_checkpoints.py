"""The CLI's checkpoint commands (Typer's CliRunner) against a real StreamManager: ``job
submit --checkpoint-interval`` and ``--max-failures`` and the policies ``job show``
prints, ``checkpoints list``
(newest first, by status, by page) and ``checkpoints show`` over records the checkpoints
service wrote, and their errors (404 naming the job or checkpoint, bad usage)."""

from __future__ import annotations

import pytest
from api_support import Api

from tests.test_api_checkpoints import UNCHECKPOINTED, record_history
from tests.test_cli_rest import cli, error_line, ok, ok_json

BOUNDED = ["examples.wordcount:build", "-p", "records=200"]


def unboxed(output: str) -> str:
    """Usage errors as one line: Typer draws them in a box, wrapped at 80 columns."""
    return " ".join(output.replace("│", " ").split())


@pytest.fixture(scope="module")
def recorded(api: Api) -> int:
    """A job submitted through the CLI with checkpoints off, with the checkpoints of
    :func:`record_history` recorded (per server)."""
    job = ok_json(cli(api, "job", "submit", *BOUNDED, "--checkpoint-interval", "off", "--json"))
    assert job["checkpoints"] is None and job["name"] == "wordcount"
    assert UNCHECKPOINTED["checkpoints"] == {"interval_s": None}  # the same as the API tests'
    record_history(api.database_url, job["id"])
    return job["id"]


@pytest.mark.parametrize(
    ("option", "interval", "shown"),
    [
        ([], 10.0, "every 10 s, timeout 60 s, 3 kept"),
        (["--checkpoint-interval", "2.5"], 2.5, "every 2.5 s, timeout 60 s, 3 kept"),
        (["--checkpoint-interval", "0"], None, "off"),
        (["--checkpoint-interval", "OFF"], None, "off"),
    ],
)
def test_submit_with_a_checkpoint_interval(
    api: Api, option: list[str], interval: float | None, shown: str
) -> None:
    job = ok_json(cli(api, "job", "submit", *BOUNDED, *option, "--json"))
    policy = job["checkpoints"]
    assert (policy and policy["interval_s"]) == interval
    assert (policy is None) == (interval is None)
    table = ok(cli(api, "job", "show", job["id"]))
    assert "checkpoints" in table and shown in table


@pytest.mark.parametrize("value", ["-3", "soon", "nan", "inf"])
def test_a_bad_checkpoint_interval_is_bad_usage(api: Api, value: str) -> None:
    result = cli(api, "job", "submit", *BOUNDED, "--checkpoint-interval", value)
    assert result.exit_code == 2, result.output
    said = unboxed(result.output)
    assert (
        f"--checkpoint-interval: expected seconds above 0, or 0 / off for no checkpoints; got '{value}'"
        in said
    )


@pytest.mark.parametrize(
    ("option", "max_failures", "shown"),
    [
        ([], 3, "recovers at most 3 times in 60 s, no delay"),
        (["--max-failures", "5"], 5, "recovers at most 5 times in 60 s, no delay"),
        (["--max-failures", "0"], 0, "recovers at most 0 times in 60 s, no delay"),
    ],
)
def test_submit_with_a_restart_policy(
    api: Api, option: list[str], max_failures: int, shown: str
) -> None:
    job = ok_json(cli(api, "job", "submit", *BOUNDED, *option, "--json"))
    assert job["restart"] == {"max_failures": max_failures, "window_s": 60.0, "delay_s": 0.0}
    table = ok(cli(api, "job", "show", job["id"]))
    assert "restarts" in table and shown in unboxed(table)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-1", "Input should be greater than or equal to 0"),
        ("many", "Input should be a valid integer"),
        ("1.5", "Input should be a valid integer"),
    ],
)
def test_a_bad_max_failures_is_bad_usage(api: Api, value: str, said: str) -> None:
    result = cli(api, "job", "submit", *BOUNDED, "--max-failures", value)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--max-failures': {said}" in unboxed(result.output)


def test_checkpoints_list(api: Api, recorded: int) -> None:
    page = ok_json(cli(api, "checkpoints", "list", recorded, "--json"))
    assert [c["checkpoint_id"] for c in page["items"]] == [9, 8, 5, 3]
    assert page["total"] == 4

    table = ok(cli(api, "checkpoints", "list", recorded))
    for word in ("completed", "abandoned", "discarded", "4.3 kB", "15.2 ms", "4 of 4 checkpoints"):
        assert word in table
    first_cells = [line.strip("│ ").split(" ", 1)[0] for line in table.splitlines() if "│" in line]
    assert [c for c in first_cells if c.isdigit()] == ["9", "8", "5", "3"], "newest first"

    completed = ok_json(
        cli(api, "checkpoints", "list", recorded, "--status", "completed", "--json")
    )
    assert [c["checkpoint_id"] for c in completed["items"]] == [9, 5]
    paged = ok(cli(api, "checkpoints", "list", recorded, "--limit", 2, "--offset", 1))
    assert "2 of 4 checkpoints; next: --offset 3" in paged

    result = cli(api, "checkpoints", "list", recorded, "--status", "done")
    assert result.exit_code == 2 and "in_progress" in result.output


def test_checkpoints_show(api: Api, recorded: int) -> None:
    shown = ok_json(cli(api, "checkpoints", "show", recorded, 8, "--json"))
    listed = ok_json(cli(api, "checkpoints", "list", recorded, "--json"))["items"]
    assert shown == next(c for c in listed if c["checkpoint_id"] == 8)

    table = ok(cli(api, "checkpoints", "show", recorded, 9))
    for word in ("completed", "ck/9", "700 B", "4.3 kB", "15.2 ms", "2026-"):
        assert word in table
    assert "timed out after 60s" in ok(cli(api, "checkpoints", "show", recorded, 8))


def test_checkpoint_errors(api: Api, recorded: int) -> None:
    error_line(
        cli(api, "checkpoints", "show", recorded, 4),
        1,
        f"job {recorded} has no checkpoint 4",
        "404",
    )
    error_line(cli(api, "checkpoints", "list", 999999), 1, "job 999999 does not exist", "404")
    error_line(cli(api, "checkpoints", "show", 999999, 1), 1, "job 999999 does not exist")
    error_line(cli(api, "checkpoints", "list", recorded, token=None), 1, "401")
    result = cli(api, "checkpoints", "show", recorded, 0)
    assert result.exit_code == 2
    assert "'checkpoint_id': Input should be greater than or equal to 1" in unboxed(result.output)
