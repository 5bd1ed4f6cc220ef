"""API shapes of a job's metrics window (all rates are per second over the window)."""

from __future__ import annotations

from pydantic import BaseModel, Field, JsonValue

__all__ = [
    "ChannelMetrics",
    "HotKeyRate",
    "JobMetricsRead",
    "LatencyRead",
    "OperatorMetrics",
    "TaskMetrics",
    "WorkerUsage",
]


class PartitionHealth(BaseModel):
    lag: int | None = Field(
        description="records between its position and the head of the input, as the "
        "reader last saw it (None: the source cannot tell)"
    )
    stalled: str | None = Field(
        description="why it cannot be read now (the reader retries), None while it reads"
    )


class HotKeyRate(BaseModel):
    """One of a keyed task's heaviest keys over the window (a Space-Saving sketch of a
    sample of each input batch, see ``runtime.hotkeys``). ``per_s - error_per_s`` is a
    lower bound of its rate; ``per_s`` an upper bound when it was among the task's top
    keys in every report of the window (a report it was not among counts 0), both up to
    the sampling's noise."""

    key: JsonValue = Field(
        description="the key (a tuple as an array), or its repr when key_repr is true"
    )
    key_repr: bool = Field(
        False,
        description="the key is shown as its repr, cut at 200 characters: JSON cannot carry "
        "it (bytes, a non-finite float, an int past 64 bits, another type) or it is longer",
    )
    group: int = Field(description="its key group")
    per_s: float = Field(description="its estimated records per second")
    error_per_s: float = Field(description="the most per_s may overcount it by")
    share: float = Field(ge=0, le=1, description="its fraction of the task's input")


class TaskMetrics(BaseModel):
    task: str
    operator: str
    worker: str | None = Field(description="where the task runs now (None once removed)")
    in_per_s: float
    out_per_s: float
    busy: float = Field(ge=0, le=1, description="fraction of the window spent processing")
    backpressure: float = Field(ge=0, le=1, description="fraction blocked on full outputs")
    queued: dict[str, int] = Field(description="records waiting, per upstream task (latest)")
    key_groups: dict[int, int] = Field(
        description="records per key group summed over the window (keyed tasks only)"
    )
    hot_keys: list[HotKeyRate] = Field(
        default_factory=list, description="its heaviest keys, heaviest first (keyed tasks)"
    )
    state_keys: int | None = Field(None, description="keys in its state (keyed tasks; latest)")
    state_bytes: int | None = Field(
        None,
        description="its keyed state's size as a move ships it (pickled), estimated from a "
        "few keys per key group (keyed tasks; latest)",
    )
    state_key_groups: dict[int, int] | None = Field(
        None,
        description="of that, each key group it owns (0 when empty; keyed tasks; latest)",
    )
    partitions: dict[str, PartitionHealth] | None = Field(
        None, description="each partition it reads (a partitioned source's tasks; latest)"
    )
    lag: int | None = Field(
        None,
        description="records behind the head of its input (a source task that is not "
        "partitioned and knows it, e.g. a throttled generator's backlog; latest)",
    )
    watermark: float | None = Field(
        None,
        description="its event-time watermark, seconds since the epoch (jobs on event time; "
        "latest; None before the first and after the last)",
    )
    watermark_lag_s: float | None = Field(
        None, description="how far its watermark trails the wall clock (latest)"
    )
    late_records: int = Field(0, description="records its windows or joins took as late")


class OperatorMetrics(BaseModel):
    operator: str
    kind: str
    tasks: int = Field(description="tasks that reported in the window")
    in_per_s: float
    out_per_s: float
    busy: float = Field(ge=0, le=1, description="mean over its tasks")
    backpressure: float = Field(ge=0, le=1, description="mean over its tasks")
    queued: int = Field(description="records waiting at its tasks (latest)")
    state_bytes: int | None = Field(
        None, description="estimated size of its tasks' keyed state (keyed operators; latest)"
    )
    watermark: float | None = Field(None, description="the lowest of its tasks' watermarks")
    watermark_lag_s: float | None = Field(
        None, description="how far that watermark trails the wall clock (the most of its tasks)"
    )
    late_records: int = Field(0, description="records its tasks took as late")


class ChannelMetrics(BaseModel):
    """Traffic from one task to another (one cell of the traffic matrix)."""

    source: str
    target: str
    records_per_s: float
    bytes_per_s: float


class LatencyRead(BaseModel):
    """End-to-end latency measured at the sinks over the window (0 when none reported)."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    count: int


class WorkerUsage(BaseModel):
    worker: str
    cpu_percent: float
    rss_mb: float


class JobMetricsRead(BaseModel):
    job_id: int
    window_s: float
    samples: int = Field(description="worker snapshots in the window (about one per task-second)")
    tasks: list[TaskMetrics]
    operators: list[OperatorMetrics]
    traffic: list[ChannelMetrics]
    latency: LatencyRead
    workers: list[WorkerUsage] = Field(description="usage of the workers hosting the job")
