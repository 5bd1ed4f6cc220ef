"""A sink that discards records, as ``Null`` does, and logs when each batch arrived: how
bench/recovery.py sees, to the millisecond, when a recovered job's output resumes.

It is a module of its own, importing nothing but the runtime's sink interface, because
every worker that deploys the job imports it to unpickle the graph: a worker a recovery
starts does so while it is timed, and importing the benchmark's driver (the control
plane with it) would add some 0.3 s that is the benchmark's, not the recovery's.

Sink task ``i``'s writer appends to ``{path}/sink-{i}-{pid}-{opened}.log`` (``opened``:
``time.time_ns()`` when the writer was opened, so that each deployment of the task, the
first and the recovered one, has a file of its own): ``<time.time()> <records>`` per
batch, flushed at most every :data:`FLUSH_S`. A worker that is killed loses what it did
not flush; what the benchmark reads is the recovered writers' logs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from runtime.io import Sink, SinkWriter

__all__ = ["Arrivals", "ArrivalsWriter", "Opened", "read_arrivals"]

FLUSH_S = 0.05  # the log reaches the file this long after a batch at most (while batches come)


@dataclass(frozen=True)
class Arrivals(Sink):
    """Discard records; log each batch's arrival time and size under ``path``."""

    path: str

    def open(self, index: int, parallelism: int) -> ArrivalsWriter:
        opened = time.time_ns()
        return ArrivalsWriter(Path(self.path) / f"sink-{index}-{os.getpid()}-{opened}.log")


class ArrivalsWriter(SinkWriter):
    def __init__(self, file: Path) -> None:
        file.parent.mkdir(parents=True, exist_ok=True)
        self._out = file.open("a", buffering=1 << 16)
        self._flush_at = 0.0

    def write(self, values: list) -> None:
        now = time.time()
        self._out.write(f"{now:.6f} {len(values)}\n")
        if now >= self._flush_at:
            self._out.flush()
            self._flush_at = now + FLUSH_S

    def close(self) -> None:
        self._out.close()


class Opened(NamedTuple):
    """One sink writer's log: its task, when it was opened, its batches (time, records)."""

    task: str
    opened: float
    batches: list[tuple[float, int]]


def read_arrivals(path: str | os.PathLike[str]) -> list[Opened]:
    """Every writer's log under ``path``, oldest writer first (a line still being written
    is left out)."""
    logs = []
    for file in Path(path).glob("sink-*.log"):
        _, index, _pid, opened = file.stem.split("-")
        batches = []
        for line in file.read_text().split("\n")[:-1]:  # the last is cut short, or empty
            t, _, n = line.partition(" ")
            batches.append((float(t), int(n)))
        logs.append(Opened(f"sink-{index}", int(opened) / 1e9, batches))
    return sorted(logs, key=lambda o: o.opened)
