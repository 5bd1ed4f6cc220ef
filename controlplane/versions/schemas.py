"""API shapes of the task-centric abstraction (docs/design.md, section 2), its versions and diffs.

They mirror :meth:`controlplane.abstraction.Abstraction.to_dict` and
:meth:`controlplane.abstraction.Diff.to_dict` field for field, so the OpenAPI description
documents the JSON the pure model reads and writes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

from .models import AbstractionVersion

__all__ = [
    "AbstractionRead",
    "DiffRead",
    "InputRead",
    "LogicRead",
    "OperatorDiffRead",
    "OperatorRead",
    "ResourcesRead",
    "TaskRead",
    "VersionRead",
    "WorkerRead",
    "WorkloadRead",
]


class JobHeader(BaseModel):
    id: str = Field(description="the job's id (JobRead.id, as a string)")
    name: str
    version: int
    status: str


class InputRead(BaseModel):
    upstream: str
    partitioning: Literal["forward", "rebalance", "key_groups", "broadcast"]


class LogicRead(BaseModel):
    ref: str = Field(description="package.module:callable or code:<id>:callable")
    version: int


class WorkloadRead(BaseModel):
    """Exactly one of ``key_groups`` (keyed operators), ``partitions`` (a partitioned
    source's tasks) and ``weight`` (the others)."""

    key_groups: list[int] | None = None
    partitions: list[str] | None = None
    weight: float | None = None

    @model_serializer(mode="wrap")
    def _only_the_set_one(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ResourcesRead(BaseModel):
    worker: str
    host: str | None
    cpus: float
    memory_mb: int


class TaskRead(BaseModel):
    id: str
    logic: LogicRead
    workload: WorkloadRead
    resources: ResourcesRead


class SplitKeyRead(BaseModel):
    key: Any = Field(description="the key (an array for a tuple key)")
    groups: list[int] = Field(description="the key groups holding its parts, its own first")


class SplitChangeRead(BaseModel):
    key: Any
    before: list[int] = Field(description="its parts' groups before (empty: not split)")
    after: list[int] = Field(description="its parts' groups after (empty: not split)")


class OperatorRead(BaseModel):
    name: str
    kind: Literal["source", "map", "keyed", "sink"]
    transform: str = Field(description="the runtime kind: source, map, flat_map, filter, ...")
    max_parallelism: int | None = Field(description="key groups of a keyed operator")
    inputs: list[InputRead]
    tasks: list[TaskRead]
    combinable: bool = Field(
        False,
        description="the partial side of key_by(...).aggregate(...) or "
        "window_aggregate(...): keys may split",
    )
    split_keys: list[SplitKeyRead] = Field(
        default_factory=list, description="keys split over several tasks, their parts' groups"
    )


class WorkerRead(BaseModel):
    id: str
    host: str | None
    cpus: float
    memory_mb: int
    backend: str
    status: str
    slots: int
    executor_id: str | None = Field(None, description="the Spark executor hosting it")


class AbstractionRead(BaseModel):
    job: JobHeader
    operators: list[OperatorRead]
    workers: list[WorkerRead]


class VersionRead(BaseModel):
    version: int
    reconfiguration_id: int | None = Field(description="the reconfiguration that made it")
    created_at: datetime

    @classmethod
    def of(cls, row: AbstractionVersion) -> VersionRead:
        return cls(
            version=row.version,
            reconfiguration_id=row.reconfiguration_id,
            created_at=row.created_at,
        )


class OperatorDiffRead(BaseModel):
    operator: str
    key_group_moves: list[tuple[int, str, str]] = Field(description="(group, from, to)")
    partition_moves: list[tuple[str, str, str]] = Field(
        default_factory=list, description="a partitioned source's (partition, from, to)"
    )
    weight_changes: list[tuple[str, float, float]] = Field(description="(task, old, new)")
    new_tasks: list[str]
    removed_tasks: list[str]
    moved_tasks: list[tuple[str, str, str]] = Field(description="(task, from worker, to)")
    logic_changes: list[tuple[str, LogicRead, LogicRead]] = Field(description="(task, old, new)")
    split_changes: list[SplitChangeRead] = Field(default_factory=list)


class DiffRead(BaseModel):
    job_id: str
    old_version: int
    new_version: int
    operators: list[OperatorDiffRead]
    new_workers: list[str]
    removed_workers: list[str]
    affected: list[str] = Field(description="tasks a reconfiguration between them touches")
    upstream_routing_changes: list[str]
    downstream_channel_changes: list[str]
