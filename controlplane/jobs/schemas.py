"""API shapes of jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.checkpoints.restore import REF_PATTERN
from controlplane.checkpoints.schemas import (
    CheckpointPolicyRead,
    CheckpointSettings,
    RestartPolicyRead,
    RestartSettings,
)

from .models import JobRecord

__all__ = ["JobCreate", "JobRead", "JobStatus"]

Delivery = Literal["exactly-once", "at-least-once", "none"]
JobStatus = Literal[
    "starting", "running", "reconfiguring", "recovering", "finished", "failed", "stopped"
]


class JobCreate(BaseModel):
    """A job to deploy: ``job`` names registered code (an entry point of the
    ``streampilot.jobs`` group, ``module:callable`` of a registered module, or
    ``code:<id>:callable`` of an upload) taking the params dict and returning a
    ``runtime.Dataflow``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "wordcount",
                    "job": "examples.wordcount:build",
                    "params": {"records": 0, "rate": 5000},
                }
            ]
        },
    )

    name: str = Field(min_length=1, max_length=200)
    job: str = Field(
        min_length=1,
        max_length=500,
        description=(
            "registered code building the job: an entry point's name (wordcount), "
            "module:callable of a registered module, or code:<id>:callable"
        ),
    )
    params: dict[str, Any] = Field(default_factory=dict, description="passed to the callable")
    checkpoints: CheckpointSettings = Field(
        default_factory=CheckpointSettings,
        description=(
            "how the job is checkpointed: a field left out (or the whole object) takes the "
            'server default; {"interval_s": null} turns checkpoints off'
        ),
    )
    restart: RestartSettings = Field(
        default_factory=RestartSettings,
        description=(
            "how often the checkpointed job may recover from failures: a field left out (or "
            "the whole object) takes the server default"
        ),
    )
    from_savepoint: str | None = Field(
        None,
        pattern=REF_PATTERN,
        examples=["3/14"],
        description=(
            'start from this savepoint, "<job id>/<savepoint id>" (its "ref"): keyed '
            "operators (same names and max_parallelism, any parallelism), sources and "
            "stateful sinks (same parallelism) take their state from it; the job must take "
            "checkpoints"
        ),
    )


class JobRead(BaseModel):
    id: int = Field(description="also the abstraction's job.id (as a string)")
    name: str
    job: str
    params: dict[str, Any]
    status: JobStatus
    error: str | None = Field(description="why the job failed (or was stopped), if it did")
    version: int | None = Field(description="current abstraction version")
    checkpoints: CheckpointPolicyRead | None = Field(
        description="the checkpoint policy the job runs with (null: not checkpointed)"
    )
    restart: RestartPolicyRead | None = Field(
        description="the restart policy the job runs with (null only for a job recorded "
        "before restart policies were)"
    )
    from_savepoint: str | None = Field(
        None, description='the savepoint the job started from, "<job id>/<savepoint id>"'
    )
    delivery: dict[str, Delivery] | None = Field(
        None,
        description="per sink operator, what its output guarantees through failures: "
        "exactly-once (the job takes checkpoints and the sink commits with them), "
        "at-least-once (checkpoints, but a sink that does not commit with them: a recovery "
        "writes again what it wrote after the checkpoint) or none (no checkpoints: a "
        "failure fails the job); null for a job recorded before this was",
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, job: JobRecord) -> JobRead:
        return cls(
            id=job.id,
            name=job.name,
            job=job.job_ref,
            params=job.params,
            status=job.status,  # type: ignore[arg-type]
            error=job.error,
            version=job.version,
            checkpoints=(
                CheckpointPolicyRead.model_validate(job.checkpoints) if job.checkpoints else None
            ),
            restart=RestartPolicyRead.model_validate(job.restart) if job.restart else None,
            from_savepoint=job.from_savepoint,
            delivery=job.delivery,  # type: ignore[arg-type]
            created_at=job.created_at,
            updated_at=job.updated_at,
        )
