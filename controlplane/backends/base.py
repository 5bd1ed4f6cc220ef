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
        """Start ``n`` workers; returns their process ids. They register by themselves."""

    @abstractmethod
    async def stop_worker(self, pid: int) -> None:
        """Stop one worker (it is asked to exit, then forced)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop every worker this backend started; none may outlive this call."""
