"""What a job's checkpoints are set to do, the report of one checkpoint, and how often
a job may recover from its failures (plain data the coordinator and the control plane
share).

A :class:`CheckpointPolicy` comes with a job (its submission, over the server's
defaults); the coordinator takes a checkpoint every ``interval_s`` while the job runs.
A :class:`CheckpointReport` is plain data, like :class:`.report.RunReport`: the
coordinator fills it in as the checkpoint goes and tells the control plane's listener;
:meth:`CheckpointReport.reported` is the one mapping to what the ``checkpoints`` row and
the REST schema hold.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controlplane.statuses import CheckpointStatus

__all__ = ["CheckpointKind", "CheckpointPolicy", "CheckpointReport", "Failures", "RestartPolicy"]


class CheckpointKind(StrEnum):
    """What took a snapshot of the job: the policy's timer (a ``checkpoint``, kept while
    retention keeps it) or a request (a ``savepoint``, kept until it is deleted)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


@dataclass(frozen=True)
class CheckpointPolicy:
    """``interval_s``: seconds from one checkpoint's start to the next (None: no
    checkpoints); ``timeout_s``: a checkpoint not complete within this is abandoned;
    ``retained``: complete checkpoints kept (older ones and abandoned ones are removed
    from the store); ``full_every``: a key group's chain of incremental parts is at most
    this long before the group is written whole again (what a restore reads)."""

    interval_s: float | None = 10.0
    timeout_s: float = 60.0
    retained: int = 3
    full_every: int = 8

    def __post_init__(self) -> None:
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"checkpoint interval must be positive or None, got {self.interval_s}")
        if self.timeout_s <= 0:
            raise ValueError(f"checkpoint timeout must be positive, got {self.timeout_s}")
        if self.retained < 1:
            raise ValueError(f"at least one complete checkpoint is retained, got {self.retained}")
        if self.full_every < 1:
            raise ValueError(f"full_every must be at least 1, got {self.full_every}")

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None


@dataclass(eq=False)
class CheckpointReport:
    """One checkpoint of a job: ``id`` is its barrier id (it grows within a job, across
    checkpoints and reconfigurations); ``version`` the abstraction version the job ran
    when it was taken; ``path`` where its manifest is in the store; ``bytes`` what its
    tasks wrote for it (incremental: only what changed), ``full_bytes`` what a restore
    from it reads (every key group's chain); ``tasks`` how many tasks took part;
    ``kind`` whether the timer took it or a request (a savepoint)."""

    id: int
    job_id: str
    version: int | None
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    status: CheckpointStatus = CheckpointStatus.IN_PROGRESS
    error: str | None = None
    path: str | None = None
    bytes: int = 0
    full_bytes: int = 0
    tasks: int = 0
    started_at: float = field(default_factory=time.time)
    duration_ms: float | None = None

    def reported(self) -> dict[str, Any]:
        """What the control plane records of it, by the names of its ``checkpoints`` row
        and REST schema."""
        return {
            "checkpoint_id": self.id,
            "kind": self.kind,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "path": self.path,
            "bytes": self.bytes,
            "full_bytes": self.full_bytes,
            "tasks": self.tasks,
            "started_at": self.started_at,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``max_failures`` recoveries within ``window_s`` seconds (Flink's
    failure-rate strategy), each ``delay_s`` after its failure."""

    max_failures: int = 3
    window_s: float = 60.0
    delay_s: float = 0.0


@dataclass
class Failures:
    """A job's failures (:mod:`.recovery`): ``causes`` every failure, oldest first, with
    its time (monotonic); ``running`` the recovery under way, if any; ``heard`` the
    failure it began with, then those heard since, each with whether it is the loss of a
    worker (:meth:`reason`)."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    causes: list[tuple[float, str]] = field(default_factory=list)
    running: asyncio.Task[None] | None = None
    heard: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, now: float, cause: str, *, lost: bool = False) -> None:
        """A failure the restart policy counts, which begins a recovery (or fails the
        job); ``lost``: it is the loss of a worker."""
        self.causes.append((now, cause))
        self.heard = [(cause, lost)]

    def hear(self, cause: str, *, lost: bool = False) -> None:
        """A failure heard while a recovery is under way, of the tasks it stops: not
        counted, but told in its :meth:`reason`."""
        self.heard.append((cause, lost))

    def reason(self) -> str:
        """Why the recovery under way recovers: the failure it began with, unless the loss
        of a worker was heard since (a worker that dies is often first heard of through a
        survivor's broken data link to it). Then that loss comes first, and everything
        else heard after "also heard", each once."""
        losses = list(dict.fromkeys(c for c, lost in self.heard if lost))
        if not losses:
            return self.heard[0][0]
        rest = list(dict.fromkeys(c for c, lost in self.heard if not lost))
        reason = "; ".join(losses)
        return f"{reason}; also heard: {'; '.join(rest)}" if rest else reason

    def allows(self, now: float) -> bool:
        """Whether the failures within the window leave room for one more recovery."""
        recent = [t for t, _c in self.causes if now - t <= self.policy.window_s]
        return len(recent) <= self.policy.max_failures

    def listed(self) -> str:
        return "; ".join(f"[{i}] {c}" for i, (_t, c) in enumerate(self.causes, 1))
