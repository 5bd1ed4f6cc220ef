"""What the reconfiguration machine (:mod:`.protocol`) takes and answers with: its
timeouts and timers, the events of a run, the commands for its driver, and the shape of
the change a run makes. Plain frozen data.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.dataflow import JobGraph
from runtime.layout import Layout, affected_tasks

__all__ = [
    "ABORT_TIMEOUT_S",
    "PREPARE_TIMEOUT_S",
    "SYNC_TIMEOUT_S",
    "UPDATE_TIMEOUT_S",
    "Announce",
    "Announced",
    "CancelRequested",
    "Command",
    "Commit",
    "End",
    "EndStages",
    "Event",
    "FailJob",
    "Failed",
    "InjectSyncBarrier",
    "Paused",
    "Prepared",
    "RunShape",
    "SendAbort",
    "SendPrepare",
    "SendUpdate",
    "StageDone",
    "StageMessage",
    "StageWithdrawn",
    "Start",
    "StartTimer",
    "StopTimer",
    "TaskFinished",
    "TimedOut",
    "Timer",
    "Updated",
    "union_affected",
]

PREPARE_TIMEOUT_S = 15.0  # workers create idle tasks and channels and load logic within this
SYNC_TIMEOUT_S = 10.0  # the barrier reaches every affected task within this, or we abort
UPDATE_TIMEOUT_S = 60.0  # state moves and tasks resume within this (100 MB over loopback: ~1 s)
ABORT_TIMEOUT_S = 5.0  # workers answer a stage's withdrawal within this


class Timer(enum.Enum):
    PREPARE = "prepare"  # PREPARE_TIMEOUT_S from the prepare
    SYNC = "sync"  # the sync timeout from the barrier
    UPDATE = "update"  # UPDATE_TIMEOUT_S from the update
    STAGE = "stage"  # the sync timeout from the start of the first stage under way
    WITHDRAW = "withdraw"  # ABORT_TIMEOUT_S from a stage's withdrawal
    DRAIN = "drain"  # the sync timeout for the last stage_done once every task updated


# -- events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The run begins (the caller has checked that it may)."""


@dataclass(frozen=True)
class Announced:
    """The driver told the listeners of the phase just entered (see :class:`Announce`)."""


@dataclass(frozen=True)
class Prepared:
    worker: str
    error: str | None = None
    precopied: dict[str, float] | None = None


@dataclass(frozen=True)
class Paused:
    task: str


@dataclass(frozen=True)
class Updated:
    worker: str
    task: str
    pause_ms: float
    update_ms: float


@dataclass(frozen=True)
class StageDone:
    worker: str
    stage: int


@dataclass(frozen=True)
class StageWithdrawn:
    worker: str
    clean: bool


@dataclass(frozen=True)
class TaskFinished:
    """A task ended (its inputs ended); ``job_ended``: whether the job has ended now."""

    task: str
    job_ended: bool = False


@dataclass(frozen=True)
class CancelRequested:
    reason: str


@dataclass(frozen=True)
class Failed:
    """Something the run waits on failed (a task, a worker, the job)."""

    error: str
    job_ended: bool = False


@dataclass(frozen=True)
class TimedOut:
    timer: Timer


Event = (
    Start
    | Announced
    | Prepared
    | Paused
    | Updated
    | StageDone
    | StageWithdrawn
    | TaskFinished
    | CancelRequested
    | Failed
    | TimedOut
)

# -- commands ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendPrepare:
    """Send ``prepare`` (with the new layout) to every worker of the run."""


@dataclass(frozen=True)
class InjectSyncBarrier:
    """Inject the run's barrier at the sources (every worker of the old layout)."""


@dataclass(frozen=True)
class SendUpdate:
    """Send ``update`` to every worker of the run."""


@dataclass(frozen=True)
class SendAbort:
    """Send ``abort`` to every worker of the run."""


@dataclass(frozen=True)
class StageMessage:
    """Send stage ``stage``'s ``start`` (or ``withdraw``) to each worker listed, with the
    entry tasks it hosts."""

    stage: int
    withdraw: bool
    to: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class EndStages:
    """Tell every worker of the run that the change ends at stage ``last``."""

    last: int


@dataclass(frozen=True)
class StartTimer:
    """(Re)start ``timer``: :class:`TimedOut` in ``seconds`` unless stopped first."""

    timer: Timer
    seconds: float


@dataclass(frozen=True)
class StopTimer:
    timer: Timer


@dataclass(frozen=True)
class Announce:
    """Tell the listeners that the report changed; with ``then_continue``, hand back
    :class:`Announced` once they have been told."""

    then_continue: bool = False


@dataclass(frozen=True)
class Commit:
    """The job now runs ``layout``."""

    layout: Layout


@dataclass(frozen=True)
class FailJob:
    """Fail the job with ``error`` (state may be half moved)."""

    error: str


@dataclass(frozen=True)
class End:
    """The run is over (the report says how); ``aborted``: it was undone before its update."""

    aborted: bool = False


Command = (
    SendPrepare
    | InjectSyncBarrier
    | SendUpdate
    | SendAbort
    | StageMessage
    | EndStages
    | StartTimer
    | StopTimer
    | Announce
    | Commit
    | FailJob
    | End
)


@dataclass(frozen=True)
class RunShape:
    """What a run changes: ``old`` to ``new`` over ``affected``; ``stages`` (a staged fluid
    run): the layouts from the first stage (the update's) to ``new``, else empty."""

    graph: JobGraph
    old: Layout
    new: Layout
    affected: frozenset[str]
    stages: tuple[Layout, ...] = ()
    sync_timeout_s: float = SYNC_TIMEOUT_S
    stage_window: int = 1

    @property
    def workers(self) -> list[str]:
        """Every worker of the old or new layout, sorted."""
        return sorted(set(self.old.placement.values()) | set(self.new.placement.values()))


def union_affected(graph: JobGraph, path: Sequence[Layout]) -> frozenset[str]:
    """The tasks a change along ``path`` (layouts, each to the next) touches: the union of
    :func:`runtime.layout.affected_tasks` over its steps; the one rule for a
    reconfiguration's affected set."""
    return frozenset().union(*(affected_tasks(graph, a, b) for a, b in itertools.pairwise(path)))
