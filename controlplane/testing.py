"""Helpers for tests and benchmarks: a local cluster running on a background event loop.

:class:`BackgroundCluster` starts a coordinator and worker processes (local ones, or Spark
tasks with ``backend="spark"``) on an asyncio loop in a daemon thread, so synchronous tests can share one cluster across many tests and
submit jobs with :meth:`BackgroundCluster.run` (every wait is bounded by a timeout).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from runtime.dataflow import JobGraph

from .coordinator import RunningJob, RuntimeConfig
from .runner import LocalCluster

__all__ = ["BackgroundCluster"]

T = TypeVar("T")

CALL_TIMEOUT_S = 120.0  # no call into the cluster's loop waits longer than this


class BackgroundCluster:
    def __init__(
        self,
        workers: int = 2,
        config: RuntimeConfig | None = None,
        backend: Literal["local", "spark"] = "local",
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="cluster-loop", daemon=True
        )
        self._thread.start()
        self.cluster = LocalCluster(workers, config, backend=backend)
        try:
            self.call(self.cluster.__aenter__())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def coordinator(self):
        return self.cluster.coordinator

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run ``coro`` on the cluster's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, graph: JobGraph, job_id: str | None = None) -> RunningJob:
        return self.call(self.coordinator.submit(graph, job_id=job_id))

    def run(self, graph: JobGraph, timeout: float = 60.0) -> RunningJob:
        """Submit ``graph`` and wait until it ends; stops it (and raises) after ``timeout``."""
        job = self.submit(graph)
        self.wait(job, timeout)
        return job

    def wait(self, job: RunningJob, timeout: float = 60.0) -> str:
        async def wait() -> str:
            try:
                return await job.wait(timeout)
            except TimeoutError:
                await self.coordinator.stop_job(job.id)
                raise TimeoutError(
                    f"job {job.id} still {job.status} after {timeout:.0f}s"
                ) from None

        return self.call(wait(), timeout + 10)

    def close(self) -> None:
        try:
            self.call(self.cluster.close(), 30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
