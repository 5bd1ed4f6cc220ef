"""The machine's Redis and NATS JetStream, for the connector tests: addresses, unique
names, and the word count job that runs through each broker end to end.

The servers are services of this machine (Redis on 127.0.0.1:6379, NATS with JetStream
on 127.0.0.1:4222); a test that cannot reach one is skipped, naming it. Every test uses
stream names of its own (:func:`unique`) and deletes them afterwards.
"""

from __future__ import annotations

import random
import secrets
import socket
from collections import Counter
from collections.abc import Iterable

import pytest
from jobs_for_tests import count, identity, split_words

from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.io import PartitionedSource, Sink

REDIS_URL = "redis://127.0.0.1:6379"
NATS_URL = "nats://127.0.0.1:4222"
JOB_WAIT_S = 120.0
WORDS = [f"w{i:02d}" for i in range(40)]


def unique(prefix: str) -> str:
    """A name no other test (or run) uses."""
    return f"{prefix}{secrets.token_hex(5)}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require(host: str, port: int, what: str) -> None:
    """Skip the test unless something listens on ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=2.0).close()
    except OSError as exc:
        pytest.skip(f"{what} is not running on {host}:{port}: {exc}")


def lines(seed: int, count_: int) -> list[str]:
    """``count_`` lines of 1 to 8 words of :data:`WORDS`, the same for a seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) for _ in range(count_)]


def running_counts(texts: Iterable[str]) -> list[tuple[str, int]]:
    """What the word count emits for ``texts``: each (word, its n-th occurrence) once."""
    seen = Counter(w for line in texts for w in line.split())
    return sorted((w, n) for w, c in seen.items() for n in range(1, c + 1))


def word_count(source: PartitionedSource, sink: Sink) -> JobGraph:
    flow = Dataflow(unique("broker_word_count_"))
    words = flow.source("lines", source, parallelism=2).flat_map("split", split_words)
    counts = words.key_by(identity).process("count", count, parallelism=2)
    counts.sink("out", sink, parallelism=2)
    return flow.compile()


def run_with_checkpoints(store: str, graph: JobGraph) -> str:
    """Run ``graph`` on a cluster of 2 workers taking checkpoints every 0.1 s; the job's
    final status (the cluster is closed before it returns)."""
    cluster = BackgroundCluster(workers=2, config=RuntimeConfig(checkpoint_store=store))
    try:
        policy = CheckpointPolicy(interval_s=0.1, timeout_s=60, retained=2)
        job = cluster.call(cluster.coordinator.submit(graph, checkpoints=policy))
        status = cluster.wait(job, JOB_WAIT_S)
        assert job.error is None, job.error
        return status
    finally:
        cluster.close()
