"""End-to-end runs on real worker processes: results, failures, refusals, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from controlplane.backends.local import secret_pipe
from controlplane.coordinator import Coordinator
from controlplane.runner import LocalCluster
from controlplane.testing import BackgroundCluster
from examples import wordcount
from runtime import handshake, protocol
from runtime.dataflow import load_job
from runtime.records import BarrierKind
from tests.api_support import wait_until
from tests.e2e_jobs import counting_reference, final_counts
from tests.test_reconfig_e2e import finish, flowing, submit_running

REPORTS_TIMEOUT_S = 60.0  # workers report every second; this much on the busiest machine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("parallelism", [1, 3])
def test_wordcount_on_two_workers_equals_reference(
    any_cluster: BackgroundCluster, tmp_path, parallelism: int
) -> None:
    params = {"records": 20_000, "parallelism": parallelism, "output": str(tmp_path)}
    job = any_cluster.run(load_job("examples.wordcount:build", params))
    assert job.status == "finished", job.error
    got = wordcount.read_results(str(tmp_path))
    assert got == wordcount.reference(params)
    assert sum(got.values()) == 20_000 * 8
    summary = job.summary()
    assert summary["source_records"] == 20_000
    assert summary["sink_records"] == 160_000
    assert summary["latency"]["count"] == 160_000


def test_metrics_report_rates_key_groups_traffic_and_latency(cluster: BackgroundCluster) -> None:
    job = cluster.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 20_000}))

    def every_task_reported_records_and_a_sink_latency() -> bool:
        samples = list(job.metrics.samples)
        busy = {task for _, task, snap in samples if snap.get("records_in")}
        timed = any(
            task == "out-0" and snap.get("latency", {}).get("buckets") for _, task, snap in samples
        )
        return busy >= set(job.graph.task_ids()) and timed

    try:
        wait_until(
            every_task_reported_records_and_a_sink_latency,
            REPORTS_TIMEOUT_S,
            "every task to report records",
        )
        samples = list(job.metrics.samples)
    finally:
        cluster.call(cluster.coordinator.stop_job(job.id))
    by_task: dict[str, list[dict]] = {}
    for _, task, snap in samples:
        by_task.setdefault(task, []).append(snap)
    assert set(by_task) == set(job.graph.task_ids())
    count0 = by_task["count-0"][-1]
    assert count0["records_in"] > 0
    assert count0["key_groups"] and all(0 <= g < 128 for g in count0["key_groups"])
    owned = set(range(64))  # count-0 owns the first half of the key groups
    assert set(count0["key_groups"]) <= owned
    src = by_task["keys-0"][-1]
    assert set(src["channels"]) == {"count-0", "count-1"}
    assert all(c["bytes"] > 0 for c in src["channels"].values())
    assert any("latency" in s and s["latency"]["buckets"] for s in by_task["out-0"])
    window = job.metrics.window(2.0)
    assert window["latency"]["count"] > 0
    assert job.metrics.workers and all(w["rss_mb"] > 0 for w in job.metrics.workers.values())


def test_barriers_align_across_workers_without_changing_results(
    any_cluster: BackgroundCluster, tmp_path, held_end
) -> None:
    records = 60_000
    params = {"records": records, "rate": 30_000, "output": str(tmp_path)}
    job = submit_running(any_cluster, "tests.e2e_jobs:counting_job", params, held_end)
    ids = [
        any_cluster.call(
            any_cluster.coordinator.inject_barrier(job.id, BarrierKind.CHECKPOINT, timeout=10)
        )
        for _ in range(3)
    ]
    assert ids == sorted(ids) and len(set(ids)) == 3
    finish(any_cluster, job, held_end)
    assert final_counts(tmp_path) == counting_reference(records)


def test_udf_error_fails_the_job_naming_task_record_and_key(cluster: BackgroundCluster) -> None:
    job = cluster.run(load_job("tests.e2e_jobs:failing_job"))
    assert job.status == "failed"
    assert "poisoned count for k00007" in job.error
    assert "task 'count-" in job.error and "key 'k00007'" in job.error
    assert "tests.e2e_jobs:fail_on_poison" in job.error
    # The cluster survives a failed job.
    again = cluster.run(load_job("tests.e2e_jobs:counting_job", {"records": 1_000}))
    assert again.status == "finished", again.error


def test_sink_that_cannot_open_fails_deploy_with_cause(cluster: BackgroundCluster) -> None:
    job = cluster.run(load_job("tests.e2e_jobs:broken_sink_job"))
    assert job.status == "failed"
    assert "disk full" in job.error and "worker w" in job.error


def test_killed_worker_fails_the_job_at_once(no_leftover_processes: None) -> None:
    """The job fails on the lost connection, not later on the heartbeat timeout."""

    async def main() -> tuple[str, str]:
        async with LocalCluster(2) as c:
            job = await c.coordinator.submit(
                load_job("tests.e2e_jobs:counting_job", {"rate": 20_000})
            )
            await flowing(job)
            victim = c.coordinator.workers["w2"]
            assert c.backend is not None
            c.backend.kill_worker(victim.pid)
            status = await job.wait(10)
            return status, job.error or ""

    status, error = asyncio.run(main())
    assert status == "failed"
    assert "w2" in error and "no heartbeat" not in error, error


def test_hung_worker_is_declared_lost_by_heartbeat(no_leftover_processes: None) -> None:
    async def main() -> tuple[str, str]:
        async with LocalCluster(2, heartbeat_timeout_s=2.0) as c:
            job = await c.coordinator.submit(
                load_job("tests.e2e_jobs:counting_job", {"rate": 5_000})
            )
            await flowing(job)
            victim = c.coordinator.workers["w1"]
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                status = await job.wait(10)
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            return status, job.error or ""

    status, error = asyncio.run(main())
    assert status == "failed"
    assert "w1" in error and "no heartbeat" in error


@pytest.mark.parametrize(
    ("frame", "fragment"),
    [
        (b"\x00\x00\x00\x03\xc1\xc1\xc1", "does not decode"),  # 0xc1 is never valid msgpack
        (
            protocol.encode([protocol.STATE, 1, "count-0", 3, 0, 1, True, -5]),
            "announced a payload of -5 bytes",
        ),
        (protocol.encode(5), "sent a malformed frame"),  # decodes, but is no frame
    ],
    ids=["garbage", "state-payload-length", "not-a-frame"],
)
def test_undecodable_frame_fails_the_job(
    no_leftover_processes: None, frame: bytes, fragment: str
) -> None:
    async def main() -> tuple[str, str]:
        async with LocalCluster(2) as c:
            job = await c.coordinator.submit(
                load_job("tests.e2e_jobs:counting_job", {"rate": 5_000})
            )
            w = c.coordinator.workers["w1"]
            reader, writer = await asyncio.open_connection(w.data_host, w.data_port)
            key = handshake.data_key(c.secret, job.id)  # a peer that holds the secret
            await handshake.dial(reader, writer, key, handshake.data_context(job.id))
            writer.write(protocol.encode([protocol.HELLO, "intruder"]))
            writer.write(frame)
            await writer.drain()
            status = await job.wait(10)
            writer.close()
            return status, job.error or ""

    status, error = asyncio.run(main())
    assert status == "failed"
    assert fragment in error and "worker w1" in error


def test_data_connection_with_wrong_secret_is_ignored(cluster: BackgroundCluster) -> None:
    job = cluster.submit(
        load_job("tests.e2e_jobs:counting_job", {"records": 20_000, "rate": 20_000})
    )

    async def intrude() -> str:
        w = cluster.coordinator.workers["w1"]
        reader, writer = await asyncio.open_connection(w.data_host, w.data_port)
        key = handshake.data_key("not-the-secret", job.id)
        try:
            await handshake.dial(reader, writer, key, handshake.data_context(job.id), 5)
        except handshake.HandshakeError as exc:  # the worker hangs up
            return str(exc)
        finally:
            writer.close()
        return "the worker took the wrong secret"

    assert "during the handshake" in cluster.call(intrude())
    assert cluster.wait(job, 30) == "finished", job.error


def test_worker_with_wrong_secret_is_refused(no_leftover_processes: None) -> None:
    async def main() -> tuple[int, str, int]:
        coord = Coordinator("the-right-secret")
        host, port = await coord.start()
        fd = secret_pipe("wrong")
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "runtime.worker",
                "--coordinator",
                f"{host}:{port}",
                "--secret-fd",
                str(fd),
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(fd,),
            )
        finally:
            os.close(fd)
        try:
            rc = await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        err = (await proc.stderr.read()).decode() if proc.stderr else ""
        await coord.close()
        return rc, err, len(coord.workers)

    rc, err, registered = asyncio.run(main())
    assert rc == 2
    assert "wrong cluster secret" in err
    assert registered == 0


COORDINATOR_SCRIPT = """
import asyncio, sys
from controlplane.coordinator import Coordinator
async def main():
    c = Coordinator("s3cret")
    host, port = await c.start()
    print(port, flush=True)
    await c.wait_for_workers(1, 30)
    print("registered", flush=True)
    await asyncio.sleep(60)  # up until the test kills it (its death is under test)
