"""Building recorded views for the controller tests.

Metrics documents are made by the REST layer's own schema
(``controlplane.metrics.schemas.JobMetricsRead``, dumped to JSON) and views go through
JSON before ``View.from_dict``, so the tests read exactly what the host will send.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from test_abstraction import deploy, rebalanced_graph

from controllers import Outcome, View
from controlplane.abstraction import Abstraction
from controlplane.metrics.schemas import (
    ChannelMetrics,
    JobMetricsRead,
    LatencyRead,
    OperatorMetrics,
    TaskMetrics,
)
from runtime.dataflow import load_job

JOB = "1"
WINDOW_S = 10.0


def wordcount(
    parallelism: int = 2, max_parallelism: int = 16, n_workers: int = 2, slots: int = 64
) -> Abstraction:
    """sentences -fwd-> split -key-> count (keyed) -fwd-> sink; task i on worker i mod n."""
    params = {"parallelism": parallelism, "max_parallelism": max_parallelism}
    graph = load_job("examples.wordcount:build", params)
    return deploy(graph, n_workers=n_workers, slots=slots).replace(job_id=JOB)


def rebalanced(n_workers: int = 2) -> Abstraction:
    """lines (1) -rebalance-> split (3) -key-> count (2, 8 groups) -fwd-> out (2)."""
    return deploy(rebalanced_graph(), n_workers=n_workers).replace(job_id=JOB)


def task(
    task_id: str,
    *,
    in_per_s: float = 0.0,
    busy: float = 0.0,
    groups: Mapping[int, float] | None = None,
    worker: str | None = "w0",
    queued: int = 0,
    state_bytes: int | None = None,
) -> TaskMetrics:
    """One task's metrics; ``groups`` are key-group loads in records/s (stored as counts
    over the window, as workers report them); ``in_per_s`` defaults to their sum;
    ``state_bytes`` comes with a key a kilobyte."""
    counts = {g: round(load * WINDOW_S) for g, load in (groups or {}).items()}
    rate = in_per_s or sum((groups or {}).values())
    return TaskMetrics(
        task=task_id,
        operator=task_id.rpartition("-")[0],
        worker=worker,
        in_per_s=rate,
        out_per_s=rate,
        busy=busy,
        backpressure=0.0,
        queued={"up-0": queued} if queued else {},
        key_groups=counts,
        state_keys=None if state_bytes is None else state_bytes // 1000,
        state_bytes=state_bytes,
    )


def window(
    tasks: Iterable[TaskMetrics],
    *,
    traffic: Mapping[tuple[str, str], float] | None = None,
    p99_ms: float | None = None,
) -> dict[str, Any]:
    """The JSON of ``GET /jobs/1/metrics`` for these tasks; ``traffic`` in bytes/s (records
    are a tenth); ``p99_ms`` None means no latency measured."""
    tasks = list(tasks)
    by_op: dict[str, list[TaskMetrics]] = {}
    for t in tasks:
        by_op.setdefault(t.operator, []).append(t)
    latency = (
        LatencyRead(p50_ms=0, p95_ms=0, p99_ms=0, max_ms=0, count=0)
        if p99_ms is None
        else LatencyRead(
            p50_ms=p99_ms / 4, p95_ms=p99_ms / 2, p99_ms=p99_ms, max_ms=2 * p99_ms, count=1000
        )
    )
    doc = JobMetricsRead(
        job_id=int(JOB),
        window_s=WINDOW_S,
        samples=len(tasks) * int(WINDOW_S),
        tasks=tasks,
        operators=[
            OperatorMetrics(
                operator=op,
                kind="keyed" if any(t.key_groups for t in ts) else "map",
                tasks=len(ts),
                in_per_s=sum(t.in_per_s for t in ts),
                out_per_s=sum(t.out_per_s for t in ts),
                busy=sum(t.busy for t in ts) / len(ts),
                backpressure=0.0,
                queued=sum(sum(t.queued.values()) for t in ts),
                state_bytes=None
                if all(t.state_bytes is None for t in ts)
                else sum(t.state_bytes or 0 for t in ts),
            )
            for op, ts in by_op.items()
        ],
        traffic=[
            ChannelMetrics(source=s, target=t, records_per_s=b / 10, bytes_per_s=b)
            for (s, t), b in sorted((traffic or {}).items())
        ],
        latency=latency,
        workers=[],
    )
    return doc.model_dump(mode="json")


def view_of(
    a: Abstraction,
    metrics: dict[str, Any] | None = None,
    *,
    now: float = 10_000.0,
    history: Iterable[Outcome] = (),
) -> View:
    """The view the host would send, through JSON."""
    doc = {
        "job_id": a.job_id,
        "now": now,
        "abstraction": a.to_dict(),
        "metrics": metrics,
        "history": [o.to_dict() for o in history],
    }
    return View.from_dict(json.loads(json.dumps(doc)))


def owners(a: Abstraction, operator: str) -> dict[str, tuple[int, ...]]:
    return {t.id: t.workload.key_groups or () for t in a.operator(operator).tasks}
