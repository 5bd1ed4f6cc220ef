"""What the engine hands out: frozen views of jobs, workers, metrics and reconfiguration
progress, copied on the coordinator's loop so request threads and the tracker can read
them without touching the coordinator (see :mod:`controlplane.engine`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.abstraction import Plan, key_group_bytes
from controlplane.coordinator.report import bare_report
from controlplane.statuses import ReconfigurationStatus

if TYPE_CHECKING:
    from controlplane.coordinator import Cancellation, RunningJob, RunReport, ValidatedPlan

__all__ = [
    "JobState",
    "JobView",
    "MetricsView",
    "PlanBuilder",
    "Preview",
    "Progress",
    "Reservation",
    "WorkerView",
    "job_key",
]


@dataclass(frozen=True)
class JobState:
    """A job as the coordinator sees it; ``abstraction`` (the current version's document)
    is filled by :meth:`Engine.submit` only. ``job_id`` is the coordinator's id (see
    :func:`job_key`)."""

    job_id: str
    status: str
    error: str | None
    version: int | None
    abstraction: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reservation:
    """A validated plan for a job that is now reserved for it (see :meth:`Engine.reserve`),
    with the cancellation the reservation made (see :meth:`Engine.cancel`)."""

    job_id: str
    validated: ValidatedPlan
    cancellation: Cancellation

    @property
    def plan(self) -> Plan:
        return self.validated.plan

    @property
    def affected(self) -> tuple[str, ...]:
        """The tasks the plan touches (from its layouts, as its report will say)."""
        return tuple(sorted(self.validated.affected))


@dataclass(frozen=True)
class Preview:
    """What a plan would do to a job (see :meth:`Engine.preview`): the plan, the diff of
    its result against the current version (fresh workers it would start are among its
    ``new_workers``), the tasks it would affect (as its reconfiguration's record would
    say), the versions it would go through (``steps``: one, or one per fluid step), and
    the estimated bytes of keyed state it would ship between workers, in all and in its
    largest step (None when a moving task's state size was not measured)."""

    plan: Plan
    diff: Mapping[str, Any]
    affected: tuple[str, ...]
    steps: int
    state_bytes_shipped: int | None
    largest_step_bytes: int | None


@dataclass(frozen=True)
class Progress:
    """Where a reconfiguration stands: ``reported`` is what its coordinator report says
    (:meth:`~controlplane.coordinator.RunReport.reported`, the one mapping from the report
    to what is recorded: the ``reconfigurations`` row takes it as it is), or only status
    and error for a plan that ended without a report. The final report sets ``version``
    (the version the job is left at) and ``abstractions``: the documents of the versions
    it made, oldest first (one; or one per step in fluid mode, where a failed step keeps
    those before it)."""

    reported: Mapping[str, Any]
    version: int | None = None
    abstractions: tuple[dict[str, Any], ...] = ()

    @property
    def status(self) -> ReconfigurationStatus:
        return ReconfigurationStatus(self.reported["status"])

    @property
    def error(self) -> str | None:
        return self.reported["error"]

    @property
    def done(self) -> bool:
        return self.status.ended

    @classmethod
    def of(cls, report: RunReport) -> Progress:
        """The progress of a coordinator report."""
        return cls(report.reported())

    @classmethod
    def bare(cls, status: ReconfigurationStatus, error: str | None) -> Progress:
        """The outcome of a plan that ended without a report (refused when applied, or
        cancelled before it started)."""
        return cls(bare_report(status, error))


class JobView:
    """What a :data:`PlanBuilder` may read of a running job: its current abstraction (with
    the coordinator's current workers) and measured loads."""

    def __init__(self, job: RunningJob, abstraction: Any) -> None:
        self._job = job
        self.abstraction = abstraction

    def _reports(self, operator: str, window_s: float) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(task, snapshot) of each report of ``operator``'s tasks in the last ``window_s``,
        oldest first."""
        since = time.time() - window_s
        operator_of = self._job.metrics.operator_of
        for t, task, snap in list(self._job.metrics.samples):
            if t >= since and operator_of.get(task) == operator:
                yield task, snap

    def key_group_loads(self, operator: str, window_s: float) -> dict[int, float]:
        """Records per second of each key group of ``operator`` over the last ``window_s``
        (empty when no task of it reported per-key-group counts in that window)."""
        loads: dict[int, float] = {}
        for _task, snap in self._reports(operator, window_s):
            for group, count in dict(snap.get("key_groups") or {}).items():
                loads[int(group)] = loads.get(int(group), 0.0) + float(count) / window_s
        return loads

    def state_bytes(self, operator: str, window_s: float) -> dict[str, float]:
        """Each task of ``operator``'s estimated state size in bytes, from its latest report
        in the last ``window_s`` (tasks that reported none, or state that does not pickle,
        are missing)."""
        latest: dict[str, float] = {}
        for task, snap in self._reports(operator, window_s):
            size = (snap.get("state") or {}).get("bytes")  # None: its state does not pickle
            if size is not None:
                latest[task] = float(size)
        return latest

    def group_sizes(self, window_s: float) -> dict[str, dict[int, float]]:
        """Each key group's estimated state in bytes, by keyed operator, from its task's
        latest report in the last ``window_s``: the group's own share when the report has
        it, else the task's size spread over its key groups
        (:func:`controlplane.abstraction.key_group_bytes`); groups of unmeasured tasks are
        missing."""
        a = self.abstraction
        task_bytes: dict[str, float] = {}
        shares: dict[str, dict[int, float]] = {}
        for op in a.operators:
            if not op.keyed:
                continue
            for task, snap in self._reports(op.name, window_s):
                state = snap.get("state") or {}
                if state.get("bytes") is not None:
                    task_bytes[task] = float(state["bytes"])
                    groups = dict(state.get("groups") or {})
                    shares[task] = {int(g): float(n) for g, n in groups.items()}
        return key_group_bytes(a, task_bytes, shares)

    def key_group_bytes(self, operator: str, window_s: float) -> float | None:
        """The largest estimated state per key group of a task of ``operator`` (its state's
        bytes over the key groups it owns, from its latest report in the last
        ``window_s``); None when no task of it reported a state size in that window."""
        latest = self.state_bytes(operator, window_s)
        if not latest:
            return None
        owned = {
            t.id: len(t.workload.key_groups or ())
            for t in self.abstraction.operator(operator).tasks
        }
        return max((b / owned[t] for t, b in latest.items() if owned.get(t)), default=0.0)


PlanBuilder = Callable[[JobView], Plan]


@dataclass(frozen=True)
class MetricsView:
    """A copy of a job's recent metrics, taken on the loop at ``now`` (``time.time()``):
    the worker snapshots of the last ``window_s`` as ``(time, task, snapshot)``, each task's
    operator and worker, each operator's kind (in the job graph's order, sources first),
    the latest usage of the job's workers and their usage over the window as ``(time,
    worker, cpu_percent, rss_mb)``."""

    now: float
    window_s: float
    samples: tuple[tuple[float, str, Mapping[str, Any]], ...]
    operator_of: Mapping[str, str]
    kinds: Mapping[str, str]
    placement: Mapping[str, str]
    workers: Mapping[str, Mapping[str, float]]
    worker_samples: tuple[tuple[float, str, float, float], ...] = ()


@dataclass(frozen=True)
class WorkerView:
    """A worker as the coordinator sees it; ``tasks`` are those of live jobs placed on it,
    ``error`` why it was lost, ``executor_id`` the Spark executor hosting it."""

    id: str
    host: str
    pid: int
    cpus: float
    memory_mb: int
    status: str
    cpu_percent: float
    rss_mb: float
    tasks: tuple[str, ...]
    error: str | None = None
    executor_id: str | None = None


def job_key(job_id: int) -> str:
    """The coordinator's id of the job whose database id is ``job_id``."""
    return str(job_id)
