"""The coordinator's view of a job's metrics: recent per-second snapshots of its tasks and
of the workers hosting them, and run totals."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from runtime.metrics import LatencyHistogram, covered, summarize_latency

__all__ = ["JobMetrics"]

WINDOW_S = 300.0  # how much per-second history a job keeps


class JobMetrics:
    """Snapshots reported by workers, kept for ``WINDOW_S``, plus cumulative totals.

    ``samples`` holds ``(time, task, snapshot)`` and ``worker_samples`` ``(time, worker,
    cpu_percent, rss_mb)``, oldest first; ``workers`` is each worker's latest usage."""

    def __init__(self, operator_of: dict[str, str], kinds: dict[str, str]) -> None:
        self.operator_of = operator_of  # task -> operator
        self.kinds = kinds  # operator -> kind
        self.samples: deque[tuple[float, str, dict[str, Any]]] = deque()
        self.records_in: dict[str, int] = dict.fromkeys(operator_of, 0)
        self.records_out: dict[str, int] = dict.fromkeys(operator_of, 0)
        self.latency = LatencyHistogram()
        self.workers: dict[str, dict[str, float]] = {}
        self.worker_samples: deque[tuple[float, str, float, float]] = deque()

    def track_tasks(self, operator_of: dict[str, str]) -> None:
        """Follow tasks added by a reconfiguration (task -> operator)."""
        for task, op in operator_of.items():
            self.operator_of.setdefault(task, op)
            self.records_in.setdefault(task, 0)
            self.records_out.setdefault(task, 0)

    def add(self, now: float, task: str, snap: dict[str, Any]) -> None:
        self.samples.append((now, task, snap))
        self.records_in[task] = self.records_in.get(task, 0) + int(snap.get("records_in", 0))
        self.records_out[task] = self.records_out.get(task, 0) + int(snap.get("records_out", 0))
        if "latency" in snap:
            self.latency.merge(LatencyHistogram.from_dict(snap["latency"]))
        _forget_before(self.samples, now - WINDOW_S)

    def add_worker(
        self, worker: str, cpu_percent: float, rss_mb: float, now: float | None = None
    ) -> None:
        """A worker's usage as it reported it at ``now`` (default: the time of the call)."""
        now = time.time() if now is None else now
        self.workers[worker] = {"cpu_percent": cpu_percent, "rss_mb": rss_mb}
        self.worker_samples.append((now, worker, cpu_percent, rss_mb))
        _forget_before(self.worker_samples, now - WINDOW_S)

    def operator_totals(self, kind: str) -> int:
        return sum(
            n
            for t, n in self.records_in.items()
            if self.kinds.get(self.operator_of.get(t, "")) == kind
        )

    def window(self, seconds: float, now: float | None = None) -> dict[str, Any]:
        """Per-task rates and the latency of the last ``seconds``."""
        now = time.time() if now is None else now
        per_task: dict[str, dict[str, float]] = {}
        latency = LatencyHistogram()
        for t, task, snap in self.samples:
            if t < now - seconds:
                continue
            agg = per_task.setdefault(
                task,
                {
                    "span_s": 0.0,
                    "records_in": 0,
                    "records_out": 0,
                    "busy_s": 0.0,
                    "backpressure_s": 0.0,
                    "idle_s": 0.0,
                },
            )
            for k in agg:
                agg[k] += snap.get(k, 0)
            if "latency" in snap:
                latency.merge(LatencyHistogram.from_dict(snap["latency"]))
        rates = {}
        for task, agg in per_task.items():
            # Reports are stamped on arrival: divide by the time they cover, not the window
            # (runtime.metrics.covered).
            span = covered(agg, seconds)
            rates[task] = {
                "in_per_s": agg["records_in"] / span,
                "out_per_s": agg["records_out"] / span,
                "busy": min(agg["busy_s"] / span, 1.0),
                "backpressure": min(agg["backpressure_s"] / span, 1.0),
            }
        return {"tasks": rates, "latency": summarize_latency(latency)}


def _forget_before(history: deque[Any], since: float) -> None:
    """Drop the entries of ``history`` (oldest first, time first) stamped before ``since``."""
    while history and history[0][0] < since:
        history.popleft()
