"""A worker's memory reserve (runtime.heap): state allocated after it fills pages already
faulted in, and a worker started with one holds it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import psutil
import pytest

from controlplane.runner import LocalCluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# Fills ~48 MB with payloads as a task's state does (21 KB each, as in bench/reconfig.py at
# 100 MB) and prints the page faults that cost.
FILL = """
import os, resource, sys
from runtime import heap
assert heap.reserve(int(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
state = {i: (i, os.urandom(21_000)) for i in range(2_400)}
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_filling(reserve_mb: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", FILL, str(reserve_mb)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(out.stdout)


def test_state_allocated_after_a_reserve_faults_in_almost_no_page() -> None:
    without, reserved = faults_filling(0), faults_filling(64)
    assert without > 10_000  # ~12,300 pages of 4 KB
    assert reserved < without / 10


def test_a_worker_refuses_a_negative_reserve_saying_what_it_takes() -> None:
    worker = [sys.executable, "-m", "runtime.worker", "--coordinator", "127.0.0.1:9"]
    out = subprocess.run(
        [*worker, "--secret-fd", "0", "--reserve-mb", "-5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--reserve-mb: expected a whole number of MiB, 0 or more, got '-5'" in out.stderr


def test_workers_started_with_a_reserve_hold_it() -> None:
    """The cluster passes its reserve to the workers it starts (as the settings'
    ``worker_reserve_mb`` does through the backends): their resident memory shows it."""

    async def worker_rss(reserve_mb: int) -> int:
        async with LocalCluster(1, worker_reserve_mb=reserve_mb) as cluster:
            (pid,) = cluster.backend.procs
            return psutil.Process(pid).memory_info().rss

    plain, reserved = asyncio.run(worker_rss(0)), asyncio.run(worker_rss(96))
    assert reserved - plain > 80 << 20
