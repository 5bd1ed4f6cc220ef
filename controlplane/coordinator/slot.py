"""One reconfiguration of a job at a time, and how a plan under way is cancelled.

:class:`ChangeSlot` (``RunningJob.slot``) is the one owner, while the process runs, of the
rule that a job changes by one plan at a time: the engine reserves it for a plan it has
accepted (:meth:`ChangeSlot.reserve`) until the plan's outcome is recorded, and every
change (a plan, a layout, a restart) holds it while it runs (:meth:`ChangeSlot.hold`, which
also keeps the job's checkpoints out of its way); whoever asks whether a
job is busy asks :attr:`ChangeSlot.busy`. A plan's :class:`Cancellation` is created with
its reservation (or when it takes the lock) and is what :func:`.plans.cancel` requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import ReconfigurationBusy

if TYPE_CHECKING:
    from .report import RunReport

__all__ = ["Cancellation", "ChangeSlot"]


@dataclass
class Cancellation:
    """What the runs of one plan share to learn that it was cancelled: the reason once
    it was (see :func:`.plans.cancel`), the plan's report once it has one, and how the
    plan is carried out (``fluid``: in steps; ``restart``: by the baseline)."""

    fluid: bool = False
    restart: bool = False
    reason: str | None = None
    record: RunReport | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason


class Quiescer(Protocol):
    """What a change waits for before it runs, and tells when it ends (the job's
    checkpoints: :class:`.checkpointer.Checkpointer`)."""

    async def quiesce(self) -> None: ...
    def resume(self) -> None: ...


class ChangeSlot:
    """A job's turn to change (module docstring)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.lock = asyncio.Lock()  # held by the change under way; others wait in order
        self.quiescer: Quiescer | None = None  # set while the job takes checkpoints
        self.reserved: Cancellation | None = None  # a plan accepted and not recorded yet
        self.current: Cancellation | None = None  # the plan that holds the lock

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the job for a change: take the lock (in turn), then wait until no
        checkpoint capture is under way; no checkpoint starts until the change ends (a
        checkpoint and a change never interleave)."""
        async with self.lock:
            quiescer = self.quiescer
            if quiescer is not None:
                await quiescer.quiesce()
            try:
                yield
            finally:
                if quiescer is not None:
                    quiescer.resume()

    @property
    def busy(self) -> bool:
        """Whether a change holds the job or is reserved to."""
        return self.lock.locked() or self.reserved is not None

    @property
    def plan(self) -> Cancellation | None:
        """The cancellation of the plan under way or reserved, if any."""
        return self.current or self.reserved

    def refuse_if_busy(self, wait: bool) -> None:
        """Raise :class:`ReconfigurationBusy` if the job is changing and the caller won't wait."""
        if not wait and self.lock.locked():
            raise ReconfigurationBusy(
                f"job {self.job_id} is being reconfigured; try again when it is done"
            )

    def reserve(self) -> Cancellation:
        """Reserve the job for a plan to come; its cancellation. :class:`ReconfigurationBusy`
        when the job is busy."""
        if self.busy:
            raise ReconfigurationBusy(
                f"job {self.job_id} is being reconfigured; try again when it is done"
            )
        self.reserved = Cancellation()
        return self.reserved

    def release(self, token: Cancellation) -> None:
        """End the reservation ``token`` (a no-op for any other)."""
        if self.reserved is token:
            self.reserved = None
