"""A worker hosting the exactly-once Kafka sink SIGKILLed in the middle of a commit, at
a point chosen on purpose; the job recovers from its checkpoint and the topic holds the
reference, each record once, as a read-committed consumer of a real Kafka sees it.

The job: a seeded generator (2 tasks) -> key_by -> running count (2) ->
:class:`GatedKafkaSink` (1 task; 3 local workers, the job on 2, checkpoints every
0.2 s), its end held back until the test releases it. Once 2 checkpoints are complete
the test arms the gate (a file); the sink writer's next commit of a checkpoint takes it
(an atomic rename: once only), says so with its pid, and stops there until the test
SIGKILLs its worker:

- ``before``: the epoch's records produced and flushed, its marker sent, and
  ``commit_transaction`` not called: the recovery's producers fence the dead ones, which
  aborts that transaction, and the epoch is produced again from the checkpoint;
- ``after``: ``commit_transaction`` returned (records and marker are committed
  together) but the writer has not noted it: the checkpoint still lists the epoch as
  pending, and the recovery finds its marker and produces nothing again.

One sink task, because tansu 0.6 does not always show committed transactional offsets
when other producers' transactions overlap (tests/kafka_broker.py): with two, the restore
of the task that was not killed found no marker in 4 runs of 7, and produced again its
checkpoint's epoch, committed just before.

How exactness is checked: tansu writes each transaction's COMMIT or ABORT marker into
the log but lists no aborted transactions in its Fetch answers, so its read-committed
consumers show aborted records. The test reads each partition's log with Fetch requests
of its own (:meth:`kafka_broker.Broker.partition_log`: every batch with its producer id
and the control batches) and keeps what a read-committed consumer of Apache Kafka keeps
(:func:`kafka_broker.read_committed`): a transactional batch counts if its producer's
next marker is COMMIT. It never deduplicates values; it also checks that, killed
``before``, the log does hold an aborted transaction (what tansu's consumers would show
twice), every record of which was produced again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka_broker import Broker, aborted_records, running_tansu

from connectors.kafka import KafkaSink, KafkaSinkWriter
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.sources import Generator
from tests.api_support import wait_until
from tests.e2e_jobs import held_until_released
from tests.faults_support import (
    WAIT_S,
    Events,
    assert_exact,
    fault_cluster,
    kill,
    listened,
    start_job,
)
from tests.jobs_for_tests import count, identity

STOPPED_S = 300.0  # hang guard: a writer stopped at the gate is killed long before this
PARTITIONS = 2

# Bounded, seeded, paced: records still flow when the gate is armed, however slow the
# machine (a paced source's records come due on schedule, so late ones come at once).
SOURCE = Generator(records=90_000, rate=6_000, keys=300, seed=23)


@dataclass(frozen=True)
class GatedKafkaSink(KafkaSink):
    """A :class:`KafkaSink` whose writers stop at a checkpoint's commit (``point``:
    "before" or "after" ``commit_transaction``) once the file ``<gate>/armed`` exists,
    the first one only, writing ``<gate>/reached`` (its pid) as they do."""

    gate: str = ""
    point: str = "before"

    def open(self, index: int, parallelism: int) -> KafkaSinkWriter:
        return GatedWriter(self, index)


class GatedWriter(KafkaSinkWriter):
    def _commit_transaction(self, slot: Any) -> None:
        point = self._sink.point  # type: ignore[attr-defined]
        if point == "after":
            super()._commit_transaction(slot)
        self._stop_here_if_armed(slot.id)
        if point == "before":
            super()._commit_transaction(slot)

    def _stop_here_if_armed(self, transactional_id: str) -> None:
        gate = Path(self._sink.gate)  # type: ignore[attr-defined]
        try:
            (gate / "armed").rename(gate / "taken")  # atomic: one writer takes it
        except FileNotFoundError:
            return
        said = {"pid": os.getpid(), "transactional_id": transactional_id}
        (gate / "reached.tmp").write_text(json.dumps(said))
        (gate / "reached.tmp").rename(gate / "reached")
        threading.Event().wait(STOPPED_S)  # SIGKILLed here by the test
        raise RuntimeError(f"stopped at the commit for {STOPPED_S:.0f}s and not killed")


def reference() -> list[tuple[str, int]]:
    """Every (key, running count) the job emits once, replayed in process."""
    seen: Counter = Counter()
    for index in range(2):
        reader = SOURCE.open(index, 2, 0.0)
        while (polled := reader.poll(1e12, 4096)) is not None:
            seen.update(polled[0])
    return sorted((k, n) for k, c in seen.items() for n in range(1, c + 1))


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_tansu() as b:
        yield b


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundCluster]:
    yield from fault_cluster(tmp_path_factory, workers=3)


@pytest.fixture
def events(cluster: BackgroundCluster) -> Iterator[Events]:
    yield from listened(cluster, 3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", ["before", "after"])
def test_a_worker_killed_in_the_middle_of_a_sink_commit_leaves_the_topic_exact(
    broker: Broker,
    cluster: BackgroundCluster,
    events: Events,
    held_end: Path,
    tmp_path: Path,
    point: str,
) -> None:
    topic = f"killed-{point}-{time.monotonic_ns()}"
    broker.create_topic(topic, PARTITIONS)
    gate = tmp_path / "gate"
    gate.mkdir()
    sink = GatedKafkaSink(
        broker.bootstrap, topic, transactional_id=topic, gate=str(gate), point=point
    )
    flow = Dataflow("kafka_killed_commit")
    src = flow.source("src", SOURCE, parallelism=2)
    counts = src.key_by(identity).process("count", count, parallelism=2)
    counts.sink("out", sink, parallelism=1)  # one sink task: tansu quirk, module docstring
    job, _used, _spare = start_job(cluster, events, held_until_released(flow.compile(), held_end))

    (gate / "armed").touch()
    reached = gate / "reached"
    wait_until(reached.exists, WAIT_S, f"a sink writer at its commit ({point})")
    said = json.loads(reached.read_text())
    co = cluster.coordinator
    victim = next(w for w, info in co.workers.items() if info.pid == said["pid"])
    sink_hosts = {w for t, w in job.layout.placement.items() if t.startswith("out-")}
    assert victim in sink_hosts, (victim, job.layout.placement)
    kill(said["pid"])

    events.wait("a recovery", lambda: bool(events.recoveries))
    assert victim in events.recoveries[0][0].plan["lost_workers"]
    held_end.unlink()
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error

    got = [tuple(json.loads(m.value())) for m in broker.consume_all(topic, PARTITIONS)]
    assert_exact(got, reference())
    aborted = [
        tuple(json.loads(value))
        for p in range(PARTITIONS)
        for _, _, value in aborted_records(broker.partition_log(topic, p))
    ]
    if point == "before":  # the transaction cut short was aborted, and produced again
        assert aborted, "no aborted transaction: the kill did not land in one"
        assert not Counter(aborted) - Counter(got), "an aborted record not produced again"
