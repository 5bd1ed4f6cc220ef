"""Messages a worker sends the coordinator (documented in :mod:`runtime.messages`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ..records import BarrierKind
from ._codec import ToCoordinator, message

__all__ = [
    "BarrierAck",
    "CheckpointAck",
    "CheckpointCaptured",
    "CheckpointFailed",
    "DeployFailed",
    "Deployed",
    "Heartbeat",
    "Metrics",
    "PartitionsFound",
    "PartitionsListed",
    "Paused",
    "PrepareFailed",
    "Prepared",
    "Register",
    "Snapshot",
    "StageDone",
    "StageWithdrawn",
    "Stopped",
    "TaskFailed",
    "TaskFinished",
    "UpdateFailed",
    "Updated",
    "WorkerError",
]


@message("register")
class Register(ToCoordinator):
    host: str
    pid: int
    cpus: float
    memory_mb: int
    data_host: str
    data_port: int
    name: str
    executor_id: str | None = None


@message("heartbeat")
class Heartbeat(ToCoordinator):
    pass


@message("deployed")
class Deployed(ToCoordinator):
    job_id: str
    attempt: int  # the deploy's (an answer to an earlier deploy is not one to this)
    tasks: tuple[str, ...]
    restored: dict[str, int] = field(default_factory=dict)


@message("deploy_failed")
class DeployFailed(ToCoordinator):
    job_id: str
    attempt: int
    error: str


@message("metrics")
class Metrics(ToCoordinator):
    worker_id: str
    time: float
    cpu_percent: float
    rss_mb: float
    jobs: dict[str, dict[str, dict[str, Any]]]


@message("partitions_found")
class PartitionsFound(ToCoordinator):
    """Source ``operator`` lists ``partitions`` that no task of the job reads."""

    job_id: str
    operator: str
    partitions: tuple[str, ...]


@message("partitions_listed")
class PartitionsListed(ToCoordinator):
    """The answer to ``list_partitions`` ``request_id``: each source's partitions, or
    ``error`` (why a source could not list them: it names the source)."""

    request_id: int
    partitions: dict[str, tuple[str, ...]]
    error: str | None


@message("task_finished")
class TaskFinished(ToCoordinator):
    job_id: str
    task: str
    metrics: dict[str, Any]


@message("task_failed")
class TaskFailed(ToCoordinator):
    job_id: str
    task: str
    error: str


@message("worker_error")
class WorkerError(ToCoordinator):
    job_id: str
    error: str


@message("barrier_ack")
class BarrierAck(ToCoordinator):
    job_id: str
    task: str
    kind: BarrierKind
    barrier_id: int


@message("checkpoint_captured")
class CheckpointCaptured(ToCoordinator):
    job_id: str
    task: str
    checkpoint_id: int


@message("checkpoint_ack")
class CheckpointAck(ToCoordinator):
    job_id: str
    task: str
    checkpoint_id: int
    part: dict[str, Any]
    written: int
    size: int


@message("checkpoint_failed")
class CheckpointFailed(ToCoordinator):
    job_id: str
    task: str
    checkpoint_id: int
    error: str


@message("stopped")
class Stopped(ToCoordinator):
    job_id: str
    metrics: dict[str, dict[str, Any]]


@message("snapshot")
class Snapshot(ToCoordinator):
    job_id: str
    task: str
    metrics: dict[str, Any]
    groups: dict[int, bytes] = field(default_factory=dict)
    position: Any = None


@message("prepared")
class Prepared(ToCoordinator):
    job_id: str
    rid: int
    precopy: dict[str, int | float] | None = None


@message("prepare_failed")
class PrepareFailed(ToCoordinator):
    job_id: str
    rid: int
    error: str


@message("paused")
class Paused(ToCoordinator):
    job_id: str
    rid: int
    task: str


@message("updated")
class Updated(ToCoordinator):
    job_id: str
    rid: int
    task: str
    pause_ms: float
    update_ms: float
    metrics: dict[str, Any] | None = None


@message("update_failed")
class UpdateFailed(ToCoordinator):
    job_id: str
    rid: int
    error: str


@message("stage_done")
class StageDone(ToCoordinator):
    job_id: str
    rid: int
    stage: int


@message("stage_withdrawn")
class StageWithdrawn(ToCoordinator):
    job_id: str
    rid: int
    stage: int
    clean: bool
