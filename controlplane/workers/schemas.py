"""API shapes of workers."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.engine import WorkerView

__all__ = ["WorkerRead", "WorkerRecordRead", "WorkersCreate"]

MAX_NEW_WORKERS = 16  # one request starts at most this many local processes


class WorkersCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"count": 1}]})

    count: int = Field(ge=1, le=MAX_NEW_WORKERS, description="workers to start")


class WorkerRead(BaseModel):
    id: str
    host: str
    pid: int
    cpus: float
    memory_mb: int
    status: Literal["alive", "lost", "stopped"]
    cpu_percent: float
    rss_mb: float
    tasks: list[str] = Field(description="tasks of live jobs placed here, as job/task")
    error: str | None = Field(None, description="why the worker was lost")
    executor_id: str | None = Field(None, description="the Spark executor hosting it")

    @classmethod
    def of(cls, w: WorkerView) -> WorkerRead:
        return cls(
            id=w.id,
            host=w.host,
            pid=w.pid,
            cpus=w.cpus,
            memory_mb=w.memory_mb,
            status=w.status,  # type: ignore[arg-type]
            cpu_percent=w.cpu_percent,
            rss_mb=w.rss_mb,
            tasks=list(w.tasks),
            error=w.error,
            executor_id=w.executor_id,
        )


class WorkerRecordRead(BaseModel):
    """A worker of this or an earlier run of the control plane, as last seen."""

    model_config = ConfigDict(from_attributes=True)

    instance: str = Field(description="the control-plane run it belonged to")
    worker_id: str
    host: str
    pid: int
    cpus: float
    memory_mb: int
    executor_id: str | None
    status: Literal["alive", "lost", "stopped"]
    error: str | None = Field(description="why it was lost")
    registered_at: datetime
    ended_at: datetime | None
