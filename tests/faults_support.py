"""Fault injection for recovery tests: a counting job whose end is held back, its
in-process reference, what the coordinator tells of checkpoints and recoveries, and ways
to lose a worker (SIGKILL, SIGSTOP, its Spark task's Python worker).

Every wait is on an event (a checkpoint's report, a recovery, a registration, a process's
exit), bounded: the machine is a loaded 2-core VM.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from controlplane.coordinator.checkpoint_report import CheckpointPolicy, CheckpointReport
from controlplane.coordinator.report import RunReport
from controlplane.statuses import CheckpointStatus, WorkerStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.sinks import Collect, read_parts
from runtime.sources import Generator
from tests.e2e_jobs import held_until_released
from tests.jobs_for_tests import count, identity

__all__ = [
    "SOURCE",
    "WAIT_S",
    "Events",
    "checkpoint_id_gaps",
    "counting_job",
    "exact_output",
    "gone",
    "kill",
    "listening",
    "lost",
    "reference",
    "stale_sink_files",
    "submit",
    "top_up",
]

WAIT_S = 120.0  # any awaited event happens within this, however loaded the machine
# Between two checkpoints of a job alone on its cluster, at most this many barrier ids go
# to ticks that started none: far more than a tick per interval over any stall here.
ID_GAP = 1_000
PROCESS_EXIT_S = 30.0  # a killed process (or one whose parent was killed) is gone within this

# Bounded and seeded: replayable from any position, so a recovery's output can be exact.
SOURCE = Generator(records=30_000, rate=6_000, keys=300, seed=17)


def counting_job(out: Path, held: Path) -> JobGraph:
    """src (2) -> key_by -> count (2) -> Collect(out, "all") (2): every (key, running
    count) once; the sources' end is held back while the file ``held`` exists
    (:func:`tests.e2e_jobs.held_until_released`), so the job runs until the test lets it
    end, whatever the machine's speed."""
    flow = Dataflow("fault_counts")
    src = flow.source("src", SOURCE, parallelism=2)
    counts = src.key_by(identity).process("count", count, parallelism=2)
    counts.sink("out", Collect(str(out), mode="all"), parallelism=2)
    return held_until_released(flow.compile(), held)


def reference() -> list[tuple[str, int]]:
    """Every (key, running count) :func:`counting_job` emits once, replayed in process."""
    seen: Counter = Counter()
    for index in range(2):
        reader = SOURCE.open(index, 2, 0.0)
        while (polled := reader.poll(1e12, 4096)) is not None:
            seen.update(polled[0])
    return sorted((k, n) for k, c in seen.items() for n in range(1, c + 1))


def exact_output(out: Path) -> bool:
    """Whether the job's output is the reference: nothing lost, nothing twice."""
    return sorted((k, n) for k, n in read_parts(out)) == reference()


def stale_sink_files(cluster: BackgroundCluster, out: Path) -> list[str]:
    """The part files under ``out`` that an alive worker holds open more than once: a sink
    of the job's run before a recovery, stopped, would still hold the file the recovered
    sink truncated (its buffered records would land when it is garbage collected)."""
    found = []
    for w in cluster.coordinator.alive_workers():
        targets = []
        with contextlib.suppress(OSError):  # a worker dying now holds nothing
            for fd in list(Path(f"/proc/{w.pid}/fd").iterdir()):
                with contextlib.suppress(OSError):  # closed meanwhile
                    targets.append(os.readlink(fd))
        opened = Counter(t for t in targets if t.startswith(f"{out}{os.sep}"))
        found += [
            f"worker {w.id} holds {Path(t).name} open {n} times"
            for t, n in sorted(opened.items())
            if n > 1
        ]
    return found


def submit(cluster: BackgroundCluster, graph: JobGraph, workers: list[str]) -> Any:
    """Submit ``graph`` on ``workers``, checkpointed every 0.2 s (two retained)."""
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    return cluster.call(cluster.coordinator.submit(graph, workers, checkpoints=policy))


def top_up(cluster: BackgroundCluster, n: int) -> list[str]:
    """Exactly ``n`` alive workers, with no job running: the backend starts what earlier
    tests killed, and workers beyond ``n`` (the newest) are retired. Returns the alive
    workers' ids, oldest first."""
    co = cluster.coordinator
    missing = n - len(co.alive_workers())
    if missing > 0:
        cluster.call(cluster.cluster.backend.start_workers(missing))
        cluster.call(co.wait_for_workers(n, WAIT_S), WAIT_S + 10)
    for w in co.alive_workers()[n:]:
        cluster.call(co.retire_worker(w.id, "a fault-injection test needs no more"))
    return [w.id for w in co.alive_workers()]


class Events:
    """What the coordinator tells of checkpoints and recoveries, for a test to wait on.

    ``after_recovery(job_id, report)``, when set, is called on the coordinator's loop
    as each recovery is told (before any waiter wakes): a fault injected there hits
    the job as it resumes, before it can take another checkpoint.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._checkpoints: dict[tuple[str, int], CheckpointReport] = {}
        self.recoveries: list[tuple[RunReport, dict[str, Any]]] = []
        self.after_recovery: Callable[[str, RunReport], None] | None = None

    def checkpoint(self, job_id: str, what: CheckpointReport | int) -> None:
        with self._cond:
            if isinstance(what, CheckpointReport):
                self._checkpoints[(job_id, what.id)] = what
            self._cond.notify_all()

    def recovered(self, job_id: str, report: RunReport, version: dict[str, Any]) -> None:
        if self.after_recovery is not None:
            self.after_recovery(job_id, report)
        with self._cond:
            self.recoveries.append((report, version))
            self._cond.notify_all()

    def completed(self, job_id: str, version: int | None = None) -> int:
        """Complete checkpoints of ``job_id`` (taken in abstraction ``version`` if given)."""
        with self._cond:
            reports = list(self._checkpoints.values())
        return sum(
            1
            for r in reports
            if r.job_id == job_id
            and r.status == CheckpointStatus.COMPLETED
            and (version is None or r.version == version)
        )

    def ids(self, job_id: str) -> list[int]:
        """The ids of ``job_id``'s checkpoints told so far, in order."""
        with self._cond:
            return sorted(cid for job, cid in self._checkpoints if job == job_id)

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
        """Return once ``condition()`` holds, checked now and at each event told."""
        with self._cond:
            assert self._cond.wait_for(condition, timeout), f"no {what} within {timeout:.0f}s"


def checkpoint_id_gaps(ids: list[int]) -> list[tuple[int, int]]:
    """Consecutive checkpoint ids more than ``ID_GAP`` apart: barrier ids handed out by
    ticks that started no checkpoint (a declined tick's id is never used)."""
    return [(a, b) for a, b in itertools.pairwise(ids) if b - a > ID_GAP]


@contextlib.contextmanager
def listening(cluster: BackgroundCluster, events: Events) -> Iterator[Events]:
    """``events`` told of the coordinator's checkpoints and recoveries while in the block."""
    co = cluster.coordinator
    co.on_checkpoint, co.on_recovery = events.checkpoint, events.recovered
    try:
        yield events
    finally:
        co.on_checkpoint = co.on_recovery = None


def lost(cluster: BackgroundCluster, worker_id: str) -> bool:
    return cluster.coordinator.workers[worker_id].status == WorkerStatus.LOST


def gone(pid: int) -> bool:
    """Whether process ``pid`` exits within ``PROCESS_EXIT_S`` (its pidfd becomes readable
    when it does, reaped by its parent or not; nothing is reaped here)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], PROCESS_EXIT_S)
    finally:
        os.close(fd)
    return bool(readable)


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
