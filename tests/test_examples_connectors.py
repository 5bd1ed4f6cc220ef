"""The connector examples end to end on real brokers, with checkpoints: each example's
producer helper (run as its command) writes the seeded input to the broker, the job runs
bounded on a 3-worker cluster taking checkpoints, and the sink's contents are the
example's reference, every record once (the helper's ``check`` agrees).

- ``examples.stock_exchange_kafka``: orders in a 3-partition topic on ``tansu`` ->
  match -> trades in a PostgreSQL table (insert mode: a trade written twice would show).
- ``examples.wordcount_nats``: sentences on 3 subjects of a JetStream stream -> running
  counts in a Redis stream (one entry per word occurrence).

Every topic, stream, table, key and marker row a test makes is deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
import redis
from kafka_broker import Broker, running_tansu
from nats.js.errors import NotFoundError
from psycopg import sql
from stream_servers import NATS_URL, REDIS_URL, require, unique

from connectors.postgres import MARKER_TABLE
from connectors.redis import MARKER_PREFIX
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from examples import stock_exchange_kafka, wordcount, wordcount_nats
from tests.faults_support import WAIT_S, Events, submit

pytestmark = pytest.mark.slow

DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
ROOT = Path(__file__).resolve().parents[1]
HELPER_TIMEOUT_S = 120.0  # a producer helper's run (imports, a few thousand records)


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_tansu() as b:
        yield b


def helper(module: str, step: str, params: dict[str, Any]) -> subprocess.CompletedProcess:
    """``python -m <module> <step> -p NAME=VALUE...`` from the repository's root."""
    flags = [f"--param={name}={value}" for name, value in params.items()]
    return subprocess.run(
        [sys.executable, "-m", module, step, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HELPER_TIMEOUT_S,
    )


def run_bounded(cluster: BackgroundCluster, events: Events, graph: Any) -> None:
    """Run ``graph`` on two of the cluster's workers with checkpoints (every 0.2 s) until
    it finishes; at least one checkpoint completes meanwhile."""
    job = submit(cluster, graph, [w.id for w in cluster.coordinator.alive_workers()[:2]])
    assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
    assert events.completed(job.id) >= 1


def test_the_examples_are_registered_as_jobs() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"]["streampilot.jobs"]
    assert declared["stock-exchange-kafka"] == "examples.stock_exchange_kafka:build"
    assert declared["wordcount-nats"] == "examples.wordcount_nats:build"


def test_the_stock_exchange_from_kafka_to_postgresql_gives_the_reference_trades(
    broker: Broker, faults: BackgroundCluster, fault_events: Events
) -> None:
    require("127.0.0.1", 5432, "PostgreSQL")
    table = unique("sp_test_trades_")
    params = {
        "bootstrap_servers": broker.bootstrap,
        "topic": unique("orders-"),
        "partitions": 3,
        "dsn": DSN,
        "table": table,
        "records": 6_000,
        "keys": 40,
        "seed": 7,
        "work_us": 300,  # the run lasts a few checkpoint intervals
        "bounded": True,
    }
    try:
        produced = helper("examples.stock_exchange_kafka", "produce", params)
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout.strip() == "6000 orders produced"
        run_bounded(faults, fault_events, stock_exchange_kafka.build(params).compile())
        want = stock_exchange_kafka.reference(params)
        assert len(want) > 1_000
        assert stock_exchange_kafka.read_trades(params) == want
        checked = helper("examples.stock_exchange_kafka", "check", params)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        again = helper("examples.stock_exchange_kafka", "produce", params)
        assert again.returncode != 0 and "already holds records" in again.stderr
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
            if conn.execute("SELECT to_regclass(%s)", (MARKER_TABLE,)).fetchone() != (None,):
                conn.execute(f"DELETE FROM {MARKER_TABLE} WHERE sink = %s", (table,))


async def _delete_stream(name: str) -> None:
    client = await nats.connect(NATS_URL)
    try:
        await client.jetstream().delete_stream(name)
    finally:
        await client.close()


def test_the_word_count_from_jetstream_to_redis_gives_the_reference_counts(
    faults: BackgroundCluster, fault_events: Events
) -> None:
    require("127.0.0.1", 4222, "NATS")
    require("127.0.0.1", 6379, "Redis")
    output = unique("sp-test-word-counts-")
    params = {
        "servers": NATS_URL,
        "stream": unique("SP_TEST_SENTENCES_"),
        "subject": unique("sp-test-sentences-"),
        "partitions": 3,
        "redis_url": REDIS_URL,
        "output": output,
        "records": 12_000,  # about 100,000 words: the run lasts a few checkpoint intervals
        "keys": 300,
        "seed": 11,
        "bounded": True,
    }
    client = redis.Redis.from_url(REDIS_URL)
    try:
        produced = helper("examples.wordcount_nats", "produce", params)
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout.strip() == "12000 sentences published"
        run_bounded(faults, fault_events, wordcount_nats.build(params).compile())
        totals = wordcount_nats.reference(params)
        assert totals == wordcount.reference({"records": 12_000, "keys": 300, "seed": 11})
        assert wordcount_nats.read_counts(params) == sorted(
            (w, n) for w, total in totals.items() for n in range(1, total + 1)
        )
        assert wordcount_nats.read_results(params) == totals
        checked = helper("examples.wordcount_nats", "check", params)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        with contextlib.suppress(NotFoundError):  # the helper failed before making it
            asyncio.run(_delete_stream(str(params["stream"])))
        client.delete(output)
        for marker in client.scan_iter(match=f"{MARKER_PREFIX}:{output}:*"):
            client.delete(marker)
        client.close()
