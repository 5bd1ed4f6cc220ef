"""API shapes of events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EventRead"]


class EventRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    time: datetime
    kind: str = Field(
        description="e.g. job.failed, job.recovering, checkpoint.abandoned, worker.lost"
    )
    job_id: int | None
    message: str
    data: dict[str, Any]
