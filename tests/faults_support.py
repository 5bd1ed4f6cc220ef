"""Fault injection for recovery tests: a counting job and a word count whose ends are
held back, their in-process references, what the coordinator tells of checkpoints and
recoveries, ways to lose a worker (SIGKILL, SIGSTOP, its Spark task's Python worker) and
to catch a worker in the middle of writing its part of a checkpoint.

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
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.checkpoint_report import (
    CheckpointPolicy,
    CheckpointReport,
    RestartPolicy,
)
from controlplane.coordinator.report import RunReport
from controlplane.statuses import CheckpointStatus, JobStatus, WorkerStatus
from controlplane.testing import BackgroundCluster
from examples import wordcount
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.sinks import Collect, read_parts
from runtime.sources import Generator
from tests.e2e_jobs import held_until_released
from tests.jobs_for_tests import count, identity

__all__ = [
    "HEARTBEAT_TIMEOUT_S",
    "SOURCE",
    "WAIT_S",
    "Events",
    "apply_killing",
    "assert_exact",
    "checkpoint_id_gaps",
    "counting_job",
    "exact_output",
    "fault_cluster",
    "finish_job",
    "gone",
    "kill",
    "listened",
    "listening",
    "lost",
    "reference",
    "stale_sink_files",
    "start_job",
    "stop_jobs",
    "submit",
    "top_up",
    "wait_for_progress",
    "wordcount_job",
    "wordcount_reference",
    "worker_writing",
]

WAIT_S = 120.0  # any awaited event happens within this, however loaded the machine
# Between two checkpoints of a job alone on its cluster, at most this many barrier ids go
# to ticks that started none: far more than a tick per interval over any stall here.
ID_GAP = 1_000
PROCESS_EXIT_S = 30.0  # a killed process (or one whose parent was killed) is gone within this

# Bounded and seeded: replayable from any position, so a recovery's output can be exact.
SOURCE = Generator(records=30_000, rate=6_000, keys=300, seed=17)


def counting_job(out: Path, held: Path, logic: Callable[..., Any] = count) -> JobGraph:
    """src (2) -> key_by -> count (2) -> Collect(out, "all") (2): every (key, running
    count) once; the sources' end is held back while the file ``held`` exists
    (:func:`tests.e2e_jobs.held_until_released`), so the job runs until the test lets it
    end, whatever the machine's speed, and the rest comes unpaced once it does.
    ``logic``: the count's, e.g. ``examples.wordcount.PaddedCount(pad)`` for the same
    output over larger state."""
    flow = Dataflow("fault_counts")
    src = flow.source("src", SOURCE, parallelism=2)
    counts = src.key_by(identity).process("count", logic, parallelism=2)
    counts.sink("out", Collect(str(out), mode="all"), parallelism=2)
    return held_until_released(flow.compile(), held, hurry=True)


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


def assert_exact(got: list, expected: list) -> None:
    """``got`` (records read back from the sink files) is ``expected``, every record once;
    a failure says how many are missing or there twice, with a few of each."""
    have, want = Counter(map(tuple, got)), Counter(map(tuple, expected))
    missing, extra = want - have, have - want
    assert not missing and not extra, (
        f"{sum(missing.values())} records missing (e.g. {sorted(missing)[:3]}), "
        f"{sum(extra.values())} extra or twice (e.g. {sorted(extra)[:3]})"
    )


def start_job(
    cluster: BackgroundCluster,
    events: Events,
    graph: JobGraph,
    policy: CheckpointPolicy | None = None,
    restart: RestartPolicy | None = None,
) -> tuple[Any, list[str], str | None]:
    """Submit ``graph`` on the two oldest alive workers (see :func:`submit`) and wait
    until it runs with 2 complete checkpoints; returns it, those workers and a spare."""
    alive = [w.id for w in cluster.coordinator.alive_workers()]
    used, spare = alive[:2], alive[2] if len(alive) > 2 else None
    job = submit(cluster, graph, used, policy, restart)
    assert job.status == JobStatus.RUNNING, job.error
    events.wait("2 complete checkpoints", lambda: events.completed(job.id) >= 2)
    return job, used, spare


def finish_job(cluster: BackgroundCluster, job: Any, held: Path) -> None:
    """Let ``job`` end (remove its ``held`` file); it finishes."""
    held.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error


def wordcount_job(params: dict[str, Any], out: Path, held: Path) -> JobGraph:
    """``examples.wordcount`` with ``params`` (bounded), its sink writing every (word,
    running count) to ``out`` (``Collect`` in mode "all", so a record lost or written
    twice shows), its end held back while the file ``held`` exists (the rest unpaced once
    it is gone)."""
    p = wordcount.Params(**params)
    flow = Dataflow("fault_wordcount")
    sentences = flow.source("sentences", wordcount.source_of(p), parallelism=p.parallelism)
    words = sentences.flat_map("split", wordcount.split_words)
    counts = words.key_by(wordcount.word_key).process(
        "count", wordcount.count_word, max_parallelism=p.max_parallelism
    )
    counts.sink("sink", Collect(str(out), mode="all"))
    return held_until_released(flow.compile(), held, hurry=True)


def wordcount_reference(params: dict[str, Any]) -> list[tuple[str, int]]:
    """Every (word, running count) :func:`wordcount_job` writes once, in order."""
    return sorted((w, n) for w, c in wordcount.reference(params).items() for n in range(1, c + 1))


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


def submit(
    cluster: BackgroundCluster,
    graph: JobGraph,
    workers: list[str],
    policy: CheckpointPolicy | None = None,
    restart: RestartPolicy | None = None,
) -> Any:
    """Submit ``graph`` on ``workers``, checkpointed as ``policy`` says (default every
    0.2 s, two retained), recovering as ``restart`` allows (default: the coordinator's)."""
    policy = policy or CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    co = cluster.coordinator
    return cluster.call(co.submit(graph, workers, checkpoints=policy, restart=restart))


HEARTBEAT_TIMEOUT_S = 4.0  # a SIGSTOPped worker is declared lost this long after its last word


def fault_cluster(tmp_path_factory: Any, workers: int = 3) -> Iterator[BackgroundCluster]:
    """A local cluster of its own (its workers get killed) with a checkpoint store in a
    temporary directory; for a module-scoped fixture to ``yield from``."""
    store = tmp_path_factory.mktemp("checkpoints")
    c = BackgroundCluster(workers=workers, config=RuntimeConfig(checkpoint_store=str(store)))
    try:
        yield c
    finally:
        c.close()


def stop_jobs(cluster: BackgroundCluster) -> None:
    """Stop the jobs a test left running (a failing test leaves its held jobs behind)."""
    for job in list(cluster.coordinator.jobs.values()):
        if not job.done:
            cluster.call(cluster.coordinator.stop_job(job.id))


def listened(cluster: BackgroundCluster, n: int = 3) -> Iterator[Events]:
    """For a test's fixture to ``yield from``: ``cluster`` with ``n`` alive workers and
    no job, its events told to the test; what the test left running is stopped after."""
    top_up(cluster, n)
    with listening(cluster, Events()) as e:
        yield e
    stop_jobs(cluster)


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
    the job as it resumes, before it can take another checkpoint. ``on_checkpoint(job_id,
    what)`` likewise for each checkpoint's report: a checkpoint reported ``in_progress``
    is about to be injected, one ``abandoned`` because "the job is recovering" is
    reported in the middle of a recovery (between its halt and its placement).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._checkpoints: dict[tuple[str, int], CheckpointReport] = {}
        self.recoveries: list[tuple[RunReport, dict[str, Any]]] = []
        self.after_recovery: Callable[[str, RunReport], None] | None = None
        self.on_checkpoint: Callable[[str, CheckpointReport | int], None] | None = None

    def checkpoint(self, job_id: str, what: CheckpointReport | int) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(job_id, what)
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

    def completed_after(self, job_id: str, checkpoint_id: int) -> bool:
        """Whether a checkpoint of ``job_id`` started after ``checkpoint_id`` completed."""
        with self._cond:
            reports = list(self._checkpoints.values())
        return any(
            r.job_id == job_id and r.id > checkpoint_id and r.status == CheckpointStatus.COMPLETED
            for r in reports
        )

    def report(self, job_id: str, checkpoint_id: int) -> CheckpointReport:
        """The last report told of checkpoint ``checkpoint_id`` of ``job_id``."""
        with self._cond:
            return self._checkpoints[(job_id, checkpoint_id)]

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


WRITE_POLL_S = 0.002  # how often worker_writing looks at the store (a part's write lasts longer)


def worker_writing(cluster: BackgroundCluster, store: Path, job: Any) -> tuple[str, int, int]:
    """Catch a worker of ``job`` in the middle of writing its part of a checkpoint, and
    leave it SIGSTOPped there: returns (its worker id, pid, the checkpoint id).

    A local store's put writes a temp file (``.<task>.part~<uuid>.tmp``) in the
    checkpoint's directory and renames it when complete. The store is polled until such a
    file is there for a checkpoint that has not completed; the task's worker is then
    stopped, and, since a stopped process writes nothing, the temp file still being there
    afterwards proves it was stopped mid-write (else it goes on, and the next write is
    waited for)."""
    co = cluster.coordinator
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for chk in sorted((store / job.id).glob("chk-*"), reverse=True):
            if (chk / "_manifest.msgpack").exists():
                continue
            for temp in chk.glob(".*.part~*.tmp"):
                worker = job.layout.placement.get(temp.name[1:].partition(".part~")[0])
                if worker is None:
                    continue
                pid = co.workers[worker].pid
                kill(pid, signal.SIGSTOP)
                if temp.exists():
                    return worker, pid, int(chk.name.removeprefix("chk-"))
                kill(pid, signal.SIGCONT)
        time.sleep(WRITE_POLL_S)
    raise AssertionError(f"no worker of {job.id} caught writing a checkpoint within {WAIT_S}s")


def wait_for_progress(
    cluster: BackgroundCluster,
    events: Events,
    job: Any,
    what: str,
    log: list[str],
    victim: str | None = None,
) -> None:
    """Wait until a checkpoint of ``job`` started after now completes (after a kill: the
    job runs again; a checkpoint cannot complete while a worker it needs is dead), and
    ``victim``, if any, is lost and no longer used; ``log`` (a schedule's actions so far)
    goes into the failure message."""
    mark = max(events.ids(job.id), default=0)

    def settled() -> bool:
        assert not job.done, (job.status, job.error, log)
        if victim is not None and not lost(cluster, victim):
            return False
        return events.completed_after(job.id, mark)

    events.wait(f"progress after {what} ({log})", settled)
    if victim is not None:
        assert victim not in job.layout.workers_used(), log


def apply_killing(
    cluster: BackgroundCluster,
    job: Any,
    plan: Any,
    victim: str | None,
    phase: Any,
    log: list[str],
) -> bool:
    """Apply ``plan`` to ``job``, SIGKILLing worker ``victim`` (None: nobody) as the
    reconfiguration reaches ``phase``; its status goes at the end of ``log``'s last line.
    True if the victim was killed (the plan failed, or completed just before the loss);
    else the plan must have completed."""
    killed: list[str] = []

    def listener(rec: Any) -> None:
        if victim is not None and rec.status == phase and not killed:
            kill(cluster.coordinator.workers[victim].pid)
            killed.append(victim)

    rec = cluster.call(cluster.coordinator.apply_plan(job.id, plan, on_change=listener))
    log[-1] += f": {rec.status}"
    if not killed:
        assert rec.status == "completed", (rec.error, log)
    return bool(killed)
