"""Run one job end to end on local (or Spark) workers: coordinator, backend, deploy, wait, summary.

Used by ``streampilot run``, ``streampilot demo``, the benchmarks and the tests. Every
process it starts is stopped before it returns, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from runtime.dataflow import JobGraph
from runtime.handshake import TlsFiles

from .backends import LocalBackend, WorkerBackend
from .coordinator import Coordinator, RunningJob, RuntimeConfig

__all__ = ["LocalCluster", "RunResult", "run_local"]

WORKERS_REGISTER_TIMEOUT_S = 30.0  # local workers import numpy/msgpack and dial back within this
SPARK_MASTER = "local[2]"  # used when no SparkSession runs in this process yet


@dataclass
class RunResult:
    status: str
    error: str | None
    summary: dict[str, Any]
    job: RunningJob


class LocalCluster:
    """A coordinator and ``workers`` worker processes, as an async context manager.

    ``backend`` ``"spark"`` starts them as Spark tasks of this process's SparkSession (the
    running one, else a new one on :data:`SPARK_MASTER`), which the cluster does not stop.
    ``worker_reserve_mb``: each worker's memory reserve (see :mod:`runtime.heap`). With
    ``tls``, the coordinator and every worker's data server speak TLS (mutual with a CA)."""

    def __init__(
        self,
        workers: int = 2,
        config: RuntimeConfig | None = None,
        log_level: str = "WARNING",
        backend: Literal["local", "spark"] = "local",
        worker_reserve_mb: int = 0,
        tls: TlsFiles | None = None,
        **coordinator_options: Any,
    ) -> None:
        self.n = workers
        self.secret = secrets.token_hex(16)
        self.coordinator = Coordinator(
            self.secret,
            config=config,
            tls=tls.server() if tls is not None else None,
            **coordinator_options,
        )
        self.worker_args = tls.worker_args() if tls is not None else []
        self.backend: WorkerBackend | None = None
        self.backend_name = backend
        self.log_level = log_level
        self.reserve_mb = worker_reserve_mb

    async def __aenter__(self) -> LocalCluster:
        address = await self.coordinator.start()
        if self.backend_name == "spark":
            from .backends.spark import SparkBackend, spark_session

            session = await asyncio.to_thread(spark_session, SPARK_MASTER)
            self.backend = SparkBackend(
                self.coordinator,
                self.secret,
                session,
                log_level=self.log_level,
                reserve_mb=self.reserve_mb,
                extra_args=self.worker_args,
            )
        else:
            self.backend = LocalBackend(
                address,
                self.secret,
                log_level=self.log_level,
                reserve_mb=self.reserve_mb,
                extra_args=self.worker_args,
            )
        self.coordinator.backend = self.backend
        try:
            await self.backend.start_workers(self.n)
            await self.coordinator.wait_for_workers(self.n, WORKERS_REGISTER_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.coordinator.close()
        if self.backend is not None:
            await self.backend.close()


async def run_local(
    graph: JobGraph,
    *,
    workers: int = 2,
    config: RuntimeConfig | None = None,
    timeout: float | None = None,
    on_tick: Callable[[RunningJob], Awaitable[None] | None] | None = None,
    tick_s: float = 1.0,
    backend: Literal["local", "spark"] = "local",
) -> RunResult:
    """Run ``graph`` on ``workers`` workers of ``backend`` until it ends (or ``timeout``,
    then stop)."""
    async with LocalCluster(workers, config, backend=backend) as cluster:
        job = await cluster.coordinator.submit(graph)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not job.done:
            wait = tick_s if deadline is None else min(tick_s, max(deadline - time.monotonic(), 0))
            with contextlib.suppress(TimeoutError):
                await job.wait(wait)
            if on_tick is not None and not job.done:
                r = on_tick(job)
                if asyncio.iscoroutine(r):
                    await r
            if deadline is not None and time.monotonic() >= deadline and not job.done:
                await cluster.coordinator.stop_job(job.id)
        # Give the workers a moment to send their last metrics before they are stopped.
        await asyncio.sleep(0)
        return RunResult(job.status, job.error, job.summary(), job)
