"""API shapes of checkpoints: what a submission asks of its job's checkpoints and of its
recoveries (the restart policy), the policies a job runs with, the record of each
checkpoint, and savepoints (what to take, the record of each)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.statuses import CheckpointStatus

from .models import CheckpointRecord

__all__ = [
    "CheckpointPolicyRead",
    "CheckpointRead",
    "CheckpointSettings",
    "RestartPolicyRead",
    "RestartSettings",
    "SavepointCreate",
    "SavepointRead",
]


class CheckpointSettings(BaseModel):
    """How a job is checkpointed, as its submission asks: a field left out takes the
    server's default (``STREAMPILOT_CHECKPOINT_INTERVAL_S``, ``..._TIMEOUT_S``,
    ``STREAMPILOT_CHECKPOINTS_RETAINED``); ``interval_s: null`` turns them off."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"interval_s": 30}, {"interval_s": None}]},
    )

    interval_s: float | None = Field(
        None,
        ge=0.1,
        allow_inf_nan=False,
        description="seconds from one checkpoint's start to the next, at least 0.1 (null: no "
        "checkpoints)",
    )
    timeout_s: float | None = Field(
        None, gt=0, description="a checkpoint not complete within this is abandoned"
    )
    retained: int | None = Field(None, ge=1, description="complete checkpoints kept")


class CheckpointPolicyRead(BaseModel):
    """The checkpoint policy a job runs with: its submission's settings over the server's
    defaults."""

    interval_s: float = Field(description="seconds from one checkpoint's start to the next")
    timeout_s: float = Field(description="a checkpoint not complete within this is abandoned")
    retained: int = Field(description="complete checkpoints kept (older ones are discarded)")
    full_every: int = Field(
        description="a key group's chain of incremental parts is at most this long before "
        "the group is written whole again"
    )


class RestartSettings(BaseModel):
    """How often a job may recover from its failures, as its submission asks: a field left
    out (or null) takes the server's default (``STREAMPILOT_RESTART_MAX_FAILURES``,
    ``..._WINDOW_S``, ``..._DELAY_S``)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"max_failures": 5, "window_s": 300}]},
    )

    max_failures: int | None = Field(
        None,
        ge=0,
        description="recoveries allowed within window_s; one more failure fails the job "
        "(0: the first failure does)",
    )
    window_s: float | None = Field(
        None, gt=0, description="the window, in seconds, over which failures are counted"
    )
    delay_s: float | None = Field(
        None, ge=0, description="seconds from a failure to the recovery's start"
    )


class RestartPolicyRead(BaseModel):
    """The restart policy a job runs with: its submission's settings over the server's
    defaults. It matters only while the job takes checkpoints: a job without a complete
    checkpoint fails at its first failure."""

    max_failures: int = Field(description="recoveries allowed within window_s")
    window_s: float = Field(description="the window, in seconds, over which failures count")
    delay_s: float = Field(description="seconds from a failure to the recovery's start")


class CheckpointRead(BaseModel):
    checkpoint_id: int = Field(description="the coordinator's id of it, growing within the job")
    job_id: int
    version: int | None = Field(description="the abstraction version the job ran")
    status: CheckpointStatus = Field(
        description="in_progress, then completed; abandoned when it could not complete; "
        "discarded once a completed one's files were removed (retention)"
    )
    error: str | None = Field(description="why it was abandoned, if it was")
    path: str | None = Field(description="where its manifest is in the checkpoint store")
    bytes: int = Field(description="what its tasks wrote for it (only what changed)")
    full_bytes: int = Field(
        description="what a restore from it reads: every key group's chain of parts (the "
        "last whole capture and the changes after it)"
    )
    tasks: int = Field(description="tasks that took part")
    started_at: datetime
    duration_ms: float | None = Field(description="from its start to its end (null until then)")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, rec: CheckpointRecord) -> CheckpointRead:
        return cls(
            checkpoint_id=rec.checkpoint_id,
            job_id=rec.job_id,
            version=rec.version,
            status=CheckpointStatus(rec.status),
            error=rec.error,
            path=rec.path,
            bytes=rec.bytes,
            full_bytes=rec.full_bytes,
            tasks=rec.tasks,
            started_at=rec.started_at,
            duration_ms=rec.duration_ms,
            created_at=rec.created_at,
            updated_at=rec.updated_at,
        )


class SavepointCreate(BaseModel):
    """A savepoint to take of a running job (``POST /jobs/{id}/savepoints``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"stop": True}]})

    stop: bool = Field(
        False,
        description="stop the job once the savepoint is complete (its sinks having "
        "committed everything up to it), like `flink stop --savepointPath`",
    )


class SavepointRead(BaseModel):
    savepoint_id: int = Field(description="the coordinator's id of it (a checkpoint id)")
    job_id: int
    ref: str = Field(description='what POST /jobs takes as "from_savepoint": "<job id>/<id>"')
    status: CheckpointStatus = Field(
        description="in_progress, then completed (kept until deleted); abandoned when it "
        "could not complete"
    )
    version: int | None = Field(description="the abstraction version the job ran")
    error: str | None = Field(description="why it was abandoned, if it was")
    path: str | None = Field(description="where its manifest is in the checkpoint store")
    bytes: int = Field(description="what its tasks wrote for it (only what changed)")
    full_bytes: int = Field(description="what a job started from it reads")
    tasks: int = Field(description="tasks that took part")
    started_at: datetime
    duration_ms: float | None = Field(description="from its start to its end (null until then)")

    @classmethod
    def of(cls, rec: CheckpointRecord) -> SavepointRead:
        return cls.of_report(
            rec.job_id,
            {
                "checkpoint_id": rec.checkpoint_id,
                **{f: getattr(rec, f) for f in _REPORTED},
            },
        )

    @classmethod
    def of_report(cls, job_id: int, reported: dict[str, Any]) -> SavepointRead:
        """From what the coordinator reported of it (``CheckpointReport.reported``)."""
        started = reported["started_at"]
        if not isinstance(started, datetime):
            started = datetime.fromtimestamp(started, UTC)
        return cls(
            savepoint_id=reported["checkpoint_id"],
            job_id=job_id,
            ref=f"{job_id}/{reported['checkpoint_id']}",
            status=CheckpointStatus(reported["status"]),
            started_at=started,
            **{f: reported[f] for f in _REPORTED if f not in ("status", "started_at")},
        )


_REPORTED = (
    "status",
    "version",
    "error",
    "path",
    "bytes",
    "full_bytes",
    "tasks",
    "started_at",
    "duration_ms",
)
