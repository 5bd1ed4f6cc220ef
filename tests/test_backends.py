"""The worker backends' contract, run against each sibling (``local``, ``spark``), plus what
only Spark can do wrong (an unreachable master, a lost task, no free core)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
import pytest

from controlplane.backends import BackendError, LocalBackend, WorkerBackend, make_backend
from controlplane.config import Settings
from controlplane.coordinator import Coordinator
from runtime.dataflow import load_job

pytestmark = pytest.mark.slow

SECRET = "backend-contract"
STEP_TIMEOUT_S = 60.0  # no step of a scenario takes longer than this


@pytest.fixture(params=["local", "spark"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "spark":
        request.getfixturevalue("spark")
    return request.param


def make(kind: str, coordinator: Coordinator, **options: Any) -> WorkerBackend:
    if kind == "local":
        return LocalBackend(coordinator.address, SECRET, **options)
    from controlplane.backends.spark import SparkBackend, spark_session

    return SparkBackend(coordinator, SECRET, spark_session("local[2]"), **options)


def scenario(
    kind: str, body: Callable[[Coordinator, WorkerBackend], Awaitable[None]], **options: Any
) -> None:
    """Run ``body`` with a started coordinator and a backend of ``kind``; both are closed
    afterwards, whatever happens."""

    async def main() -> None:
        coordinator = Coordinator(SECRET)
        await coordinator.start()
        backend = make(kind, coordinator, **options)
        coordinator.backend = backend
        try:
            await asyncio.wait_for(body(coordinator, backend), STEP_TIMEOUT_S)
        finally:
            await coordinator.close()
            await asyncio.wait_for(backend.close(), STEP_TIMEOUT_S)

    asyncio.run(main())


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until ``check()``; fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:g}s")
        await asyncio.sleep(0.05)


def test_started_workers_register_and_stop(kind: str, no_leftover_processes: None) -> None:
    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        pids = await backend.start_workers(2)
        assert len(pids) == 2
        await co.wait_for_workers(2, 30)
        assert sorted(w.pid for w in co.alive_workers()) == sorted(pids)
        assert all(backend.owns(pid) for pid in pids)
        if kind == "spark":  # placement facts: where Spark ran each worker
            assert {w.executor_id for w in co.alive_workers()} == {"driver"}
            assert all(w.name.startswith("spark-") for w in co.alive_workers())
        await backend.stop_worker(pids[0])
        assert not backend.owns(pids[0])
        await until(lambda: len(co.alive_workers()) == 1, 10, "the stopped worker gone")
        assert [w.pid for w in co.alive_workers()] == [pids[1]]
        with pytest.raises(BackendError):
            await backend.stop_worker(pids[0])
        await backend.close()
        await until(lambda: not co.alive_workers(), 10, "every worker gone after close")

    scenario(kind, body)


def test_a_worker_that_cannot_start_is_a_backend_error(
    kind: str, no_leftover_processes: None
) -> None:
    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        with pytest.raises(BackendError, match="/nonexistent/python"):
            await backend.start_workers(1)
        assert not co.alive_workers()

    scenario(kind, body, python="/nonexistent/python")


def test_stopping_an_unknown_worker_is_a_backend_error(kind: str) -> None:
    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        assert not backend.owns(os.getpid())
        with pytest.raises(BackendError, match=r"no \w+ worker with pid"):
            await backend.stop_worker(os.getpid())
        with pytest.raises(BackendError):
            await backend.start_workers(-1)

    scenario(kind, body)


def test_a_plan_asking_for_a_new_worker_gets_one_from_the_backend(
    kind: str, tmp_path, held_end, no_leftover_processes: None
) -> None:
    """The plan is applied while the word count's records flow at their pace, its end
    held back (``held_end``) until then; the rest comes unpaced."""
    from controlplane.abstraction import NEW_WORKER, scale
    from examples import wordcount
    from tests.e2e_jobs import held_until_released

    params = {"records": 150_000, "rate": 20_000, "output": str(tmp_path)}

    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        await backend.start_workers(1)
        await co.wait_for_workers(1, 30)
        graph = load_job("examples.wordcount:build", params)
        job = await co.submit(held_until_released(graph, held_end, hurry=True))
        assert job.status == "running", job.error
        rec = await co.apply_plan(job.id, scale(job.abstraction, "count", 3, workers=[NEW_WORKER]))
        held_end.unlink()
        assert rec.status == "completed", rec.error
        workers = {w.id: w for w in job.abstraction.workers}
        assert len(workers) == 2 and {w.backend for w in workers.values()} == {kind}
        assert len(set(job.layout.placement.values())) == 2
        if kind == "spark":
            assert {w.executor_id for w in workers.values()} == {"driver"}
        assert await job.wait(60) == "finished", job.error

    scenario(kind, body)
    assert wordcount.read_results(str(tmp_path)) == wordcount.reference(params)


def test_settings_choose_the_backend() -> None:
    async def main() -> None:
        co = Coordinator(SECRET)
        await co.start()
        try:
            backend = await make_backend(Settings(backend="local"), co, SECRET)
            assert isinstance(backend, LocalBackend)
        finally:
            await co.close()

    asyncio.run(main())


def test_the_precopy_threshold_setting_reaches_the_coordinator() -> None:
    from controlplane.engine import Engine

    never = Engine(Settings(precopy_min_bytes="none")).coordinator.config
    assert never.precopy_min_bytes is None
    assert Engine(Settings(precopy_min_bytes=123)).coordinator.config.precopy_min_bytes == 123
    assert Engine(Settings()).coordinator.config.precopy_min_bytes == 32 << 20


# -- spark only -------------------------------------------------------------------------------


def test_unreachable_master_is_a_clear_error_not_a_hang(spark) -> None:
    async def main() -> None:
        co = Coordinator(SECRET)
        await co.start()
        try:
            settings = Settings(backend="spark", spark_master="spark://127.0.0.1:1")
            with pytest.raises(BackendError, match=r"spark://127\.0\.0\.1:1 cannot be reached"):
                await asyncio.wait_for(make_backend(settings, co, SECRET), STEP_TIMEOUT_S)
        finally:
            await co.close()

    asyncio.run(main())


def test_server_with_an_unreachable_spark_master_exits_with_the_reason(tmp_path) -> None:
    import subprocess
    import sys

    command = [
        *(sys.executable, "-m", "controlplane.cli", "server", "--backend", "spark"),
        *("--spark-master", "spark://127.0.0.1:1", "--port", "0"),
        *("--db", f"sqlite:///{tmp_path}/sp.db"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "the Spark master spark://127.0.0.1:1 cannot be reached" in done.stderr


def test_lost_spark_task_is_reported_with_the_spark_reason(
    spark, tmp_path, no_leftover_processes: None
) -> None:
    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        [pid] = await backend.start_workers(1)
        info = co.alive_workers()[0]
        job = await co.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 1_000}))
        assert job.status == "running", job.error
        # The executor side of the worker goes: Spark's Python worker running its task.
        psutil.Process(pid).parent().send_signal(signal.SIGKILL)
        await until(
            lambda: info.status == "lost" and "Spark task ended" in (info.error or ""),
            STEP_TIMEOUT_S,
            "the worker reported lost with Spark's reason",
        )
        assert job.status == "failed"
        assert f"worker {info.id}" in job.error and "Spark task ended" in job.error, job.error
        assert not backend.owns(pid)

    scenario("spark", body)


def test_a_worker_that_cannot_dial_back_fails_its_start_with_the_cause(
    spark, no_leftover_processes: None
) -> None:
    async def main() -> None:
        from controlplane.backends.spark import SparkBackend, spark_session

        co = Coordinator(SECRET)  # never started: nothing listens where workers dial
        co.port = _free_port()
        backend = SparkBackend(co, SECRET, spark_session("local[2]"))
        try:
            with pytest.raises(BackendError, match="cannot reach the coordinator"):
                await asyncio.wait_for(backend.start_workers(1), STEP_TIMEOUT_S)
        finally:
            await backend.close()

    asyncio.run(main())


def test_a_coordinator_on_every_interface_is_dialled_at_the_driver_host(
    spark, no_leftover_processes: None
) -> None:
    async def main() -> None:
        from controlplane.backends.spark import SparkBackend, spark_session

        co = Coordinator(SECRET, host="0.0.0.0")
        await co.start()
        backend = SparkBackend(co, SECRET, spark_session("local[2]"))
        try:
            await asyncio.wait_for(backend.start_workers(1), STEP_TIMEOUT_S)
            [info] = co.alive_workers()
            assert info.host == "127.0.0.1"  # spark.driver.host, on the route to it
        finally:
            await co.close()
            await backend.close()

    asyncio.run(main())


def test_no_free_core_is_an_error_within_the_register_timeout(
    spark, no_leftover_processes: None
) -> None:
    async def body(co: Coordinator, backend: WorkerBackend) -> None:
        with pytest.raises(BackendError, match="did not register within 6s"):
            await asyncio.wait_for(backend.start_workers(3), STEP_TIMEOUT_S)  # 2 task slots
        assert not backend.handles  # all three jobs were cancelled

    scenario("spark", body, register_timeout_s=6)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
