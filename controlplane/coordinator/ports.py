"""What the layers above cluster membership need of the coordinator, as typed Protocols.

The live reconfiguration (:mod:`.reconfig`), the stop-and-restart baseline
(:mod:`.restart`), plans (:mod:`.plans`, :mod:`.layouts`, :mod:`.fluid`) and workers
started on demand (:mod:`.workers`) take a :class:`Membership` or a :class:`JobHost`, not
the :class:`~.core.Coordinator`: they never import it, and the coordinator (which
satisfies both) imports them. The same way :class:`runtime.task.TaskHost` is what a task
needs of its worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from controlplane.abstraction import Resolver
    from controlplane.backends import WorkerBackend
    from runtime.layout import Layout
    from runtime.messages import ChannelConfig, Restore, ToWorker

    from .model import RunningJob, RuntimeConfig, WorkerInfo

__all__ = ["JobHost", "Membership"]


class Membership(Protocol):
    """The workers of the cluster: who is registered, sending to them, starting and
    retiring them (:class:`.cluster.Cluster`)."""

    workers: dict[str, WorkerInfo]  # every worker that registered, by id
    backend: WorkerBackend | None  # what starts workers a plan asks for, if anything does

    def alive_workers(self) -> list[WorkerInfo]: ...

    def connected(self, worker_id: str) -> bool:
        """Whether worker ``worker_id``'s control connection is up."""
        ...

    def send(self, worker_id: str, msg: ToWorker) -> None:
        """Send ``msg`` to worker ``worker_id``; nothing if it is not connected."""
        ...

    def next_barrier_id(self) -> int:
        """A barrier id never handed out before (barriers of every job share them)."""
        ...

    def data_addresses(self) -> dict[str, tuple[str, int]]:
        """Every alive worker's data address, as workers are told it."""
        ...

    def shutdown_worker(self, worker_id: str) -> bool:
        """Ask one worker to exit; False when it is not connected."""
        ...

    async def retire_worker(self, worker_id: str, reason: str) -> None:
        """Stop a worker no job needs any more (``stopped`` with ``reason``, not lost)."""
        ...

    async def until_registered(self, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds, checked now and after every registration."""
        ...


class JobHost(Membership, Protocol):
    """The coordinator's jobs and what changes them: deploy, start, fail, stop."""

    config: RuntimeConfig
    jobs: dict[str, RunningJob]
    resolve_logic: Resolver  # what a logic ref in a plan may name

    def channel_config(self) -> ChannelConfig:
        """How the workers' channels batch and buffer, as they are told it."""
        ...

    async def deploy(
        self, job: RunningJob, layout: Layout, restore: dict[str, Restore] | None = None
    ) -> str | None:
        """Deploy ``layout`` of ``job`` on its workers (``restore``: tasks' state to seed
        them with); returns an error, or None once every worker deployed."""
        ...

    def start_deployed(self, job: RunningJob) -> None:
        """Tell the workers of ``job``'s layout to start it (``job.started_at`` is the clock
        origin)."""
        ...

    async def fail(self, job: RunningJob, error: str) -> None:
        """End ``job`` as failed with ``error`` (if it has not ended) and stop it everywhere."""
        ...

    def stop_everywhere(self, job: RunningJob) -> None:
        """Tell every connected worker to stop ``job``."""
        ...
