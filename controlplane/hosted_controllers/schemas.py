"""API shapes of controllers, their decisions and their log lines."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ControllerRead", "DecisionRead", "LogRead"]

ControllerStatus = Literal["running", "stopped", "failed"]


class ControllerRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    job_id: int
    builtin: str | None = Field(description="the built-in it runs, or None for a script")
    filename: str | None = Field(description="the uploaded script's file name")
    class_name: str = Field(description="the Controller subclass it runs")
    config: dict[str, Any]
    safety: dict[str, Any] = Field(
        description="limits the host enforces: cooldown_s, scale_out_cooldown_s (null: "
        "cooldown_s), min/max_parallelism, max_moves_per_hour, max_state_bytes_per_step, "
        "dry_run"
    )
    interval_s: float = Field(description="seconds between two decide calls")
    status: ControllerStatus
    error: str | None = Field(description="the last failure, or why it stopped")
    restarts: int = Field(description="times its process was restarted (crash, hang)")
    failures: int = Field(description="consecutive failures (it fails at the server's limit)")
    decisions_without_plan: int
    last_decision_at: datetime | None
    created_at: datetime
    updated_at: datetime


class DecisionRead(BaseModel):
    """A plan the controller returned and what became of it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    time: datetime
    view: dict[str, Any] = Field(description="summary of the view it decided on")
    plan: dict[str, Any]
    status: Literal["pending", "completed", "failed", "aborted", "cancelled", "refused", "dry_run"]
    applied: bool = Field(description="whether it became a reconfiguration of the job")
    moves: int = Field(description="key groups the plan moves")
    reconfiguration_id: int | None
    error: str | None = Field(description="why it was refused or failed")
    ended_at: datetime | None


class LogRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    time: datetime
    source: Literal["script", "host"] = Field(description="its own output, or the host's note")
    message: str
