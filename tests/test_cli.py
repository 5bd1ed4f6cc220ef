"""The streampilot CLI, through Typer's CliRunner, on real local workers."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from controlplane.cli import app

runner = CliRunner()


@pytest.mark.slow
def test_run_prints_a_summary(no_leftover_processes: None) -> None:
    result = runner.invoke(
        app, ["run", "examples.wordcount:build", "--param", "records=5000", "--workers", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "finished" in result.output
    assert "5,000 source records" in result.output
    assert "40,000 sink records" in result.output
    assert "p99" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "examples.wordcount:build", "-p", "records=lots"],
            "param 'records' must be an int",
        ),
        (["run", "examples.wordcount:build", "-p", "colour=blue"], "unknown param(s) colour"),
        (
            ["run", "examples.wordcount:build", "-p", "parallelism=0"],
            "param 'parallelism' must be >= 1",
        ),
        (["run", "examples.wordcount"], "must look like package.module:callable"),
        (["run", "examples.nosuchjob:build"], "cannot import module 'examples.nosuchjob'"),
        (["run", "examples.wordcount:nosuch"], "has no 'nosuch'"),
    ],
)
def test_bad_input_gets_one_clear_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_param_without_equals_is_refused() -> None:
    result = runner.invoke(app, ["run", "examples.wordcount:build", "-p", "records"])
    assert result.exit_code == 2
    assert "NAME=VALUE" in result.output


@pytest.mark.slow
def test_failed_job_exits_1_with_its_cause(no_leftover_processes: None) -> None:
    result = runner.invoke(app, ["run", "tests.e2e_jobs:failing_job"])
    assert result.exit_code == 1
    assert "poisoned count for k00007" in result.output


@pytest.mark.slow
def test_demo_reconfigures_through_rest_and_checks_the_counts(
    no_leftover_processes: None,
) -> None:
    result = runner.invoke(app, ["demo", "--duration", "6", "--rate", "1500"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "console: http://127.0.0.1:" in out and "/docs" in out
    assert "job 1 submitted: running" in out
    assert "scale, completed (version 1 -> 2" in out
    # A rebalance of an even load is refused as having nothing to do; either is shown.
    assert "rebalance, completed" in out or "nothing to do: operator 'count' is already" in out
    assert "logic, completed" in out and "count_word_v2" in out
    assert out.count("timings: prepare") >= 2
    assert "job 1: finished" in out
    assert "final counts are right" in out and "equal word for word" in out
