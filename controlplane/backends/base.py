"""The interface every worker backend implements (see ``tests/test_backends.py``), and
what a backend may ask of the coordinator its workers register with
(:class:`WorkerRegistry`: the backends never import the coordinator)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Protocol

__all__ = ["BackendError", "RegisteredWorker", "WorkerBackend", "WorkerRegistry"]


class BackendError(RuntimeError):
    """A backend could not start or stop workers; the message says why."""


class WorkerBackend(ABC):
    """Starts workers that register with the coordinator at ``coordinator`` (host, port)."""

    name: str = "abstract"

    @abstractmethod
    async def start_workers(self, n: int) -> list[int]:
        """Start ``n`` workers; returns their process ids. They register by themselves
        (a backend may wait for that: the spark backend learns the ids from registrations).
        Raises :class:`BackendError` when a worker cannot be started."""

    @abstractmethod
    async def stop_worker(self, pid: int) -> None:
        """Stop one worker (it is asked to exit, then forced)."""

    @abstractmethod
    def owns(self, pid: int) -> bool:
        """Whether the worker with process id ``pid`` was started by this backend and is
        not stopped yet (only those can be stopped with :meth:`stop_worker`)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop every worker this backend started; none may outlive this call."""


class RegisteredWorker(Protocol):
    """A worker as the coordinator knows it once it registered."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def status(self) -> str:
        """``alive`` while connected, then ``lost`` or ``stopped``."""
        ...


class WorkerRegistry(Protocol):
    """What a backend needs of the coordinator (a started
    :class:`controlplane.coordinator.Coordinator`) that its workers register with."""

    @property
    def address(self) -> tuple[str, int]:
        """Where workers dial the coordinator (host, port)."""
        ...

    @property
    def workers(self) -> Mapping[str, RegisteredWorker]:
        """Every worker that registered, by id (lost and stopped ones included)."""
        ...

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """What hosts the worker failed: the coordinator declares it lost with ``reason``."""
        ...

    def shutdown_worker(self, worker_id: str) -> bool:
        """Ask the worker to exit; False when it is not connected."""
        ...
