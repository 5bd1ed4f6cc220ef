"""A worker's local copies of its checkpoint parts (:mod:`runtime.checkpoints.local_copies`)
do not outlive it, on real processes:

- the directory of a process SIGKILLed with its copies is removed by the next
  ``LocalCopies`` made beside it, and so is one named after a live process that does not
  hold its lock (the pid was given again); a live process's is kept, and removed by that
  process as it closes;
- on a cluster whose checkpoints go to S3 (a real moto server), the copies of a worker
  SIGKILLed under a running job are removed once its replacement writes a checkpoint, and
  those of the workers stopped by SIGTERM go with them.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import wait_until
from s3server import running_s3_server

from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.checkpoints.local_copies import LOCK, PREFIX, LocalCopies
from runtime.sources import Generator
from tests.faults_support import WAIT_S, Events, gone, kill, listening
from tests.jobs_for_tests import count, identity

PART = "job/chk-1/count-0.part"

# Makes its copies under argv[1], says where, and closes them once told to (a line on stdin).
OWNER = f"""
import sys
from runtime.checkpoints.local_copies import LocalCopies

copies = LocalCopies(sys.argv[1])
copies.keep({PART!r}, [b"state" * 1000])
print(copies.root, flush=True)
sys.stdin.readline()
copies.close()
"""


@contextlib.contextmanager
def owner(parent: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process with its local copies in ``parent``, and their directory; killed after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the owner exited ({proc.wait()}) before making its copies"
        yield proc, Path(line.strip())
    finally:
        proc.kill()
        proc.wait(WAIT_S)
        proc.stdin.close()  # type: ignore[union-attr]
        proc.stdout.close()  # type: ignore[union-attr]


def copies_in(parent: Path) -> dict[int, Path]:
    """The directories of local copies in ``parent``, by their owner's pid."""
    owned = (re.fullmatch(rf"{PREFIX}(\d+)-.+", p.name) for p in parent.iterdir())
    return {int(m[1]): parent / m[0] for m in owned if m is not None}


def test_a_killed_process_s_copies_are_removed_by_the_next_and_a_live_one_s_are_kept(
    tmp_path: Path,
) -> None:
    with owner(tmp_path) as (killed, orphaned), owner(tmp_path) as (live, kept):
        assert (orphaned / PART).is_file() and (kept / PART).is_file()
        killed.send_signal(signal.SIGKILL)  # it never closes its copies
        killed.wait(WAIT_S)
        assert orphaned.is_dir()
        # Left by an earlier process that had the live one's pid: its lock is free.
        reused = tmp_path / f"{PREFIX}{live.pid}-earlier"
        reused.mkdir()
        (reused / LOCK).touch()
        unknown = tmp_path / f"{PREFIX}not-a-worker-s"  # named otherwise: not ours to judge
        unknown.mkdir()
        # Made, not locked yet: its pid says whether its owner lives.
        making = tmp_path / f"{PREFIX}{live.pid}-new"
        unmade = tmp_path / f"{PREFIX}{killed.pid}-new"
        making.mkdir()
        unmade.mkdir()

        copies = LocalCopies(tmp_path)
        try:
            assert not orphaned.exists() and not reused.exists() and not unmade.exists()
            assert (kept / PART).is_file() and unknown.is_dir() and making.is_dir()
            assert (copies.root / LOCK).is_file()
        finally:
            copies.close()
        making.rmdir()
        assert copies_in(tmp_path) == {live.pid: kept}
        live.stdin.write("\n")  # type: ignore[union-attr]
        live.stdin.flush()  # type: ignore[union-attr]
        assert live.wait(WAIT_S) == 0
        assert not kept.exists()  # removed by its owner as it closed
    assert copies_in(tmp_path) == {}


@pytest.fixture
def worker_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own, which worker processes started during the
    test take as theirs (they inherit ``TMPDIR``)."""
    tmp = tmp_path / "workers-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


def test_a_sigkilled_worker_s_copies_go_once_its_replacement_checkpoints_and_the_rest_on_exit(
    worker_tmp: Path, tmp_path: Path
) -> None:
    """Two workers with S3 checkpoints run an endless count; one is SIGKILLed, the job
    recovers onto a worker the backend starts, which makes its copies at its first
    checkpoint and removes the dead one's then. The other workers, SIGTERMed, remove
    theirs as they exit."""
    flow = Dataflow("local_copies")
    src = flow.source("src", Generator(records=None, rate=2_000, keys=50, seed=5), parallelism=2)
    src.key_by(identity).process("count", count, parallelism=2)
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    with running_s3_server() as s3:
        s3.create_bucket("local-copies")
        config = RuntimeConfig(checkpoint_store=s3.uri("local-copies", "checkpoints"))
        cluster = BackgroundCluster(workers=2, config=config)
        co = cluster.coordinator
        try:
            with listening(cluster, Events()) as events:
                job = cluster.call(co.submit(flow.compile(), checkpoints=policy))
                events.wait("2 completed checkpoints", lambda: events.completed(job.id) >= 2)
                victim, survivor = job.layout.placement["count-1"], job.layout.placement["count-0"]
                assert victim != survivor
                pids = {w: co.workers[w].pid for w in (victim, survivor)}
                assert set(copies_in(worker_tmp)) == set(pids.values())
                kill(pids[victim])
                assert gone(pids[victim])
                events.wait("a recovery", lambda: bool(events.recoveries))
                report, _ = events.recoveries[0]
                (replacement,) = report.plan["placed_on"].values()
                assert replacement not in pids, "the backend started no new worker"
                # The replacement makes its copies as it writes its first part.
                owners = {pids[survivor], co.workers[replacement].pid}
                wait_until(
                    lambda: set(copies_in(worker_tmp)) == owners,
                    WAIT_S,
                    f"the copies of the survivor and the replacement only ({owners})",
                )
                cluster.call(co.stop_job(job.id))
            for w in co.alive_workers():
                kill(w.pid, signal.SIGTERM)
                assert gone(w.pid), f"worker {w.id} did not exit on SIGTERM"
            assert copies_in(worker_tmp) == {}
        finally:
            cluster.close()
