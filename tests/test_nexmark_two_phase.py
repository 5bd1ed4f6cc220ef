"""Nexmark q5 (hot items) counting bids per auction with a two-phase windowed aggregation
(``two_phase``: ``window_aggregate``), on real local workers: its rows are the reference's,
unsplit and while the hottest auction is split over the count tasks, merged back and its
parts' key groups moved by random live plans."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from examples.nexmark.queries import JOBS, Params, build, output_rows, reference, source_of
from runtime.graph import JobGraph
from runtime.sinks import Collect
from tests.api_support import wait_until
from tests.e2e_jobs import held_until_released
from tests.test_aggregate_split import split_then_random_plans
from tests.test_nexmark_windowed import STREAM
from tests.test_windows_e2e import event_time_of

pytestmark = pytest.mark.slow

WAIT_S = 120.0  # a run of these sizes ends within this on the busiest machine


def hottest_auction(params: dict[str, Any]) -> int:
    """The auction that is among the most bid on in the most windows of the reference."""
    return Counter(row[2] for row in reference("q5", params)).most_common(1)[0][0]


def held_two_phase(params: dict[str, Any], held: Path) -> JobGraph:
    """q5 with ``two_phase`` over the events of ``params``, its end held back while the
    file ``held`` exists."""
    p = Params(**params)
    flow = build("q5", source_of(p), p.parallelism, Collect(p.output), two_phase=True)
    return held_until_released(flow.compile(), held)


def test_two_phase_q5_gives_the_reference_rows(cluster: BackgroundCluster, tmp_path: Path) -> None:
    params = {**STREAM, "events": 20_000, "seed": 3, "two_phase": True, "output": str(tmp_path)}
    graph = JOBS["q5"](params).compile()
    assert {"counts", "counts.merge"} <= {op.name for op in graph.operators}
    job = cluster.run(graph, timeout=WAIT_S)
    assert job.status == JobStatus.FINISHED, job.error
    del params["two_phase"]
    assert output_rows("q5", tmp_path) == reference("q5", params)


@pytest.mark.parametrize("seed", [5])
def test_a_hot_auction_split_through_random_live_plans_keeps_the_rows_exact(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path, seed: int
) -> None:
    params = {**STREAM, "events": 24_000, "rate": 4_000.0, "seed": seed, "output": str(tmp_path)}
    hot = hottest_auction(params)
    job = cluster.submit(held_two_phase(params, held_end))
    try:
        wait_until(lambda: job.done or event_time_of(job, "counts-0"), WAIT_S, "a watermark")
        assert not job.done, job.error
        applied = split_then_random_plans(cluster, job, random.Random(seed), hot, "counts")
    finally:
        held_end.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert output_rows("q5", tmp_path) == reference("q5", params), applied


def test_two_phase_is_refused_where_it_does_not_apply() -> None:
    for query in ("q1", "q7"):
        with pytest.raises(ValueError, match="'two_phase' applies to q5"):
            JOBS[query]({"two_phase": True})
