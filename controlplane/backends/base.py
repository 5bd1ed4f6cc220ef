"""The interface every worker backend implements (see ``tests/test_backends.py``)."""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["BackendError", "WorkerBackend"]


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
