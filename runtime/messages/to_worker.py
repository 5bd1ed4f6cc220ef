"""Messages the coordinator sends a worker (documented in :mod:`runtime.messages`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ..layout import Layout
from ..records import BarrierKind
from ._codec import ToWorker, message, struct

__all__ = [
    "AbandonCheckpoint",
    "Abort",
    "Address",
    "ChannelConfig",
    "CheckpointConfig",
    "CommitCheckpoint",
    "Deploy",
    "EndInput",
    "InjectBarrier",
    "ListPartitions",
    "Prepare",
    "Refused",
    "Registered",
    "Restore",
    "Savepoint",
    "Shutdown",
    "StageStart",
    "StageWithdraw",
    "StagesEnd",
    "Start",
    "Stop",
    "Update",
    "Warm",
]

Address = tuple[str, int]  # a worker's data address, (host, port)


@struct
class ChannelConfig:
    """How channels batch and buffer, and whether keyed tasks sketch their heaviest keys
    (from the coordinator's ``RuntimeConfig``)."""

    batch_size: int
    linger_s: float
    credits: int
    hot_keys: bool = True


@struct
class CheckpointConfig:
    """Where a job's tasks write their checkpoint parts (a store location: a directory or
    a ``pyarrow.fs`` URI) and how long a key group's chain of incremental parts may grow
    before the group is captured whole again."""

    store: str
    full_every: int = 8


@struct
class Restore:
    """What a task starts from in a restart or a recovery: its key groups' state (bytes,
    from a savepoint; or ``chains``: per group, the parts of a checkpoint to read from the
    job's checkpoint store, [path, offset, length, full, keys] each), its source position
    (None: from the start) and its sink writer's snapshot (None: nothing to restore)."""

    groups: dict[int, bytes] = field(default_factory=dict)
    position: Any = None
    chains: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    sink: Any = None


@message("registered")
class Registered(ToWorker):
    worker_id: str


@message("refused")
class Refused(ToWorker):
    reason: str


@message("deploy")
class Deploy(ToWorker):
    job_id: str
    graph: bytes
    code: dict[str, str]
    layout: Layout
    workers: dict[str, Address]
    config: ChannelConfig
    attempt: int  # which deployment of the job this is: 1, then one more at each redeploy
    restore: dict[str, Restore] = field(default_factory=dict)
    checkpoints: CheckpointConfig | None = None


@message("warm")
class Warm(ToWorker):
    job_id: str
    graph: bytes
    code: dict[str, str]


@message("start")
class Start(ToWorker):
    job_id: str
    start_time: float


@message("inject_barrier")
class InjectBarrier(ToWorker):
    job_id: str
    kind: BarrierKind
    barrier_id: int


@message("stop")
class Stop(ToWorker):
    job_id: str


@message("prepare")
class Prepare(ToWorker):
    job_id: str
    rid: int
    barrier_id: int
    layout: Layout
    affected: tuple[str, ...]
    workers: dict[str, Address]
    code: dict[str, str]
    fluid: bool = False
    precopy_min_bytes: int | None = None
    precopy_budget_s: float = 0.0
    precopy_pause_s: float = 0.0
    stages: tuple[Layout, ...] = ()
    stage_barriers: tuple[int, ...] = ()
    # For a worker that hosts none of the job's tasks yet (it joins the job), else None.
    graph: bytes | None = None
    current_layout: Layout | None = None
    config: ChannelConfig | None = None
    start_time: float | None = None
    checkpoints: CheckpointConfig | None = None
    attempt: int | None = None  # the job's deployment running now (see Deploy)


@message("update")
class Update(ToWorker):
    job_id: str
    rid: int


@message("abort")
class Abort(ToWorker):
    job_id: str
    rid: int


@message("stage")
class StageStart(ToWorker):
    job_id: str
    rid: int
    stage: int
    barrier_id: int
    inject: tuple[str, ...]


@message("stage_withdraw")
class StageWithdraw(ToWorker):
    job_id: str
    rid: int
    stage: int
    barrier_id: int
    inject: tuple[str, ...]


@message("stages_end")
class StagesEnd(ToWorker):
    job_id: str
    rid: int
    last: int


@message("abandon_checkpoint")
class AbandonCheckpoint(ToWorker):
    job_id: str
    checkpoint_id: int


@message("commit_checkpoint")
class CommitCheckpoint(ToWorker):
    """Checkpoint ``checkpoint_id`` is complete: sinks make visible what they prepared
    at its barrier (and at any earlier one)."""

    job_id: str
    checkpoint_id: int


@message("end_input")
class EndInput(ToWorker):
    """Source task ``task`` of a bounded partitioned source, left without partitions,
    will be given none: every task that read one has finished, so it ends too."""

    job_id: str
    task: str


@message("list_partitions")
class ListPartitions(ToWorker):
    """List the partitions of the partitioned sources ``operators`` of ``graph`` (a
    pickled job graph whose code ``code`` holds) and answer ``partitions_listed``."""

    request_id: int
    graph: bytes
    code: dict[str, str]
    operators: tuple[str, ...]


@message("savepoint")
class Savepoint(ToWorker):
    job_id: str
    barrier_id: int


@message("shutdown")
class Shutdown(ToWorker):
    pass
