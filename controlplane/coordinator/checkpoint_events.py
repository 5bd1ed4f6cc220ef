"""What the checkpoint machine (:mod:`.checkpoint_protocol`) takes and answers with: the
events of a job's checkpoints (a timer that fired, a task's capture or ack, a
reconfiguration that wants the job, ...) and the commands for its driver
(:class:`.checkpointer.Checkpointer`) to carry out in order. Plain frozen data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checkpoint_report import CheckpointReport

__all__ = [
    "Abandon",
    "Abandoned",
    "Acked",
    "AllowChange",
    "Captured",
    "ChangeEnded",
    "ChangeWanted",
    "Command",
    "DeleteFiles",
    "Discarded",
    "Event",
    "Inject",
    "JobEnded",
    "ManifestWritten",
    "Report",
    "SavepointRefused",
    "SavepointWanted",
    "Suspended",
    "TaskError",
    "TaskFinished",
    "Tick",
    "TimedOut",
    "Unpinned",
    "WakeAt",
    "WriteManifest",
]


# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """The driver's timer fired: a checkpoint may start with ``barrier_id``, over the
    job's ``tasks`` (those that run now), at abstraction ``version``."""

    barrier_id: int
    tasks: frozenset[str]
    version: int | None


@dataclass(frozen=True)
class Captured:
    """``task`` captured its state for checkpoint ``checkpoint_id`` (aligned its barrier)."""

    task: str
    checkpoint_id: int


@dataclass(frozen=True)
class Acked:
    """``task``'s part of checkpoint ``checkpoint_id`` is durable: ``part`` is what the
    manifest holds for it (``groups``: key group -> chain of [path, offset, length, full,
    keys]; ``position``; ``sink``), ``written`` the bytes it wrote now, ``size`` the bytes
    its whole state comes to (every chain)."""

    task: str
    checkpoint_id: int
    part: dict[str, Any]
    written: int
    size: int


@dataclass(frozen=True)
class TaskError:
    """``task`` could not take its part of checkpoint ``checkpoint_id``."""

    task: str
    checkpoint_id: int
    error: str


@dataclass(frozen=True)
class TaskFinished:
    """``task`` finished (its inputs ended): it takes no part in checkpoints any more."""

    task: str


@dataclass(frozen=True)
class TimedOut:
    """The timeout of checkpoint ``checkpoint_id`` passed."""

    checkpoint_id: int


@dataclass(frozen=True)
class ManifestWritten:
    """The driver wrote checkpoint ``checkpoint_id``'s manifest at ``path`` (``error``:
    it could not)."""

    checkpoint_id: int
    path: str | None
    error: str | None = None


@dataclass(frozen=True)
class ChangeWanted:
    """A reconfiguration wants the job; it waits for :class:`AllowChange`."""


@dataclass(frozen=True)
class ChangeEnded:
    """The reconfiguration that held the job ended (however it did)."""


@dataclass(frozen=True)
class Suspended:
    """The job is recovering: the checkpoint in flight is abandoned with ``reason`` and
    none starts until :class:`ChangeEnded`."""

    reason: str


@dataclass(frozen=True)
class JobEnded:
    """The job ended: a checkpoint in flight is abandoned, none starts again."""

    reason: str


@dataclass(frozen=True)
class SavepointWanted:
    """A savepoint is asked: the next checkpoint that can start is one (step 5)."""


@dataclass(frozen=True)
class Unpinned:
    """Savepoint ``checkpoint_id`` was deleted: retention may let its files go."""

    checkpoint_id: int


Event = (
    Tick
    | Captured
    | Acked
    | TaskError
    | TaskFinished
    | TimedOut
    | ManifestWritten
    | ChangeWanted
    | ChangeEnded
    | Suspended
    | JobEnded
    | SavepointWanted
    | Unpinned
)

# -- commands ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Inject:
    """Inject checkpoint barrier ``checkpoint_id`` at the job's sources."""

    checkpoint_id: int


@dataclass(frozen=True)
class WakeAt:
    """Send the next :class:`Tick` at (or after) time ``at``; and :class:`TimedOut` for
    ``timeout_of`` at ``timeout_at`` if set (a later ``WakeAt`` replaces both)."""

    at: float | None
    timeout_of: int | None = None
    timeout_at: float | None = None


@dataclass(frozen=True)
class WriteManifest:
    """Write the manifest of checkpoint ``checkpoint_id``: ``manifest`` (JSON-able)."""

    checkpoint_id: int
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Abandon:
    """Tell the workers checkpoint ``checkpoint_id`` is abandoned (they drop its barrier)."""

    checkpoint_id: int


@dataclass(frozen=True)
class DeleteFiles:
    """Remove these checkpoints' directories from the store (no retained checkpoint
    refers to them)."""

    checkpoint_ids: tuple[int, ...]


@dataclass(frozen=True)
class Report:
    """Tell the listener: ``report`` changed (a copy of its state at this point)."""

    report: CheckpointReport


@dataclass(frozen=True)
class Discarded:
    """Retention let completed checkpoint ``checkpoint_id`` go (its record says so; its
    files go with a :class:`DeleteFiles` once nothing refers to them)."""

    checkpoint_id: int


@dataclass(frozen=True)
class AllowChange:
    """The waiting reconfiguration may go ahead."""


@dataclass(frozen=True)
class Abandoned:
    """Checkpoint ``checkpoint_id`` ended abandoned (for the driver's waiters)."""

    checkpoint_id: int


@dataclass(frozen=True)
class SavepointRefused:
    """The savepoint asked cannot be taken: ``reason`` says why."""

    reason: str


Command = (
    Inject
    | WakeAt
    | WriteManifest
    | Abandon
    | DeleteFiles
    | Report
    | Discarded
    | AllowChange
    | Abandoned
    | SavepointRefused
)
