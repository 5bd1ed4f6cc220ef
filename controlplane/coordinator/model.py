"""What the coordinator keeps: the runtime settings it ships, workers, running jobs."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from controlplane.statuses import JobStatus, WorkerStatus
from runtime.dataflow import JobGraph
from runtime.layout import Layout
from runtime.metrics import summarize_latency

from .checkpoint_report import Failures
from .errors import CoordinatorError
from .metrics import JobMetrics
from .slot import ChangeSlot

if TYPE_CHECKING:
    from runtime.messages import CheckpointConfig, ToCoordinator

    from .checkpoint_report import CheckpointPolicy
    from .report import RunReport


class ActiveRun(Protocol):
    """What a job knows of the live run under way (:class:`.reconfig.LiveRun`)."""

    report: RunReport
    workers: list[str]  # the workers of the old or new layout

    def deliver(self, worker: str, msg: ToCoordinator) -> None: ...
    def task_finished(self, task: str) -> None: ...
    def fail(self, error: str) -> None: ...
    def cancel(self, reason: str) -> None: ...


class JobCheckpoints(Protocol):
    """What a job knows of its checkpoints (:class:`.checkpointer.Checkpointer`)."""

    latest: Any  # the last complete checkpoint (a Restorable), or None
    store: Any  # the checkpoint store

    def on_message(self, msg: ToCoordinator) -> None: ...
    def task_finished(self, task: str) -> None: ...
    def start(self) -> None: ...
    def stop(self, reason: str) -> None: ...
    def suspend(self, reason: str) -> None: ...
    def resume(self) -> None: ...
    async def quiesce(self) -> None: ...


__all__ = [
    "ActiveRun",
    "DeployInFlight",
    "JobCheckpoints",
    "RunningJob",
    "RuntimeConfig",
    "WorkerInfo",
]


@dataclass(frozen=True)
class RuntimeConfig:
    """How channels batch and buffer; shipped to workers with each deploy."""

    batch_size: int = 512  # records per batch sent on a channel
    linger_s: float = 0.005  # longest a record waits in a partly filled batch
    credits: int = 8  # batches in flight per channel (receiver buffer size)
    # A task whose key groups leave for another worker copies them ahead while it runs
    # when they come to at least this much state (runtime.precopy); None: never.
    precopy_min_bytes: int | None = 32 << 20
    # The copying ahead stops once what is left would ship within this pause, at the pace
    # of both ends measured while copying (0: copy everything ahead): a shorter change for
    # a longer pause of the tasks that give state.
    precopy_pause_ms: float = 0.0
    # Stages of a staged fluid change under way at once (coordinator.reconfig): 2 lets the
    # next stage's barrier travel while the state of the one before still moves, which
    # finishes sooner when the workers have CPU to spare and raises latency when not.
    stage_window: int = 1
    # Keyed tasks sketch their heaviest keys per input batch (runtime.hotkeys): the metrics'
    # hot_keys. False: they report key-group counts only.
    hot_keys: bool = True
    # Where jobs' checkpoints go (a directory or a pyarrow.fs URI), for jobs that take them.
    checkpoint_store: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "streampilot-checkpoints")
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "linger_s": self.linger_s,
            "credits": self.credits,
            "hot_keys": self.hot_keys,
        }


@dataclass
class WorkerInfo:
    id: str
    host: str
    pid: int
    cpus: float
    memory_mb: int
    data_host: str
    data_port: int
    name: str
    status: str = WorkerStatus.ALIVE  # alive | lost | stopped (retired on purpose)
    registered_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    cpu_percent: float = 0.0
    rss_mb: float = 0.0
    error: str | None = None
    executor_id: str | None = None  # the Spark executor hosting it (spark backend)


class DeployInFlight:
    """A deploy of a job waiting for the answers of the ``workers`` it deploys to
    (:meth:`.core.Coordinator.deploy`, step 3). :attr:`outcome` is set once every worker
    has answered (their errors joined, or None when all deployed), or at once when one of
    them is lost, answered or not (the error naming it first, then those come so far):
    what it deployed there is gone, and the deploy no longer waits for the rest. Answers
    after that are ignored."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = frozenset(workers)
        self.outcome: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._waiting = set(workers)
        self._errors: list[str] = []

    @property
    def waiting(self) -> list[str]:
        """The workers that have not answered yet."""
        return sorted(self._waiting)

    def answered(self, worker: str, error: str | None) -> None:
        """``worker`` deployed (``error`` None) or could not (``error``)."""
        if worker not in self._waiting or self.outcome.done():
            return
        self._waiting.discard(worker)
        if error:
            self._errors.append(error)
        if not self._waiting:
            self.outcome.set_result("; ".join(self._errors) or None)

    def lost(self, worker: str, error: str) -> None:
        """``worker`` is lost (``error`` says which and why)."""
        if worker in self.workers and not self.outcome.done():
            self.outcome.set_result("; ".join([error, *self._errors]))


