"""The PostgreSQL connectors against the machine's PostgreSQL: the connector contract
suites, the split of a table in key ranges, upsert mode, what errors say, an
unreachable server, and word counts through the runtime with checkpoints, one of them
with a worker SIGKILLed mid-run.

Every test writes tables of its own (``sp_test_<hex>``), dropped afterwards with the
marker rows of its sinks (the marker table itself stays: writers create it if missing).
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jobs_for_tests import count, identity
from psycopg import sql
from stream_servers import (
    closed_port,
    lines,
    require,
    run_with_checkpoints,
    unique,
    word_count,
)

from connectors.postgres import MARKER_TABLE, PostgresSink, PostgresTableSource
from controlplane.coordinator import RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.sources import PartitionedGenerator
from tests.connector_contract import check_partitioned_source, check_two_phase_sink, drain
from tests.faults_support import WAIT_S, Events, listening

DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
TERMINATE_WAIT_MS = 30_000  # a terminated backend has exited by then
RECONNECT_WAIT_S = 30.0  # a reader backing off after a lost connection reads again by then


class Database:
    """A connection to the test database and the tables a test made."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(DSN, autocommit=True)
        self.tables: list[str] = []

    def table(self, columns: str, rows: Sequence[tuple] = ()) -> str:
        """A new table ``(columns)`` holding ``rows``, dropped after the test."""
        name = unique("sp_test_")
        self.tables.append(name)
        self.conn.execute(
            sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(name), sql.SQL(columns))
        )
        if rows:
            with self.conn.cursor().copy(
                sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(name))
            ) as cp:
                for row in rows:
                    cp.write_row(row)
        return name

    def rows(self, table: str, columns: str = "*") -> list[tuple]:
        query = sql.SQL("SELECT {} FROM {}").format(sql.SQL(columns), sql.Identifier(table))
        return sorted(self.conn.execute(query).fetchall())

    def marker(self, sink: str, task: int = 0) -> tuple | None:
        return self.conn.execute(
            f"SELECT token, checkpoint FROM {MARKER_TABLE} WHERE sink = %s AND task = %s",
            (sink, task),
        ).fetchone()

    def close(self) -> None:
        for name in self.tables:
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        if self.conn.execute("SELECT to_regclass(%s)", (MARKER_TABLE,)).fetchone() != (None,):
            self.conn.execute(f"DELETE FROM {MARKER_TABLE} WHERE sink LIKE %s", ("sp_test_%",))
        self.conn.close()


@pytest.fixture
def db() -> Iterator[Database]:
    require("127.0.0.1", 5432, "PostgreSQL")
    d = Database()
    try:
        yield d
    finally:
        d.close()


def single(value: Any) -> tuple:
    return (value,)


def line_of(row: dict[str, Any]) -> str:
    return row["line"]


def key_range(name: str) -> tuple[int, int]:
    lo, hi = name.rpartition("[")[2].rstrip(")").split(",")
    return int(lo), int(hi)


# -- the source ----------------------------------------------------------------------------


def test_the_source_keeps_the_partitioned_source_contract(db: Database) -> None:
    rows = [(7 * i - 50, f"r{i}", i % 5) for i in range(1000)]  # gaps, negative keys
    table = db.table("id bigint PRIMARY KEY, word text, n int", rows)
    source = PostgresTableSource(dsn=DSN, table=table, key="id", partitions_count=3, page=64)
    names = source.partitions()
    ranges = [key_range(n) for n in names]
    assert ranges[0][0] == -50 and ranges[-1][1] == 7 * 999 - 50 + 1
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous
    expected = {
        name: [{"id": k, "word": w, "n": n} for k, w, n in rows if lo <= k < hi]
        for name, (lo, hi) in zip(names, ranges, strict=True)
    }
    assert all(len(r) > 300 for r in expected.values())
    check_partitioned_source(source, expected)