asyncio.run(main())
"""


def test_worker_exits_when_the_coordinator_dies(no_leftover_processes: None) -> None:
    coord = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR_SCRIPT], stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        assert coord.stdout is not None
        port = int(coord.stdout.readline())
        fd = secret_pipe("s3cret")
        try:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "runtime.worker",
                    "--coordinator",
                    f"127.0.0.1:{port}",
                    "--secret-fd",
                    str(fd),
                ],
                pass_fds=(fd,),
            )
        finally:
            os.close(fd)
        assert coord.stdout.readline().strip() == "registered"
        coord.kill()
        coord.wait(10)
        assert worker.wait(10) == 0
    finally:
        for p in (coord, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if coord.stdout is not None:
            coord.stdout.close()


def test_two_jobs_on_the_same_workers_keep_their_metrics_apart(cluster: BackgroundCluster) -> None:
    slow = cluster.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 2_000}))
    fast = cluster.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 8_000}))
    try:
        # Three reports of each source task: the 2 s window below is past the start-up.
        wait_until(
            lambda: all(
                sum(task == "keys-0" for _, task, _ in job.metrics.samples) >= 3
                for job in (slow, fast)
            ),
            REPORTS_TIMEOUT_S,
            "three reports of each job's sources",
        )
        rates = {}
        for job in (slow, fast):
            window = job.metrics.window(2.0)["tasks"]
            rates[job.id] = sum(window[t]["in_per_s"] for t in ("keys-0", "keys-1"))
    finally:
        for job in (slow, fast):
            cluster.call(cluster.coordinator.stop_job(job.id))
    # Task ids are the same in both jobs; each job counts only its own tasks' records.
    assert 1_500 < rates[slow.id] < 2_500, rates
    assert 6_500 < rates[fast.id] < 9_500, rates


def test_a_stopped_job_counts_what_it_did_up_to_the_stop(cluster: BackgroundCluster) -> None:
    job = cluster.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 5_000}))
    time.sleep(2.5)  # the job counts for a while: how long does not matter (see below)
    cluster.call(cluster.coordinator.stop_job(job.id))
    elapsed = job.ended_at - job.started_at
    counted = job.summary()["source_records"]
    # The workers' last counts (since their last once-a-second report) arrive with the stop.
    assert abs(counted - 5_000 * elapsed) < 0.05 * 5_000 * elapsed, (counted, elapsed)
