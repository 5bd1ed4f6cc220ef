"""The statuses of jobs, reconfigurations, workers and controllers, one enum each.

Each is a :class:`enum.StrEnum`: a member is its own wire value (``JobStatus.RUNNING ==
"running"``), so the REST API, the database rows and the CLI keep the strings they always
had, while the code names a status by its member and a typo fails at import time.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "CheckpointStatus",
    "ControllerStatus",
    "DecisionStatus",
    "JobStatus",
    "ReconfigurationStatus",
    "WorkerStatus",
]


class JobStatus(StrEnum):
    """``starting`` until every task is deployed, then ``running`` (``reconfiguring``
    while a plan is applied, ``recovering`` while it goes back to its last complete
    checkpoint after a failure), and one of the three ends."""

    STARTING = "starting"
    RUNNING = "running"
    RECONFIGURING = "reconfiguring"
    RECOVERING = "recovering"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def ended(self) -> bool:
        return self in _JOB_ENDS


_JOB_ENDS = frozenset({JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED})


class ReconfigurationStatus(StrEnum):
    """A plan's phases (``pending`` before the coordinator takes it; ``preparing``,
    ``syncing``, ``updating`` as in docs/reconfiguration.md) and its four ends:
    ``completed``; ``failed`` (the job may have failed with it); ``aborted`` (undone
    before the update, nothing changed); ``cancelled`` (on request, nothing changed or,
    for a staged plan cut short, the stages made so far)."""

    PENDING = "pending"
    PREPARING = "preparing"
    SYNCING = "syncing"
    UPDATING = "updating"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in _RECONFIGURATION_ENDS


_RECONFIGURATION_ENDS = frozenset(
    {
        ReconfigurationStatus.COMPLETED,
        ReconfigurationStatus.FAILED,
        ReconfigurationStatus.ABORTED,
        ReconfigurationStatus.CANCELLED,
    }
)


class CheckpointStatus(StrEnum):
    """A checkpoint: ``in_progress`` from its barrier until every task's part is durable,
    then ``completed``; ``abandoned`` when it could not complete (its timeout passed, a
    task failed or finished, a reconfiguration went first) and the job went on without it;
    ``discarded`` once retention removed a completed one's files."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    DISCARDED = "discarded"

    @property
    def ended(self) -> bool:
        return self is not CheckpointStatus.IN_PROGRESS


class WorkerStatus(StrEnum):
    """A worker process as the coordinator sees it: ``alive`` while registered,
    ``stopped`` once retired on purpose (drained, or a restart's old workers), ``lost``
    when its connection or heartbeats ended otherwise."""

    ALIVE = "alive"
    STOPPED = "stopped"
    LOST = "lost"


class ControllerStatus(StrEnum):
    """A controller attached to a job."""

    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"


class DecisionStatus(StrEnum):
    """A controller's decision: ``pending`` while its plan runs, then the plan's end, or
    why it never started (``refused`` by the safety limits, ``dry_run``)."""

    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    CANCELLED = "cancelled"
    REFUSED = "refused"
    DRY_RUN = "dry_run"