def test_the_split_is_fixed_by_the_names_and_records_are_shaped_as_asked(db: Database) -> None:
    empty = db.table("id int PRIMARY KEY")
    assert PostgresTableSource(dsn=DSN, table=empty, key="id").partitions() == []
    table = db.table("id int PRIMARY KEY, line text, other text", [(5, "a b", "x"), (6, "c", "y")])
    source = PostgresTableSource(
        dsn=DSN, table=table, key="id", partitions_count=4, columns=("line",), row=line_of
    )
    assert source.partitions() == [f"{table}[5,6)", f"{table}[6,7)"]  # no empty range
    assert source.partitions() == source.partitions()
    reader = source.open_partition(f"{table}[5,7)", 0.0)  # a range the name says
    try:
        assert drain(reader, 10) == ["a b", "c"] and reader.position() == 6
        assert reader.poll(0.0, 10) is None
    finally:
        reader.close()
    with pytest.raises(ValueError, match=rf"of table '{table}' has no partition 'other\[0,1\)'"):
        source.open_partition("other[0,1)", 0.0)


def test_a_source_over_a_table_it_cannot_page_says_what_to_fix(db: Database) -> None:
    missing = unique("sp_test_")
    with pytest.raises(
        ValueError, match=rf"table '{missing}' does not exist in 127.0.0.1:5432/test"
    ):
        PostgresTableSource(dsn=DSN, table=missing, key="id").partitions()
    text_key = db.table("id text PRIMARY KEY", [("a",)])
    with pytest.raises(
        ValueError, match=r"column 'id' holds str values: the key must be an integer"
    ):
        PostgresTableSource(dsn=DSN, table=text_key, key="id").partitions()
    not_unique = db.table("id int, v text", [(1, "a"), (1, "b")])
    with pytest.raises(ValueError, match=r"column 'id' is not unique"):
        PostgresTableSource(dsn=DSN, table=not_unique, key="id").partitions()
    with pytest.raises(ValueError, match=r"has no column 'nope' \(it has id, v\): fix"):
        PostgresTableSource(dsn=DSN, table=not_unique, key="nope").partitions()
    with pytest.raises(ValueError, match=r"partitions_count must be an integer >= 1"):
        PostgresTableSource(dsn=DSN, table="t", key="id", partitions_count=0)


def test_an_unreachable_postgres_is_named_and_a_reader_of_it_retries() -> None:
    port = closed_port()
    dsn = f"host=127.0.0.1 port={port} user=postgres password=secret dbname=test"
    source = PostgresTableSource(dsn=dsn, table="t", key="id")
    with pytest.raises(
        ConnectionError, match=rf"cannot reach PostgreSQL at 127.0.0.1:{port}/test"
    ) as e:
        source.partitions()
    assert "secret" not in str(e.value)
    url = f"postgresql://postgres:secret@127.0.0.1:{port}/test"
    with pytest.raises(ConnectionError, match=rf"127.0.0.1:{port}/test") as e:
        PostgresTableSource(dsn=url, table="t", key="id").partitions()
    assert "secret" not in str(e.value)
    reader = source.open_partition("t[0,10)", 0.0)
    try:
        assert reader.poll(0.0, 10) == ([], [])  # not an error: it retries
        assert reader.stalled is not None and f"127.0.0.1:{port}" in reader.stalled
        assert "secret" not in reader.stalled
        assert reader.next_due(0.0) > 0.0
    finally:
        reader.close()


def terminate(db: Database, application: str) -> None:
    """The server ends the connection of ``application``, returning once its backend has
    exited (or failing after ``TERMINATE_WAIT_MS``)."""
    ended = db.conn.execute(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %s)) FROM pg_stat_activity"
        " WHERE application_name = %s",
        (TERMINATE_WAIT_MS, application),
    ).fetchone()
    assert ended == (1,), ended


def test_a_connection_killed_under_a_reader_loses_and_repeats_nothing(db: Database) -> None:
    """The server ends the reader's connection halfway: it reads on after its last key on
    a new connection."""
    table = db.table("id int PRIMARY KEY, v int", [(i, i * i) for i in range(1000)])
    application = unique("sp_test_reader_")
    source = PostgresTableSource(
        dsn=f"{DSN} application_name={application}", table=table, key="id", page=100
    )
    (partition,) = PostgresTableSource(
        dsn=DSN, table=table, key="id", partitions_count=1
    ).partitions()
    reader = source.open_partition(partition, 0.0)
    try:
        got = drain(reader, 400)
        terminate(db, application)
        polled = reader.poll(0.0, 100)  # the page that finds the connection gone
        assert polled == ([], []) and reader.stalled is not None
        deadline = time.monotonic() + RECONNECT_WAIT_S
        while (polled := reader.poll(0.0, 100)) == ([], []):  # backing off, then reconnected
            assert time.monotonic() < deadline, reader.stalled
        got += polled[0] + drain(reader, 10_000)
        assert reader.stalled is None
    finally:
        reader.close()
    assert [r["id"] for r in got] == list(range(1000))


