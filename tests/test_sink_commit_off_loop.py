"""A sink whose commits are slow does not hold its task back: a write-ahead writer commits
on a thread of its own (``SinkWriter.commits_off_loop``) while its task writes the next
checkpoint's records, and the output stays exactly once.

The test's sink blocks inside a commit until the test lets it go, and notes whether
records reached it meanwhile; real worker processes, checkpoints every 0.2 s."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors._writeahead import Epoch, WriteAheadWriter
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.io import Sink
from runtime.sources import Generator
from tests import faults_support
from tests.api_support import wait_until

RECORDS = 20_000
SOURCE = Generator(records=RECORDS, rate=5_000, keys=1_000, seed=5)
HOLD_S = 60.0  # hang guard: a held commit lets go after this even if the test is gone


@dataclass(frozen=True)
class HeldCommits(Sink):
    """Writes each committed epoch as JSON lines to ``out`` (once per token and
    checkpoint); while the file ``gate`` exists, a commit waits inside ``write_epochs``
    after creating ``gate + ".held"``, and a write that comes meanwhile creates
    ``gate + ".passed"``."""

    out: str
    gate: str
    exactly_once = True

    def open(self, index: int, parallelism: int) -> HeldWriter:
        return HeldWriter(self, index)


class HeldWriter(WriteAheadWriter):
    def __init__(self, sink: HeldCommits, index: int) -> None:
        super().__init__()
        self.sink = sink
        self.path = Path(sink.out) / f"part-{index}.jsonl"

    def encode(self, value: Any) -> Any:
        return value

    def write(self, values: list) -> None:
        if os.path.exists(self.sink.gate + ".held"):
            Path(self.sink.gate + ".passed").touch()
        super().write(values)

    def write_epochs(self, epochs: list[Epoch]) -> None:
        if os.path.exists(self.sink.gate):
            Path(self.sink.gate + ".held").touch()
            deadline = time.monotonic() + HOLD_S
            while os.path.exists(self.sink.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        done = self.path.with_suffix(".done")
        written = set(done.read_text().split()) if done.exists() else set()
        with self.path.open("a") as out, done.open("a") as marks:
            for checkpoint, records in epochs:
                mark = f"{self.token}/{checkpoint}"
                if mark in written:
                    continue
                out.writelines(json.dumps(r) + "\n" for r in records)
                marks.write(mark + "\n")

    def write_now(self, records: list) -> None:
        self.write_epochs([(0, records)])


def test_a_slow_commit_does_not_stop_its_task_and_the_output_stays_exact(
    faults: BackgroundCluster, fault_events: faults_support.Events, tmp_path: Path
) -> None:
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    flow = Dataflow("held_commits")
    flow.source("keys", SOURCE).sink("out", HeldCommits(str(out), str(gate)))
    job, _used, _spare = faults_support.start_job(faults, fault_events, flow.compile())
    gate.touch()  # the next commit waits inside the sink
    passed = Path(f"{gate}.passed")
    try:
        wait_until(lambda: job.done or passed.exists(), HOLD_S, "a write during a held commit")
        assert not job.done, job.error
    finally:
        gate.unlink()
    assert faults.wait(job, faults_support.WAIT_S) == JobStatus.FINISHED, job.error
    got = [json.loads(line) for line in (out / "part-0.jsonl").read_text().splitlines()]
    reader = SOURCE.open(0, 1, 0.0)
    expected: list = []
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        expected += polled[0]
    assert sorted(got) == sorted(expected)
