"""Recovery on a real Spark standalone cluster (``spark_cluster``: a master and two
Spark workers on loopback): the StreamManager's spark backend runs its workers as tasks
of executors there; the JVM of the Spark worker hosting one of a checkpointed job's
workers is SIGKILLed with its executor, and the job recovers on the executor that is
left, its output exact."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_cluster import SparkServer, Standalone

from examples.wordcount import reference
from runtime.sinks import read_parts
from tests.api_support import wait_until
from tests.faults_support import WAIT_S, kill

pytestmark = pytest.mark.slow

PARAMS = {"records": 20_000, "rate": 4_000, "output": "out"}


@pytest.fixture
def server(spark_standalone: Standalone, tmp_path: Path) -> Iterator[SparkServer]:
    """A StreamManager with 2 workers on the standalone cluster; the cluster's killed
    Spark worker is started again after the test."""
    s = SparkServer(spark_standalone, tmp_path)
    try:
        yield s
    finally:
        s.close()
        spark_standalone.revive()


@pytest.mark.timeout(600)
def test_a_spark_worker_jvm_killed_under_a_checkpointed_job_recovers_on_the_other_executor(
    spark_standalone: Standalone, server: SparkServer, held_end: Path
) -> None:
    http = server.http
    workers = {w["id"]: w for w in http.get("/api/v1/workers").json()}
    assert all(w["status"] == "alive" and w["executor_id"] for w in workers.values()), workers
    body = {
        "name": "spark-recovered",
        "job": "tests.e2e_jobs:held_wordcount",
        "params": {**PARAMS, "held": str(held_end)},
        "checkpoints": {"interval_s": 0.3},
    }
    r = http.post("/api/v1/jobs", json=body)
    assert r.status_code == 201 and r.json()["status"] == "running", r.text
    job = r.json()["id"]

    def two_completed() -> bool:
        page = http.get(f"/api/v1/jobs/{job}/checkpoints", params={"status": "completed"})
        return page.json()["total"] >= 2

    wait_until(two_completed, WAIT_S, "2 completed checkpoints", 0.2)
    abstraction = http.get(f"/api/v1/jobs/{job}/abstraction").json()
    count = next(op for op in abstraction["operators"] if op["name"] == "count")
    victim = workers[count["tasks"][-1]["resources"]["worker"]]
    jvm = spark_standalone.worker_hosting(victim["pid"])
    executors = spark_standalone.executors_of(jvm)
    assert len(executors) == 1, executors
    dead_executor = victim["executor_id"]
    kill(jvm.pid, signal.SIGKILL)
    kill(executors[0].pid, signal.SIGKILL)
    lost = [w for w in workers.values() if w["executor_id"] == dead_executor]

    def recovered() -> dict | None:
        recs = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["items"]
        done = [r for r in recs if r["origin"] == "recovery" and r["status"] == "completed"]
        state = http.get(f"/api/v1/jobs/{job}").json()
        assert state["status"] not in ("failed", "finished", "stopped"), state
        return done[-1] if done and state["status"] == "running" else None

    recovery = wait_until(recovered, WAIT_S, "the job recovered", 0.2)
    assert victim["id"] in recovery["recovery"]["lost_workers"], recovery["recovery"]
    now = {w["id"]: w for w in http.get("/api/v1/workers").json()}
    assert all(now[w["id"]]["status"] == "lost" for w in lost), now
    version = http.get(f"/api/v1/jobs/{job}/abstraction").json()
    used = {t["resources"]["worker"] for op in version["operators"] for t in op["tasks"]}
    assert dead_executor not in {now[w]["executor_id"] for w in used}, (used, now)

    def checkpointed_since() -> bool:
        items = http.get(f"/api/v1/jobs/{job}/checkpoints").json()["items"]
        return any(
            c["version"] == recovery["result_version"]
            and c["status"] != "abandoned"
            and c["status"] != "in_progress"
            for c in items
        )

    wait_until(checkpointed_since, WAIT_S, "a checkpoint of the recovered version", 0.2)
    held_end.unlink()

    def ended() -> dict | None:
        state = http.get(f"/api/v1/jobs/{job}").json()
        return state if state["status"] in ("finished", "failed", "stopped") else None

    final = wait_until(ended, WAIT_S, "the job to end", 0.2)
    assert final["status"] == "finished", final
    (out,) = list(server.data.glob("jobs/*/out"))
    lines = read_parts(out)
    twice = [w for w, n in Counter(w for w, _ in lines).items() if n > 1]
    assert not twice, f"{len(twice)} words written twice, e.g. {twice[:3]}"
    assert dict(lines) == reference(PARAMS)
