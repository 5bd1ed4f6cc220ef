"""The Nexmark queries: the references on hand-made events (window boundaries, joins,
sessions), and q0, q1, q2 as streampilot jobs on real local workers, their output the
reference exactly, also with a source partition moved live and the query scaled out (the
event-time queries: ``test_nexmark_windowed.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.abstraction import AssignWorkload, Plan, scale
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from examples.nexmark import Auction, Bid, Nexmark, Person
from examples.nexmark import reference as ref
from examples.nexmark.queries import JOBS, LOGIC, Params, build, reference, source_of
from runtime.dataflow import JobGraph
from runtime.sinks import Collect, read_parts
from tests.api_support import wait_until
from tests.e2e_jobs import held_until_released

WAIT_S = 120.0  # hang guard for a job's run on a loaded machine


def person(id: int, t: int, state: str = "OR", name: str = "Ann") -> Person:
    return Person(id, name, "a@b.com", "0000 0000 0000 0000", "Bend", state, t, "")


def auction(id: int, t: int, seller: int = 1000, category: int = 10, expires: int = 0) -> Auction:
    return Auction(id, "item", "desc", 100, 200, t, expires or t + 5000, seller, category, "")


def bid(auction: int, t: int, price: int = 100, bidder: int = 1000) -> Bid:
    return Bid(auction, bidder, price, "Google", "https://x", t, "")


# --- References --------------------------------------------------------------------------


def test_stateless_references() -> None:
    events = [person(1000, 0), auction(1107, 1), bid(1107, 2, 500), bid(1108, 3, 1000)]
    assert ref.q0(events) == [(1107, 1000, 500, 2, ""), (1108, 1000, 1000, 3, "")]
    assert ref.q1(events) == [(1107, 1000, 500 * 0.908, 2, ""), (1108, 1000, 1000 * 0.908, 3, "")]
    assert ref.q2(events) == [(1107, 500)]  # 1107 = 9 x 123


def test_q3_joins_category_10_auctions_with_their_sellers_in_or_id_ca() -> None:
    events = [
        auction(2000, 0, seller=1001),  # its seller comes later: still joined
        person(1001, 5, "ID", "Bo"),
        person(1002, 5, "WA", "Cy"),
        auction(2001, 6, seller=1002),  # WA: no
        auction(2002, 7, seller=1001, category=11),  # category 11: no
    ]
    assert ref.q3(events) == [("Bo", "Bend", "ID", 2000)]


def test_q4_averages_per_category_the_best_bid_within_each_auction_s_lifetime() -> None:
    events = [
        auction(1, 100, category=10, expires=200),
        auction(2, 100, category=10, expires=200),
        auction(3, 100, category=11, expires=200),
        bid(1, 99, 9999),  # before it opened
        bid(1, 100, 10),
        bid(1, 200, 30),  # at expiry: counts (BETWEEN)
        bid(1, 201, 9999),  # after
        bid(2, 150, 20),
        bid(3, 300, 5),  # auction 3 has no bid in its lifetime: left out
    ]
    assert ref.q4(events) == [(10, 25.0)]


def test_q5_counts_bids_per_auction_in_sliding_windows_and_keeps_the_most_bid() -> None:
    events = [bid(1, 1000), bid(1, 1500), bid(2, 2500), bid(2, 2600), bid(2, 2700)]
    rows = ref.q5(events, size_ms=2000, slide_ms=1000)
    assert rows == [
        (0, 2000, 1, 2),  # [0, 2000): auction 1 twice
        (1000, 3000, 2, 3),  # [1000, 3000): 1 twice, 2 three times
        (2000, 4000, 2, 3),
    ]


def test_q7_keeps_each_window_s_highest_bids_in_half_open_windows() -> None:
    events = [
        bid(1, 0, 50),
        bid(2, 9999, 70),
        bid(3, 5000, 70),
        bid(4, 10_000, 95),  # at window_end: in the next window only
        bid(5, 12_000, 90),
    ]
    assert ref.q7(events) == [
        (0, 10_000, 2, 1000, 70, 9999, ""),
        (0, 10_000, 3, 1000, 70, 5000, ""),
        (10_000, 20_000, 4, 1000, 95, 10_000, ""),
    ]


def test_q8_finds_people_who_opened_an_auction_in_the_window_they_registered_in() -> None:
    events = [
        person(1000, 1000, name="A"),
        auction(1, 2000, seller=1000),
        auction(2, 3000, seller=1000),  # twice in the window: once out
        person(1001, 9000, name="B"),
        auction(3, 10_500, seller=1001),  # the next window: no
    ]
    assert ref.q8(events) == [(1000, "A", 0)]


def test_q11_counts_bids_per_bidder_session() -> None:
    events = [bid(1, t, bidder=7) for t in (0, 5000, 14_999)] + [
        bid(1, t, bidder=7) for t in (24_999, 40_000)
    ]
    assert ref.q11(events, gap_ms=10_000) == sorted(
        [
            (7, 3, 0, 24_999),  # 14,999 + 10,000 = 24,999: a gap of exactly 10 s parts
            (7, 1, 24_999, 34_999),
            (7, 1, 40_000, 50_000),  # 34,999 to 40,000: more than the gap parts
        ]
    )


def test_window_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"slide_ms must be an int >= 1"):
        ref.q5([], slide_ms=0)


def test_references_of_a_generated_stream_are_non_empty_and_sorted() -> None:
    source = Nexmark(events=60_000, seed=11)
    events = [source.event_at(k) for k in range(60_000)]
    for name, query in ref.REFERENCES.items():
        rows = query(events)
        assert rows, name
        assert rows == sorted(rows), name


# --- Jobs on real workers ----------------------------------------------------------------


def rows(output: Path) -> list[tuple]:
    return sorted(tuple(r) for r in read_parts(output))


@pytest.mark.parametrize("query", sorted(LOGIC))
def test_the_job_s_output_is_the_reference(
    cluster: BackgroundCluster, tmp_path: Path, query: str
) -> None:
    params = {
        "events": 20_000,
        "partitions": 3,
        "seed": 5,
        "output": str(tmp_path),
        "out_of_order_group_size": 5 if query == "q2" else 1,
    }
    job = cluster.run(JOBS[query](params).compile(), timeout=WAIT_S)
    assert job.status == JobStatus.FINISHED, job.error
    assert rows(tmp_path) == reference(query, params)


def held_graph(query: str, params: dict[str, Any], held: Path) -> JobGraph:
    """The job of ``query`` over the events of ``params``, its end held back while the
    file ``held`` exists, writing its rows to ``params["output"]``."""
    p = Params(**params)
    graph = build(query, source_of(p), p.parallelism, Collect(p.output), p.shuffle).compile()
    return held_until_released(graph, held)


def submit_held(cluster: BackgroundCluster, query: str, params: dict[str, Any], held: Path):
    """Submit ``query`` over the events of ``params``, held open by ``held``, and wait
    until rows reach its sinks."""
    job = cluster.submit(held_graph(query, params, held))
    wait_until(lambda: job.done or job.summary()["sink_records"] > 0, WAIT_S, "rows at the sinks")
    assert not job.done, (job.status, job.error)
    return job


def apply(cluster: BackgroundCluster, job: Any, plan: Plan) -> None:
    report = cluster.call(cluster.coordinator.apply_plan(job.id, plan))
    assert report.status == "completed", report.error


def finish(cluster: BackgroundCluster, job: Any, held: Path) -> None:
    held.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error


def test_a_partition_moved_live_loses_and_repeats_no_row(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    params = {
        "events": 30_000,
        "rate": 10_000.0,
        "partitions": 4,
        "seed": 9,
        "output": str(tmp_path / "out"),
    }
    job = submit_held(cluster, "q1", params, held_end)
    reading = {t.id: list(t.workload.partitions) for t in job.abstraction.operator("events").tasks}
    assert reading == {"events-0": ["p0", "p2"], "events-1": ["p1", "p3"]}
    moved = AssignWorkload("events", {"events-0": ["p0"], "events-1": ["p1", "p2", "p3"]})
    apply(cluster, job, Plan(job.abstraction.version, (moved,)))
    finish(cluster, job, held_end)
    assert rows(tmp_path / "out") == reference("q1", params)


def test_the_query_scaled_out_live_loses_and_repeats_no_row(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    params = {
        "events": 30_000,
        "rate": 10_000.0,
        "partitions": 4,
        "seed": 10,
        "shuffle": True,
        "output": str(tmp_path / "out"),
    }
    job = submit_held(cluster, "q2", params, held_end)
    apply(cluster, job, scale(job.abstraction, "q2", 3))
    assert len(job.abstraction.operator("q2").tasks) == 3
    finish(cluster, job, held_end)
    assert rows(tmp_path / "out") == reference("q2", params)


def test_the_queries_are_registered_as_jobs() -> None:
    """Each query is a job the server may run by name (``streampilot run nexmark-q5``)."""
    import tomllib
    from pathlib import Path

    from examples.nexmark.queries import JOBS

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["streampilot.jobs"]
    assert {f"nexmark-{q}": f"examples.nexmark.queries:{q}" for q in JOBS}.items() <= (
        declared.items()
    )
