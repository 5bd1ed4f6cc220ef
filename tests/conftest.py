"""Shared fixtures: one local cluster per test session, and a check that no process leaks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from controlplane.testing import BackgroundCluster


@pytest.fixture(scope="session")
def shared_local_cluster() -> Iterator[BackgroundCluster]:
    """A coordinator and 2 local worker processes for the whole session (see ``cluster``)."""
    c = BackgroundCluster(workers=2)
    try:
        yield c
    finally:
        c.close()


def stop_leftover_jobs(c: BackgroundCluster) -> None:
    """Stop the jobs a test left running on a shared cluster (a failing test leaves its
    held or unbounded jobs behind), so that the next test gets idle workers."""
    for job in list(c.coordinator.jobs.values()):
        if not job.done:
            c.call(c.coordinator.stop_job(job.id))


@pytest.fixture
def cluster(shared_local_cluster: BackgroundCluster) -> Iterator[BackgroundCluster]:
    """The session's local cluster, shared by the tests that only run jobs; what a test
    leaves running is stopped after it."""
    yield shared_local_cluster
    stop_leftover_jobs(shared_local_cluster)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail the test if it leaves any process of its own behind (waits up to 5 s)."""
    before = _children()
    yield
    deadline = time.monotonic() + 5
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {sorted(left)}"


@pytest.fixture
def held_end(tmp_path: Path) -> Iterator[Path]:
    """A file that holds back the end of the jobs a test submits through
    ``e2e_jobs.held_until_released`` while it exists: they run until the test removes it.
    Removed after the test too, so that a job a failing test left running ends."""
    path = tmp_path / "held-end"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real StreamManager (uvicorn on 127.0.0.1, 2 local workers) per database backend,
    shared by the API tests; see ``api_support.running_server``."""
    from api_support import running_server

    with running_server(request.param, str(tmp_path_factory.mktemp("api"))) as server:
        yield server


SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",  # nothing listens beyond what the tests need
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
}


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """The test session's one SparkSession (``local[2]``: two task slots). A first job starts
    PySpark's daemon, so the JVM and the daemon exist before any test counts processes."""
    from controlplane.backends.spark import spark_session

    session = spark_session("local[2]", SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    session.sparkContext.parallelize([0], 1).map(lambda x: x).collect()
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def spark_cluster(spark) -> Iterator[BackgroundCluster]:
    """A coordinator and 2 workers running as Spark tasks. Per module, not per session: the
    workers hold both of ``local[2]``'s task slots, which other tests' Spark jobs need."""
    c = BackgroundCluster(workers=2, backend="spark")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def spark_cluster_idle(spark_cluster: BackgroundCluster) -> Iterator[BackgroundCluster]:
    """``spark_cluster``, with what a test leaves running stopped after it."""
    yield spark_cluster
    stop_leftover_jobs(spark_cluster)


@pytest.fixture(params=["local", "spark"])
def any_cluster(request: pytest.FixtureRequest) -> BackgroundCluster:
    """The shared cluster of each worker backend in turn (see ``cluster``, ``spark_cluster``)."""
    return request.getfixturevalue("cluster" if request.param == "local" else "spark_cluster_idle")


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real Spark standalone cluster on 127.0.0.1 (a master and two workers, small
    memory), started once for the session and stopped at its end; a test that kills a
    Spark worker starts it again with ``revive()``. See ``spark_cluster.standalone``."""
    from spark_cluster import standalone

    with standalone(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    """A fault-injection module's own local cluster of 3 workers (its tests kill them),
    its checkpoint store in a temporary directory (``faults_support.fault_cluster``)."""
    from tests.faults_support import fault_cluster

    yield from fault_cluster(tmp_path_factory)


@pytest.fixture
def fault_events(faults: BackgroundCluster) -> Iterator:
    """``faults`` with 3 alive workers and no job, its checkpoints and recoveries told to
    the test (``faults_support.listened``); what the test left running is stopped after."""
    from tests.faults_support import listened

    yield from listened(faults)