# -- the sink ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_the_sink_keeps_the_two_phase_contract(db: Database, mode: str) -> None:
    table = db.table("v text PRIMARY KEY")
    key = ("v",) if mode == "upsert" else ()
    sink = PostgresSink(dsn=DSN, table=table, columns=("v",), row=single, mode=mode, key=key)
    check_two_phase_sink(lambda: sink.open(0, 1), lambda: [v for (v,) in db.rows(table)])


def test_a_commit_after_the_restore_of_its_checkpoint_writes_nothing(db: Database) -> None:
    """The commit that a recovery's restore repeats, epochs held over lost commits, and a
    new run of the job (checkpoint ids from 1 again) that is not taken for a repeat."""
    table = db.table("v text")
    sink = PostgresSink(dsn=DSN, table=table, columns=("v",), row=single)
    first = sink.open(0, 1)
    first.transactional()
    first.write(["a"])
    first.prepare(1)
    first.write(["b"])
    state = first.prepare(2)  # commit(1) was lost: checkpoint 2 holds both epochs
    assert [c for c, _ in state["epochs"]] == [1, 2]
    first.commit(2)
    first.abort()
    assert db.marker(table) == (state["token"], 2)
    again = sink.open(0, 1)
    again.transactional()
    again.restore(state)  # the commit of 2 was done: nothing again
    again.commit(2)
    again.close()
    assert db.rows(table) == [("a",), ("b",)]
    fresh = sink.open(0, 1)
    fresh.transactional()
    fresh.write(["c"])
    fresh.prepare(1)
    fresh.commit(1)
    fresh.close()
    assert db.rows(table) == [("a",), ("b",), ("c",)]


def test_upsert_leaves_the_latest_row_per_key(db: Database) -> None:
    table = db.table("word text, part int, n bigint NOT NULL, PRIMARY KEY (word, part)")
    sink = PostgresSink(
        dsn=DSN, table=table, columns=("word", "part", "n"), mode="upsert", key=("word", "part")
    )
    w = sink.open(0, 1)
    w.transactional()
    w.write([("a", 1, 1), {"word": "b", "part": 1, "n": 1}, ("a", 1, 2), ("a", 2, 1)])
    w.write([["a", 1, 3]])
    state = w.prepare(1)
    assert [len(rows) for _c, rows in state["epochs"]] == [3]  # one row per key held
    w.write([("b", 1, 2), ("b", 1, 3)])
    w.prepare(2)
    w.commit(2)
    assert db.rows(table) == [("a", 1, 3), ("a", 2, 1), ("b", 1, 3)]
    w.close()
    plain = sink.open(1, 2)  # without checkpoints: each batch written at once
    plain.write([("a", 1, 10), ("c", 1, 1), ("a", 1, 11)])
    assert db.rows(table) == [("a", 1, 11), ("a", 2, 1), ("b", 1, 3), ("c", 1, 1)]
    plain.close()


def test_a_commit_that_loses_its_connection_fails_and_the_next_writes_it_once(
    db: Database,
) -> None:
    table = db.table("v text")
    application = unique("sp_test_writer_")
    sink = PostgresSink(
        dsn=f"{DSN} application_name={application}",
        table=table,
        columns=("v",),
        row=single,
        name=table,
    )
    w = sink.open(0, 1)
    w.transactional()
    w.write(["a"])  # reaches the server: the table is checked
    w.prepare(1)
    w.commit(1)
    terminate(db, application)
    w.write(["b"])
    w.prepare(2)
    with pytest.raises(
        OSError, match=rf"cannot write to PostgreSQL table '{table}' at 127.0.0.1:5432/test"
    ):
        w.commit(2)
    w.write(["c"])
    w.prepare(3)
    w.commit(3)  # a new connection: epochs 2 and 3 in one transaction
    w.close()
    assert db.rows(table) == [("a",), ("b",), ("c",)]
    assert db.marker(table) == (w.token, 3)


