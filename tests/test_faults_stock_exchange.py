"""The stock exchange example (``examples.stock_exchange``: order books, statistics,
alerts) with a worker SIGKILLed while it runs checkpointed: it recovers, and its trades,
final statistics and alerts, read from the committed sink files, equal the in-process
reference (``stock_exchange.reference``), every trade and alert once.

One order source task (``sources=1``), so that matching is deterministic (see the
example's docstring). The cluster is the module's own: 3 local workers, the job on two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.statuses import ReconfigurationStatus
from controlplane.testing import BackgroundCluster
from examples import stock_exchange
from runtime.dataflow import load_job
from tests.e2e_jobs import held_until_released
from tests.faults_support import (
    Events,
    assert_exact,
    finish_job,
    kill,
    stale_sink_files,
    start_job,
)

pytestmark = pytest.mark.slow

PARAMS = {"records": 30_000, "rate": 5_000, "sources": 1, "parallelism": 2, "omega": 600.0}


@pytest.fixture(scope="module")
def expected() -> dict:
    return stock_exchange.reference(PARAMS)


@pytest.mark.parametrize("task", ["match-1", "orders-0"])
def test_a_worker_killed_under_the_stock_exchange_and_its_results_are_the_reference(
    faults: BackgroundCluster,
    fault_events: Events,
    tmp_path: Path,
    held_end: Path,
    expected: dict,
    task: str,
) -> None:
    """The worker hosting ``task`` is SIGKILLed once 2 checkpoints are complete: the one
    of the second match and stats tasks (``match-1``), or the one of the order source and
    the first ones (``orders-0``). The job recovers onto the spare and its results are
    the reference."""
    co = faults.coordinator
    graph = load_job("examples.stock_exchange:build", {**PARAMS, "output": str(tmp_path)})
    job, _, spare = start_job(faults, fault_events, held_until_released(graph, held_end))
    victim = job.layout.placement[task]
    kill(co.workers[victim].pid)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    report, _ = fault_events.recoveries[0]
    assert report.status == ReconfigurationStatus.COMPLETED
    assert report.plan["lost_workers"] == [victim] and report.plan["placed_on"] == {victim: spare}
    problems = [
        p
        for sink in ("trades", "stats", "alerts")
        for p in stale_sink_files(faults, tmp_path / sink)
    ]
    finish_job(faults, job, held_end)
    assert not problems, problems
    got = stock_exchange.read_results(tmp_path)
    assert len(expected["trades"]) > 10_000 and expected["alerts"]
    assert_exact(got["trades"], expected["trades"])
    assert_exact(got["alerts"], expected["alerts"])
    assert got["stats"] == expected["stats"]
