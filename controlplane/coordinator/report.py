"""The report of a reconfiguration: what is told of it while it runs and kept once it
has ended (status, phase times, affected tasks, error, ...).

A :class:`RunReport` is plain data: the live protocol (:mod:`.protocol`), fluid plans
(:mod:`.fluid`) and the stop-and-restart baseline (:mod:`.restart`) fill it in and tell
their listener explicitly when it changes. :meth:`RunReport.reported` is the one mapping
from it to what the control plane stores and serves (:class:`controlplane.engine.Progress`
and the ``reconfigurations`` row take it as it is).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.statuses import ReconfigurationStatus

__all__ = ["Listener", "RunReport", "bare_report", "elapsed_ms", "next_record_id"]

_ids = itertools.count(1)


def next_record_id() -> int:
    """A reconfiguration id never handed out before (live runs and restarts share them)."""
    return next(_ids)


def elapsed_ms(t0: float, t1: float) -> float:
    """Milliseconds from ``t0`` to ``t1`` (monotonic readings in seconds), to the microsecond."""
    return round((t1 - t0) * 1000, 3)


@dataclass(eq=False)
class RunReport:
    """One reconfiguration of a job, as reported: how it went and how long each phase
    took. ``steps`` counts the versions it went through (fluid: one per batch), ``runs``
    the live protocol runs it took (stages of a staged run are not runs), ``stages_made``
    (staged) the stages every worker is done with and ``stage_ms`` how long each took,
    ``cut_short`` whether later stages were withdrawn; ``worker_map`` (a restart on new
    workers): old worker -> the new one in its place; ``precopied``: per worker, what it
    copied ahead and where that time went."""

    id: int
    job_id: str
    affected: set[str]
    plan: Any = None  # the plan it came from, kept for the record
    status: ReconfigurationStatus = ReconfigurationStatus.PENDING
    error: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    pause_ms: dict[str, float] = field(default_factory=dict)
    update_ms: dict[str, float] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    version: int | None = None  # the abstraction version it made (or left) current
    steps: int = 1
    runs: int = 1
    stages_made: int = 0
    stage_ms: list[float] = field(default_factory=list)
    cut_short: bool = False
    worker_map: dict[str, str] = field(default_factory=dict)
    precopied: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def new(cls, job_id: str, affected: set[str] | frozenset[str], plan: Any = None) -> RunReport:
        """A report with a fresh id."""
        return cls(next_record_id(), job_id, set(affected), plan=plan)

    @property
    def done(self) -> bool:
        return self.status.ended

    def reported(self) -> dict[str, Any]:
        """What the control plane records of it, by the names of its ``reconfigurations``
        row and REST schema (copies, safe to keep)."""
        return {
            "status": self.status,
            "error": self.error,
            "affected_tasks": sorted(self.affected),
            "timings_ms": dict(self.timings_ms),
            "pause_ms": dict(sorted(self.pause_ms.items())),
            "update_ms": dict(sorted(self.update_ms.items())),
            "runs": self.runs,
            "stage_ms": list(self.stage_ms),
            "precopied": {w: dict(c) for w, c in sorted(self.precopied.items())},
            "runtime_id": self.id,
        }


def bare_report(status: ReconfigurationStatus, error: str | None) -> dict[str, Any]:
    """What :meth:`RunReport.reported` says of a plan that ended without a report (refused
    when applied, or cancelled before it started): its status and error, no times; the
    affected tasks and runtime id recorded before are kept."""
    return {
        "status": status,
        "error": error,
        "timings_ms": {},
        "pause_ms": {},
        "update_ms": {},
        "runs": None,
        "stage_ms": [],
        "precopied": {},
    }


Listener = Callable[[RunReport], None]  # told of a report's creation and of each change