def test_without_checkpoints_rows_are_visible_as_they_are_written(db: Database) -> None:
    table = db.table("word text, n int")
    w = PostgresSink(dsn=DSN, table=table, columns=("word", "n")).open(0, 1)
    try:
        w.write([("a", 1), ("a", 1)])
        assert db.rows(table) == [("a", 1), ("a", 1)]
        w.write([{"n": 2, "word": "b", "extra": 0}])
        assert db.rows(table) == [("a", 1), ("a", 1), ("b", 2)]
    finally:
        w.close()


def test_a_table_that_cannot_take_the_rows_is_refused_at_the_first_write(db: Database) -> None:
    table = db.table("word varchar(3) PRIMARY KEY, n int NOT NULL, note text")

    def first_write(**settings: Any) -> None:
        fields = {"dsn": DSN, "table": table, "columns": ("word", "n"), **settings}
        writer = PostgresSink(**fields).open(0, 1)
        try:
            writer.write([("a", 1)])
        finally:
            writer.abort()

    missing = unique("sp_test_")
    with pytest.raises(
        ValueError,
        match=rf"table '{missing}' does not exist in 127.0.0.1:5432/"
        r"test: create it \(with columns word, n\) or fix PostgresSink.table",
    ):
        first_write(table=missing)
    with pytest.raises(
        ValueError,
        match=rf"table '{table}' has no column 'count' \(it has word, "
        r"n, note\): fix PostgresSink.columns or add the column",
    ):
        first_write(columns=("word", "count"))
    with pytest.raises(
        ValueError,
        match=rf"table '{table}', column 'n' is NOT NULL without a "
        r"default, and is not written: add it to PostgresSink.columns",
    ):
        first_write(columns=("word", "note"))
    no_key = db.table("word text, n int")
    with pytest.raises(
        ValueError,
        match=rf"table '{no_key}' has no primary key or unique "
        r"constraint on \(word\), which the upsert's ON CONFLICT needs",
    ):
        first_write(table=no_key, mode="upsert", key=("word",))
    with pytest.raises(ValueError, match=r"PostgresSink.key must name the upsert's conflict"):
        PostgresSink(dsn=DSN, table=table, columns=("word", "n"), mode="upsert")
    with pytest.raises(ValueError, match=r"PostgresSink.dsn is not a libpq connection string"):
        PostgresSink(dsn="host=a password=se cret", table=table, columns=("word",))


def test_a_row_the_table_refuses_names_the_column_and_says_what_to_fix(db: Database) -> None:
    table = db.table("word varchar(3) PRIMARY KEY, n int NOT NULL, note text")
    sink = PostgresSink(dsn=DSN, table=table, columns=("word", "n"))
    w = sink.open(0, 1)
    w.transactional()
    with pytest.raises(
        ValueError,
        match=r"must make a row of 2 values for columns \('word', "
        r"'n'\), got \('a',\): fix the records or PostgresSink.row",
    ):
        w.write([("a",)])
    with pytest.raises(ValueError, match=r"has no column 'n': give every record the columns"):
        w.write([{"word": "a"}])
    with pytest.raises(
        ValueError,
        match=rf"table '{table}', column 'n' is NOT NULL, but a row "
        r"gives it None",
    ):
        w.write([("a", None)])
    w.write([("ok", 1), ("long", 2)])  # too long for varchar(3): refused at the commit
    w.prepare(1)
    with pytest.raises(
        ValueError,
        match=rf"table '{table}', column 'word' \(row 2 of the batch\)"
        r" at 127.0.0.1:5432/test: value too long .*: fix the records",
    ):
        w.commit(1)
    assert db.rows(table) == []  # nothing of the refused transaction
    w.abort()
    w = sink.open(0, 1)
    w.write([("a", 1)])
    with pytest.raises(
        ValueError,
        match=rf"table '{table}'.*duplicate key .*: write each key "
        r"once, or use mode='upsert'",
    ):
        w.write([("a", 2)])
    w.close()
    w = PostgresSink(
        dsn=DSN, table=table, columns=("word", "n"), mode="upsert", key=("word",)
    ).open(0, 1)
    with pytest.raises(ValueError, match=r"column 'word' \(row 1 of the batch\)"):
        w.write([("long", 3)])
    w.write([("a", 3)])  # the staging table outlives a refused batch
    w.close()
    assert db.rows(table, "word, n") == [("a", 3)]


