"""API shapes of reconfigurations: plans (Trisk's atomic operations), the helper
requests that build plans, and the record of each reconfiguration."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controlplane.versions.schemas import DiffRead

from .models import ReconfigurationRecord

__all__ = [
    "AssignLogicOp",
    "AssignResourceOp",
    "AssignWorkloadOp",
    "CopiedAhead",
    "LogicRequest",
    "MigrateRequest",
    "OpBody",
    "PlanCreate",
    "PreviewRead",
    "PreviewRequest",
    "RebalanceRequest",
    "ReconfigurationRead",
    "ReconfigurationStatus",
    "ScaleRequest",
    "SplitKeyOp",
    "Timings",
]

ReconfigurationStatus = Literal[
    "pending", "preparing", "syncing", "updating", "completed", "failed", "aborted", "cancelled"
]
Mode = Literal["pause", "fluid"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AssignWorkloadOp(_Strict):
    """The named tasks get exactly these key groups (keyed), partitions (a partitioned
    source) or weights (others)."""

    op: Literal["assignWorkload"]
    operator: str
    workload: dict[str, list[int] | list[str] | float] = Field(
        examples=[{"count-0": [0, 1, 2], "count-1": [3, 4, 5]}, {"src-0": ["orders-0"]}]
    )


class AssignResourceOp(_Strict):
    """Place a new task, move one, remove one (``worker: null``) or ask for a fresh worker
    (``worker: "new"``)."""

    op: Literal["assignResource"]
    operator: str
    task: str
    worker: str | None


class AssignLogicOp(_Strict):
    """Swap the logic of some tasks (or ``"all"``) to the callable ``ref``."""

    op: Literal["assignLogic"]
    operator: str
    tasks: list[str] | Literal["all"] = "all"
    ref: str


KeyValue = str | int | float | bool | None | list[Any]


class SplitKeyOp(_Strict):
    """Spread the records of one hot key of a combinable aggregation over the listed tasks
    (two or more; their parts are merged downstream), or route it to its own key group
    again (``tasks: []``)."""

    op: Literal["splitKey"]
    operator: str
    key: KeyValue = Field(examples=["the", 42, ["eu", 7]])
    tasks: list[str] = Field(examples=[["count-0", "count-1", "count-2"], []])


OpBody = Annotated[
    AssignWorkloadOp | AssignResourceOp | AssignLogicOp | SplitKeyOp, Field(discriminator="op")
]


class _Paced(_Strict):
    """How the change is made: ``pause`` (every affected task pauses until its part is
    done) or ``fluid`` (tasks that only give or gain key groups go on; records of a moving
    group wait for its state), in steps of ``batch_size`` key groups, or of about
    ``batch_bytes`` of state, out of and into each task, or in one step."""

    mode: Mode = "pause"
    batch_size: int | None = Field(
        None,
        ge=1,
        description="fluid mode: key groups each task gives or gains per step (none: all in one step)",
    )
    batch_bytes: int | None = Field(
        None,
        ge=1,
        description="fluid mode, instead of batch_size: about this many bytes of state each "
        "task gives or gains per step, turned into a batch_size (shown in the record) from "
        "the state sizes measured over the last 10 s",
    )

    @model_validator(mode="after")
    def _one_pace(self) -> _Paced:
        if self.batch_bytes is not None and self.batch_size is not None:
            raise ValueError("give batch_size or batch_bytes, not both")
        if self.batch_bytes is not None and self.mode != "fluid":
            raise ValueError('batch_bytes paces a fluid change: set mode to "fluid"')
        return self


class PlanCreate(_Paced):
    """Operations against ``base_version``, validated as a whole and applied together."""

    base_version: int = Field(ge=1)
    ops: list[OpBody] = Field(min_length=1)

    def document(self) -> dict[str, Any]:
        """The plan document (``batch_bytes`` is turned into a ``batch_size`` later)."""
        return self.model_dump(include={"base_version", "ops", "mode", "batch_size"})


MAX_TASKS = 4096  # tasks of one operator at most (its key groups bound a keyed one lower)


class ScaleRequest(_Paced):
    operator: str
    parallelism: int = Field(ge=1, le=MAX_TASKS)
    workers: list[str] | None = Field(
        None, description='where new tasks go, in turn (ids, or "new" for a fresh worker)'
    )


class RebalanceRequest(_Paced):
    operator: str
    loads: dict[str, float] | None = Field(
        None,
        description="key group -> load (keyed operators) or task id -> per-record cost "
        "(others); default for keyed operators: each key group's measured record rate over "
        "window_s (an even split by count when nothing was measured), for others equal weights",
    )
    threshold: float = Field(
        0.1, ge=0, description="do nothing unless the busiest task is this much above the mean"
    )
    window_s: float = Field(10.0, gt=0, le=300, description="measurement window for loads")


class MigrateRequest(_Paced):
    task: str
    worker: str = Field(description='a worker id, or "new" for a fresh worker')
    with_forward: bool = Field(
        False,
        description="also move the tasks of the same index that forward edges link to it "
        "(what Flink chains with it), so those edges stay on one worker",
    )


class LogicRequest(_Strict):
    operator: str
    logic: str = Field(
        description="module:callable in a registered module, or code:<id>:callable of an upload"
    )
    tasks: list[str] | None = Field(None, description="default: every task of the operator")


class Timings(BaseModel):
    """Phase durations in milliseconds; null for a phase not reached (yet)."""

    prepare: float | None = None
    precopy: float | None = Field(
        default=None,
        description="part of prepare: the longest a worker spent copying key groups ahead",
    )
    sync: float | None = None
    update: float | None = None
    total: float | None = None


class RecoveryRead(BaseModel):
    """Why and how a recovery made its version."""

    reason: str = Field(description="the failure it recovered from")
    checkpoint_id: int = Field(description="the checkpoint it went back to")
    lost_workers: list[str] = Field(description="workers gone, whose tasks it placed anew")
    placed_on: dict[str, str] = Field(description="each lost worker -> the one in its place")
    restored: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="per worker, the key-group state it restored: local_bytes from its own "
        "copies of the parts it wrote (task-local recovery, when the store is remote), "
        "store_bytes read from the checkpoint store",
    )
    timings_ms: dict[str, float] = Field(
        description="halt (stopping the job's tasks), place (finding or starting workers for "
        "lost ones), restore (deploying from the checkpoint, state read from the store, and "
        "starting), total"
    )


class CopiedAhead(BaseModel):
    """What one worker copied ahead in the prepare (pre-copy: key groups leaving for
    another worker, copied while their tasks run, so the update ships only what changed
    since), and where that time went. Summed over the steps of a fluid plan."""

    ms: float = Field(description="from the start of the copying to its end")
    bytes: int = Field(description="state copied ahead")
    groups: int = Field(description="key groups copied ahead")
    left_bytes: int | None = Field(
        None,
        description="state of leaving key groups not copied ahead (a pause budget, the "
        "copying budget), shipped whole in the update",
    )
    waited_ms: float | None = Field(
        None,
        description="waiting for this worker's tasks to catch up with their input: the "
        "copying goes at idle priority",
    )
    room_ms: float | None = Field(
        None, description="waiting for the receiving workers to read the copies sent"
    )
    sending_ms: float | None = Field(None, description="pickling and writing the copies")


class ReconfigurationRead(BaseModel):
    id: int
    job_id: int
    origin: str = Field(
        description="plan, scale, rebalance, migrate or logic; recovery for a version a "
        "recovery made (its plan says why: reason, checkpoint_id, lost_workers, placed_on); "
        "discovery for partitions a source found, given out (see discovered); "
        "controller <id> for a controller's plan"
    )
    status: ReconfigurationStatus
    base_version: int
    result_version: int | None = Field(description="the version it made current")
    mode: Mode
    batch_size: int | None = Field(
        description="fluid mode: key groups each task gives or gains per step (none: one step)"
    )
    ops: list[OpBody]
    affected_tasks: list[str]
    error: str | None
    timings_ms: Timings
    pause_ms: dict[str, float] = Field(description="per affected task, how long it paused")
    update_ms: dict[str, float] = Field(
        description="per affected task, how long its part of the update took, to resuming; a "
        "task that did not pause (fluid mode) until the last key group it gains had arrived "
        "and the records waiting for it were processed (fluid steps: the longest)"
    )
    runs: int | None = Field(
        description="live runs (prepare, sync, update) it took so far: one, or in fluid mode "
        "one per step except the steps that only move key groups, which are stages of the "
        "run before them"
    )
    stage_ms: list[float] = Field(
        description="fluid mode: how long each stage (a step run within the run before it) "
        "took, from its start to every worker being done with it (with a stage window above 1 "
        "stages overlap, and these can add up to more than the update took)"
    )
    precopied: dict[str, CopiedAhead] = Field(
        description="per worker that copied key groups ahead in the prepare (see "
        "timings_ms.precopy), what it copied and where that time went"
    )
    recovery: RecoveryRead | None = Field(
        None, description="origin recovery: the failure, the checkpoint, the workers replaced"
    )
    discovered: dict[str, list[str]] | None = Field(
        None,
        description="origin discovery: per partitioned source, the partitions it found that "
        "this change gave out",
    )
    created_at: datetime
    ended_at: datetime | None

    @classmethod
    def of(cls, rec: ReconfigurationRecord) -> ReconfigurationRead:
        return cls(
            id=rec.id,
            job_id=rec.job_id,
            origin=rec.origin,
            status=rec.status,  # type: ignore[arg-type]
            base_version=rec.base_version,
            result_version=rec.result_version,
            mode=rec.plan.get("mode", "pause"),
            batch_size=rec.plan.get("batch_size"),
            ops=rec.plan["ops"],
            affected_tasks=rec.affected_tasks,
            error=rec.error,
            timings_ms=Timings.model_validate(rec.timings_ms),
            pause_ms=rec.pause_ms,
            update_ms=rec.update_ms,
            runs=rec.runs,
            stage_ms=rec.stage_ms,
            precopied=rec.precopied,
            recovery=rec.plan.get("recovery"),
            discovered=rec.plan.get("discovered"),
            created_at=rec.created_at,
            ended_at=rec.ended_at,
        )


class PlanPreview(PlanCreate):
    origin: Literal["plan"]


class ScalePreview(ScaleRequest):
    origin: Literal["scale"]


class RebalancePreview(RebalanceRequest):
    origin: Literal["rebalance"]


class MigratePreview(MigrateRequest):
    origin: Literal["migrate"]


class LogicPreview(LogicRequest):
    origin: Literal["logic"]


PreviewRequest = Annotated[
    PlanPreview | ScalePreview | RebalancePreview | MigratePreview | LogicPreview,
    Field(discriminator="origin"),
]


class PreviewRead(BaseModel):
    """What a reconfiguration would do, validated as if posted, and not carried out."""

    origin: str = Field(
        description="plan, scale, rebalance, migrate or logic; recovery for a version a "
        "recovery made (its plan says why: reason, checkpoint_id, lost_workers, placed_on); "
        "discovery for partitions a source found, given out (see discovered); "
        "controller <id> for a controller's plan"
    )
    base_version: int
    result_version: int = Field(
        description="the version it would make current (fluid mode: one version per step)"
    )
    mode: Mode
    batch_size: int | None = Field(
        description="fluid mode: key groups each task gives or gains per step (none: one step)"
    )
    ops: list[OpBody]
    affected_tasks: list[str]
    steps: int = Field(description="versions it would go through: 1, or one per fluid step")
    key_group_moves: int = Field(description="key groups that would change task")
    state_bytes_shipped: int | None = Field(
        description="estimated bytes of keyed state it would ship between workers, from the "
        "state sizes measured over the last 10 s; null when a moving task's size is unknown"
    )
    largest_step_bytes: int | None = Field(
        description="of that, the most one step would ship (pause mode: all of it): what the "
        "tasks of a step wait for, and what controllers' max_state_bytes_per_step limits"
    )
    diff: DiffRead = Field(description="the result against the current version")
