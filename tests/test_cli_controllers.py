"""``streampilot controller ...`` (Typer's CliRunner) against a real StreamManager: attach a
script and a built-in, follow decisions and logs, stop and start, and the error paths."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import Api, wait_until
from test_cli_rest import cli, error_line, ok, ok_json

WORDCOUNT = {
    "name": "cli-controlled",
    "job": "examples.wordcount:build",
    "params": {"rate": 500, "records": 0},
}

SCALER = textwrap.dedent(
    """
    from controllers import Controller, scale

    class ScaleToThree(Controller):
        def decide(self, view):
            print("count has", view.abstraction.operator("count").parallelism, "tasks")
            if view.abstraction.operator("count").parallelism < 3:
                return scale(view.abstraction, "count", 3)
            return None
    """
)


@pytest.fixture
def job(api: Api) -> Iterator[int]:
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def test_attach_follow_stop_and_start(api: Api, job: int, tmp_path: Path) -> None:
    script = tmp_path / "scaler.py"
    script.write_text(SCALER)
    c = ok_json(
        cli(api, "controller", "upload", job, script, "--config", '{"interval_s": 0.3}', "--json")
    )
    assert (c["name"], c["class_name"], c["status"]) == ("scaler", "ScaleToThree", "running")
    done = wait_until(
        lambda: [
            d
            for d in ok_json(cli(api, "controller", "decisions", c["id"], "--json"))["items"]
            if d["status"] == "completed"
        ],
        30,
        "the controller's plan to complete",
    )
    table = ok(cli(api, "controller", "decisions", c["id"]))
    assert "completed" in table and str(done[0]["reconfiguration_id"]) in table
    logs = wait_until(
        lambda: "count has 3 tasks" in (out := ok(cli(api, "controller", "logs", c["id"]))) and out,
        15,
        "the script's output in its log",
    )
    assert "count has 2 tasks" in logs and "host" in logs
    assert "stopped" in ok(cli(api, "controller", "stop", c["id"]))
    assert ok_json(cli(api, "controller", "show", c["id"], "--json"))["status"] == "stopped"
    assert "running" in ok(cli(api, "controller", "start", c["id"]))
    listed = ok(cli(api, "controller", "list", "--job", job))
    assert "scaler" in listed and "ScaleToThree" in listed


def test_builtin_dry_run(api: Api, job: int) -> None:
    config = '{"interval_s": 0.3, "logic": {"count": "examples.wordcount:count_word_v2"}}'
    c = ok_json(
        cli(
            api,
            "controller",
            "upload",
            job,
            "--builtin",
            "logic_updater",
            "--config",
            config,
            "--dry-run",
            "--json",
        )
    )
    assert c["builtin"] == "logic_updater" and c["safety"]["dry_run"] is True
    decisions = wait_until(
        lambda: ok_json(cli(api, "controller", "decisions", c["id"], "--json"))["items"],
        15,
        "a dry-run decision",
    )
    # The first decision (the list is newest first): the next ones, 0.3 s apart, are
    # refused by the cooldown that the dry run started.
    d = decisions[-1]
    assert (d["status"], d["applied"]) == ("dry_run", False), d.get("error")
    ok(cli(api, "controller", "stop", c["id"]))


def test_errors(api: Api, job: int, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from controllers import Controller\nclass X(Controller:\n    pass\n")
    error_line(cli(api, "controller", "upload", job, broken), 1, "broken.py, line 2", "HTTP 422")
    error_line(cli(api, "controller", "upload", job), 2, "--builtin")
    error_line(
        cli(api, "controller", "upload", job, "--builtin", "load_balancer", "--config", "[1"),
        2,
        "--config is not JSON",
    )
    error_line(
        cli(api, "controller", "upload", job, "--builtin", "nope"), 1, "no built-in controller"
    )
    error_line(cli(api, "controller", "show", 99999), 1, "controller 99999 does not exist")
    error_line(cli(api, "controller", "upload", job, tmp_path / "missing.py"), 2, "no such file")