def test_an_unreachable_postgres_fails_a_write_naming_it() -> None:
    port = closed_port()
    dsn = f"postgresql://postgres:secret@127.0.0.1:{port}/test"
    w = PostgresSink(dsn=dsn, table="t", columns=("v",), row=single).open(0, 1)
    with pytest.raises(
        OSError, match=rf"cannot reach PostgreSQL table 't' at 127.0.0.1:{port}/test"
    ) as e:
        w.write(["a"])
    assert "secret" not in str(e.value)
    w.abort()
    w = PostgresSink(dsn=dsn, table="t", columns=("v",), row=single).open(0, 1)
    w.transactional()
    w.write(["a"])  # checkpointed: nothing is written before the commit
    w.prepare(1)
    with pytest.raises(OSError, match=rf"127.0.0.1:{port}/test"):
        w.commit(1)
    w.abort()


# -- through the runtime -------------------------------------------------------------------


@pytest.mark.slow
def test_a_word_count_from_a_table_to_a_table_is_exactly_the_reference(
    db: Database, tmp_path: Path, no_leftover_processes: None
) -> None:
    texts = lines(seed=5, count_=6000)
    source_table = db.table("id bigint PRIMARY KEY, line text", list(enumerate(texts)))
    counts = db.table("word text PRIMARY KEY, n bigint NOT NULL")
    source = PostgresTableSource(dsn=DSN, table=source_table, key="id", row=line_of, page=500)
    sink = PostgresSink(
        dsn=DSN, table=counts, columns=("word", "n"), mode="upsert", key=("word",), name=counts
    )
    status = run_with_checkpoints(str(tmp_path / "checkpoints"), word_count(source, sink))
    assert status == JobStatus.FINISHED
    reference = Counter(w for text in texts for w in text.split())
    assert db.rows(counts) == sorted(reference.items())


GENERATOR = PartitionedGenerator(records=30_000, rate=6_000, keys=300, seed=23, partitions_count=4)


def generated_counts() -> Counter:
    seen: Counter = Counter()
    for partition in GENERATOR.partitions():
        reader = GENERATOR.open_partition(partition, 0.0)
        while (polled := reader.poll(1e12, 4096)) is not None:
            seen.update(polled[0])
        reader.close()
    return seen


@pytest.mark.slow
def test_a_worker_killed_mid_run_leaves_the_tables_exactly_the_reference(
    db: Database, tmp_path: Path, no_leftover_processes: None
) -> None:
    """Running counts go to two tables: upserted (the latest count per key) and inserted
    (every count, so that a row written twice would show). A worker dies after two
    checkpoints; the job recovers and both tables are exact."""
    latest = db.table("key text PRIMARY KEY, n bigint NOT NULL")
    every = db.table("key text, n bigint NOT NULL")
    flow = Dataflow(unique("pg_killed_counts_"))
    src = flow.source("src", GENERATOR, parallelism=2)
    counted = src.key_by(identity).process("count", count, parallelism=2)
    counted.sink(
        "latest",
        PostgresSink(dsn=DSN, table=latest, columns=("key", "n"), mode="upsert", key=("key",)),
        parallelism=2,
    )
    counted.sink("every", PostgresSink(dsn=DSN, table=every, columns=("key", "n")), parallelism=2)
    cluster = BackgroundCluster(workers=2, config=RuntimeConfig(checkpoint_store=str(tmp_path)))
    try:
        with listening(cluster, Events()) as events:
            policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
            job = cluster.call(cluster.coordinator.submit(flow.compile(), checkpoints=policy))
            events.wait("2 completed checkpoints", lambda: events.completed(job.id) >= 2)
            victim = job.layout.placement["latest-1"]
            os.kill(cluster.coordinator.workers[victim].pid, signal.SIGKILL)
            events.wait("a recovery", lambda: bool(events.recoveries))
            assert cluster.wait(job, WAIT_S) == JobStatus.FINISHED, job.error
        assert victim in events.recoveries[0][0].plan["lost_workers"]
    finally:
        cluster.close()
    reference = generated_counts()
    assert db.rows(latest) == sorted(reference.items())
    assert db.rows(every) == sorted((k, n) for k, c in reference.items() for n in range(1, c + 1))