class RunningJob:
    """A job deployed by this coordinator: its graph, layout, status and metrics (the
    control plane's database row of it is :class:`controlplane.jobs.models.Job`)."""

    def __init__(self, job_id: str, graph: JobGraph, layout: Layout) -> None:
        self.id = job_id
        self.graph = graph
        self.layout = layout
        self.reconfigurations: list[RunReport] = []  # their reports, oldest first
        self.active: ActiveRun | None = None  # the live run under way (a fluid step's too)
        self.slot = ChangeSlot(job_id)  # one reconfiguration at a time
        self.abstraction: Any = None  # the current version (controlplane.abstraction)
        self.versions: list = []  # every version, oldest first
        self.snapshot: Any = None  # a stop-and-restart in progress collects snapshots here
        self.checkpoint_policy: CheckpointPolicy | None = None  # None: never checkpointed
        self.checkpoint_config: CheckpointConfig | None = None  # as its workers are told it
        self.checkpointer: JobCheckpoints | None = None  # takes its checkpoints while it runs
        self.failures = Failures()  # its failures, and the recovery under way
        # Per worker, the state its last deploy restored from checkpoint parts (bytes read
        # from its local copies, from the store).
        self.restored: dict[str, dict[str, int]] = {}
        self.status = JobStatus.STARTING
        self.error: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.finished_tasks: set[str] = set()
        self.failed_tasks: dict[str, str] = {}
        operator_of = {t: op.name for op in graph.operators for t in op.task_ids()}
        self.metrics = JobMetrics(operator_of, {op.name: op.kind for op in graph.operators})
        self._done = asyncio.Event()
        # How many times it has been deployed: its first deploy is attempt 1, and each
        # later one (a recovery, a resume, a restart) one more. Workers refuse the data
        # connections of an earlier attempt than theirs (runtime.dataserver).
        self.attempt = 0
        # Replies the coordinator waits for: those of the deploy in flight, worker -> its
        # last counts of a stopped job, barrier id -> (tasks yet to ack, done).
        self.deploying: DeployInFlight | None = None
        self.stop_replies: dict[str, asyncio.Future] = {}
        self.barrier_waits: dict[int, tuple[set[str], asyncio.Future]] = {}

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self, timeout: float | None = None) -> JobStatus:
        """Wait until the job ends; returns its status. Raises TimeoutError after ``timeout``."""
        await asyncio.wait_for(self._done.wait(), timeout)
        return self.status

    def end(self, status: JobStatus, error: str | None = None) -> bool:
        """End the job as ``status`` (with ``error``) unless it has ended: a reconfiguration
        under way fails, barriers waited for fail with :class:`CoordinatorError`, and
        :meth:`wait` returns. True if this call ended it."""
        if self.done:
            return False
        if self.active is not None:
            self.active.fail(f"job {self.id} ended ({status}): {error or 'stopped'}")
        self.status = status
        self.error = error
        self.ended_at = time.time()
        self._done.set()
        if self.checkpointer is not None:
            self.checkpointer.stop(f"job {self.id} ended ({status})")
        for _, fut in self.barrier_waits.values():
            if not fut.done():
                fut.set_exception(
                    CoordinatorError(f"job {self.id} ended ({status}) before the barrier completed")
                )
        return True

    def summary(self) -> dict[str, Any]:
        """Records at sources and sinks, duration, throughput, latency percentiles."""
        end = self.ended_at or time.time()
        duration = max(end - (self.started_at or end), 1e-9)
        source_records = self.metrics.operator_totals("source")
        sink_records = self.metrics.operator_totals("sink")
        return {
            "job_id": self.id,
            "status": self.status,
            "error": self.error,
            "duration_s": round(duration, 3),
            "source_records": source_records,
            "sink_records": sink_records,
            "source_rate_per_s": round(source_records / duration, 1),
            "latency": summarize_latency(self.metrics.latency),
        }
