"""The Redis Streams connectors against the machine's Redis: the connector contract
suites, decoding, dead letters, an unreachable server, discovery, a connection dropped
under a reader, and a word count job through the runtime with checkpoints; and against a
Redis of the test session's own with TLS and a password (tests/tls_servers.py): the
options passed through, and a wrong password or an untrusted certificate named."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from stream_servers import (
    JOB_WAIT_S,
    REDIS_URL,
    closed_port,
    lines,
    require,
    run_with_checkpoints,
    running_counts,
    unique,
    word_count,
)
from tls_servers import Pki, TlsServer, make_pki, running_redis

from connectors.redis import (
    RedisStreamReader,
    RedisStreamSink,
    RedisStreamSource,
    UndecodableEntryError,
)
from controlplane.abstraction import AssignResource, Plan
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.statuses import JobStatus
from controlplane.testing import BackgroundCluster
from runtime import Dataflow
from runtime.sources import PartitionedGenerator
from tests.connector_contract import (
    check_partitioned_source,
    check_two_phase_sink,
    drain,
)
from tests.faults_support import Events
from tests.jobs_for_tests import count, counts_reference, identity


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    require("127.0.0.1", 6379, "Redis")
    c = redis.Redis.from_url(REDIS_URL)
    created: list[str] = []
    c.created = created  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        for key in created:
            c.delete(key)
        for marker in c.scan_iter(match="streampilot:commit:sp-test-*"):
            c.delete(marker)
        c.close()


def stream(client: redis.Redis, records: list, field: str = "value") -> str:
    """A new stream holding ``records`` (JSON in ``field``), deleted after the test."""
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    with client.pipeline() as pipe:
        for r in records:
            pipe.xadd(key, {field: json.dumps(r)})
        pipe.execute()
    return key


def opened(sink: RedisStreamSink) -> Any:
    """Task 0's writer of ``sink``, in a job that takes checkpoints."""
    writer = sink.open(0, 1)
    writer.transactional()
    return writer


def read_stream(client: redis.Redis, key: str) -> list:
    return [json.loads(fields[b"value"]) for _, fields in client.xrange(key)]


def test_the_source_keeps_the_partitioned_source_contract(client: redis.Redis) -> None:
    expected = {}
    for p in range(3):
        records = [[p, i, f"r{i}"] for i in range(500 + 37 * p)]
        expected[stream(client, records)] = records
    source = RedisStreamSource(streams=tuple(expected), field="value", codec="json", bounded=True)
    check_partitioned_source(source, expected)


def test_the_sink_keeps_the_two_phase_contract(client: redis.Redis) -> None:
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    sink = RedisStreamSink(stream=key)
    check_two_phase_sink(lambda: sink.open(0, 1), lambda: read_stream(client, key))


def test_a_commit_after_the_restore_of_its_checkpoint_adds_nothing(client: redis.Redis) -> None:
    """The commit that a recovery's restore repeats, and epochs held over lost commits."""
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    sink = RedisStreamSink(stream=key, name=key)
    first = opened(sink)
    first.write(["a"])
    first.prepare(1)
    first.write(["b"])
    state = first.prepare(2)  # commit(1) was lost: checkpoint 2 holds both epochs
    assert [c for c, _ in state["epochs"]] == [1, 2]
    first.commit(2)
    first.abort()
    again = opened(sink)
    again.restore(state)  # the commit of 2 was done: nothing again
    again.commit(2)
    again.close()
    assert read_stream(client, key) == ["a", "b"]
    fresh = opened(sink)  # a new run of the job: its checkpoint ids start again
    fresh.write(["c"])
    fresh.prepare(1)
    fresh.commit(1)
    fresh.close()
    assert read_stream(client, key) == ["a", "b", "c"]


def test_a_moved_task_s_new_writer_adopts_its_epochs_under_its_identity(
    client: redis.Redis,
) -> None:
    """A sink task moved live: the old writer writes nothing, its new writer holds its
    epochs under the same identity (token, task index). A recovery to the checkpoint
    before the move writes each record once, and so does one to a checkpoint after it."""
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    sink = RedisStreamSink(stream=key, name=key)
    old = opened(sink)
    old.write(["a"])
    at_1 = old.prepare(1)  # checkpoint 1 completes, but its commit is lost
    old.write(["b"])
    state = old.hand_over(5, moving=True)  # the reconfiguration's barrier is 5
    old.abort()
    assert read_stream(client, key) == []  # the leaving writer wrote nothing
    new = opened(sink)
    new.adopt(state)
    new.write(["c"])
    at_7 = new.prepare(7)
    new.abort()  # a failure before checkpoint 7 completes: recovery to checkpoint 1
    recovered = opened(sink)
    recovered.restore(at_1)
    recovered.write(["b", "c"])  # the replay after checkpoint 1
    at_9 = recovered.prepare(9)
    recovered.commit(9)
    assert read_stream(client, key) == ["a", "b", "c"]
    recovered.abort()  # and a failure after 9 completed: its restore writes nothing more
    again = opened(sink)
    again.restore(at_9)
    again.close()
    assert read_stream(client, key) == ["a", "b", "c"]
    assert [c for c, _ in at_7["epochs"]] == [1, 5, 7]  # what the new writer held


def test_records_are_decoded_as_configured(client: redis.Redis) -> None:
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    client.xadd(key, {"text": "héllo", "n": "1"})
    client.xadd(key, {"text": b"\xff", "n": "2"})

    def read(limit: int = 1, **settings: object) -> list:
        reader = RedisStreamSource(streams=(key,), bounded=True, **settings).open_partition(key, 0)
        try:
            return drain(reader, limit)
        finally:
            reader.close()

    assert read() == [{"text": "héllo", "n": "1"}]
    assert read(field="text") == ["héllo"]
    assert read(field="n", codec="json") == [1]
    assert read(10, field="text", codec="bytes") == ["héllo".encode(), b"\xff"]
    with pytest.raises(ValueError, match=rf"stream '{key}', entry \d+-\d+: cannot decode"):
        read(10, field="text")
    with pytest.raises(ValueError, match=r"no field 'other'"):
        read(10, field="other")


def test_an_undecodable_entry_fails_the_read_naming_it_and_what_to_do(
    client: redis.Redis,
) -> None:
    key = unique("sp-test-")
    client.created.append(key)  # type: ignore[attr-defined]
    client.xadd(key, {"value": "1"})
    bad = client.xadd(key, {"value": b"{not json"}).decode()
    client.xadd(key, {"value": "3"})
    reader = RedisStreamSource(
        streams=(key,), field="value", codec="json", bounded=True
    ).open_partition(key, 0)
    try:
        assert reader.poll(0.0, 10) == ([1], [0.0])  # the entries before it first
        with pytest.raises(UndecodableEntryError) as failed:
            reader.poll(0.0, 10)
        assert reader.position() != bad  # not passed: a recovery reads it again
    finally:
        reader.close()
    message = str(failed.value)
    assert f"stream '{key}', entry {bad}: cannot decode field 'value' as json" in message
    assert "set dead_letter_stream" in message


def test_undecodable_entries_go_to_the_dead_letter_stream_naming_where_they_were(
    client: redis.Redis,
) -> None:
    key, dead = unique("sp-test-"), unique("sp-test-dead-")
    client.created += [key, dead]  # type: ignore[attr-defined]
    ids = [
        client.xadd(key, fields).decode()
        for fields in (
            {"value": "1"}, {"value": b"\xff"}, {"other": "2"}, {"value": "3"}, {"value": "["},
        )
    ]  # fmt: skip
    source = RedisStreamSource(
        streams=(key,),
        field="value",
        codec="json",
        bounded=True,
        dead_letter_stream=dead,
    )
    reader = source.open_partition(key, 0)
    try:
        assert drain(reader, 10) == [1, 3]
        assert reader.position() == ids[-1]  # past the dead letters
    finally:
        reader.close()
    letters = client.xrange(dead)
    assert [fields[b"streampilot-id"].decode() for _, fields in letters] == [ids[1], ids[2], ids[4]]
    raw = [{k: v for k, v in f.items() if not k.startswith(b"streampilot-")} for _, f in letters]
    assert raw == [{b"value": b"\xff"}, {b"other": b"2"}, {b"value": b"["}]
    for _, fields in letters:
        assert fields[b"streampilot-stream"] == key.encode()
        assert fields[b"streampilot-source"] == REDIS_URL.encode()
    errors = [fields[b"streampilot-error"].decode() for _, fields in letters]
    assert "cannot decode field 'value' as json" in errors[0]
    assert f"entry {ids[2]}: no field 'value'" in errors[1]


def test_a_dead_letter_stream_among_the_streams_read_is_refused() -> None:
    with pytest.raises(ValueError, match=r"dead_letter_stream 'in:dead' is one of the streams"):
        RedisStreamSource(pattern="in:*", dead_letter_stream="in:dead")
    with pytest.raises(ValueError, match=r"dead_letter_stream 'a' is one of the streams"):
        RedisStreamSource(streams=("a", "b"), dead_letter_stream="a")


def test_an_unreachable_redis_is_named_and_a_reader_of_it_retries() -> None:
    url = f"redis://user:secret@127.0.0.1:{closed_port()}/0"
    with pytest.raises(ConnectionError, match=r"cannot reach Redis at redis://user:\*\*\*@127"):
        RedisStreamSource(url=url, pattern="sp-test-*").partitions()
    with pytest.raises(ConnectionError, match=r"cannot reach Redis at redis://user:\*\*\*@127"):
        RedisStreamSource(url=url, streams=("s",)).partitions()
    reader = RedisStreamSource(url=url, streams=("s",)).open_partition("s", 0)
    try:
        assert reader.poll(0.0, 10) == ([], [])  # not an error: it retries
        assert reader.stalled is not None and "127.0.0.1" in reader.stalled
        assert "secret" not in reader.stalled
        assert reader.next_due(0.0) > 0.0
    finally:
        reader.close()


def test_discovery_finds_a_new_stream(client: redis.Redis) -> None:
    prefix = unique("sp-test-disc-")
    source = RedisStreamSource(pattern=f"{prefix}:*", discovery_interval_s=1.0)
    assert source.partitions() == []
    for name in ("b", "a"):
        client.created.append(f"{prefix}:{name}")  # type: ignore[attr-defined]
        client.xadd(f"{prefix}:{name}", {"value": "1"})
    client.set(f"{prefix}:not-a-stream", "x")
    client.created.append(f"{prefix}:not-a-stream")  # type: ignore[attr-defined]
    assert source.partitions() == [f"{prefix}:a", f"{prefix}:b"]


def test_a_connection_killed_under_a_reader_loses_and_repeats_nothing(
    client: redis.Redis,
) -> None:
    """The server drops the reader's connection (CLIENT KILL) halfway: it reads on from
    its last id on a new connection."""
    records = list(range(1000))
    key = stream(client, records)
    name = unique("sp-test-reader-")
    source = RedisStreamSource(
        streams=(key,), field="value", codec="json", bounded=True, options={"client_name": name}
    )
    reader = source.open_partition(key, 0)
    assert isinstance(reader, RedisStreamReader)
    try:
        got = drain(reader, 400)
        killed = client.client_kill_filter(_type="normal", skipme=True, user=None, _id=None,
                                           laddr=None, addr=_address_of(client, name))  # fmt: skip
        assert killed == 1
        got += drain(reader, 10_000)
    finally:
        reader.close()
    assert got == records


def _address_of(client: redis.Redis, name: str) -> str:
    (found,) = [c["addr"] for c in client.client_list() if c.get("name") == name]
    return found


@pytest.mark.slow
def test_a_word_count_from_redis_to_redis_is_exactly_the_reference(
    client: redis.Redis, tmp_path: Path
) -> None:
    inputs = {}
    for p in range(3):
        texts = lines(seed=p, count_=3000)
        key = unique("sp-test-lines-")
        client.created.append(key)  # type: ignore[attr-defined]
        with client.pipeline() as pipe:
            for text in texts:
                pipe.xadd(key, {"line": text})
            pipe.execute()
        inputs[key] = texts
    out = unique("sp-test-counts-")
    client.created.append(out)  # type: ignore[attr-defined]
    source = RedisStreamSource(streams=tuple(inputs), field="line", bounded=True)
    sink = RedisStreamSink(stream=out, name=out)
    graph = word_count(source, sink)
    assert run_with_checkpoints(str(tmp_path / "checkpoints"), graph) == JobStatus.FINISHED
    got = sorted(tuple(r) for r in read_stream(client, out))
    assert got == running_counts(t for texts in inputs.values() for t in texts)


def test_a_sink_task_moved_live_then_a_worker_killed_leaves_the_stream_exact(
    client: redis.Redis, faults: BackgroundCluster, fault_events: Events, tmp_path: Path
) -> None:
    """The sink's task 1 moves to the spare worker (its new writer adopts what it held),
    then a worker dies, likely before the next checkpoint: the recovery writes nothing
    twice and loses nothing."""
    out = unique("sp-test-counts-")
    client.created.append(out)  # type: ignore[attr-defined]
    source = PartitionedGenerator(records=30_000, rate=6_000, keys=150, seed=3, partitions_count=4)
    flow = Dataflow("moved_sink")
    counts = (
        flow.source("src", source, parallelism=2)
        .key_by(identity)
        .process("count", count, parallelism=2)
    )
    counts.sink("out", RedisStreamSink(stream=out, name=out), parallelism=2)
    co = faults.coordinator
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    job = faults.call(co.submit(flow.compile(), checkpoints=policy))
    fault_events.wait("a checkpoint", lambda: fault_events.completed(job.id) >= 1)
    spare = next(w.id for w in co.alive_workers() if w.id not in job.layout.workers_used())
    plan = Plan(job.abstraction.version, (AssignResource("out", "out-1", spare),))
    report = faults.call(co.apply_plan(job.id, plan))
    assert report.status == "completed", report.error
    os.kill(co.workers[job.layout.placement["count-0"]].pid, signal.SIGKILL)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    assert faults.wait(job, JOB_WAIT_S) == JobStatus.FINISHED, job.error
    want = counts_reference(source.open_partition(p, 0.0) for p in source.partitions())
    assert sorted(tuple(r) for r in read_stream(client, out)) == [tuple(r) for r in want]


# -- TLS and a password -------------------------------------------------------------------


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsServer, Pki]]:
    """A redis-server of the session's own: TLS only, a password (tests/tls_servers.py)."""
    directory = tmp_path_factory.mktemp("tls-redis")
    pki = make_pki(directory)
    with running_redis(directory, pki) as server:
        yield server, pki


def test_the_source_and_sink_work_through_tls_and_a_password(
    tls_redis: tuple[TlsServer, Pki],
) -> None:
    """The password in the URL (the sink) or in ``options`` (the source), the CA in
    ``options``: both go to redis-py as they are."""
    server, pki = tls_redis
    url = f"rediss://{server.address}"
    options = {"password": server.password, "ssl_ca_certs": pki.ca}
    key, out = unique("sp-test-"), unique("sp-test-out-")
    admin = redis.Redis.from_url(url, **options)
    try:
        for r in range(50):
            admin.xadd(key, {"value": json.dumps(r)})
        source = RedisStreamSource(
            url=url,
            pattern="sp-test-*",
            field="value",
            codec="json",
            bounded=True,
            options=options,
        )
        assert source.partitions() == [key]
        reader = source.open_partition(key, 0)
        try:
            assert drain(reader, 100) == list(range(50))
        finally:
            reader.close()
        sink = RedisStreamSink(
            url=f"rediss://default:{server.password}@{server.address}",
            stream=out,
            options={"ssl_ca_certs": pki.ca},
        )
        writer = opened(sink)
        writer.write(["a", "b"])
        writer.prepare(1)
        writer.commit(1)
        writer.close()
        assert read_stream(admin, out) == ["a", "b"]
    finally:
        admin.flushall()
        admin.close()


@pytest.mark.parametrize("fault", ["wrong password", "untrusted certificate"])
def test_a_wrong_password_or_an_untrusted_certificate_is_named_at_once(
    tls_redis: tuple[TlsServer, Pki], fault: str
) -> None:
    """The submission (``partitions``) and the sink's first write fail at once, naming
    the server and why; the password is not shown."""
    server, pki = tls_redis
    if fault == "wrong password":
        options = {"password": "not-the-password", "ssl_ca_certs": pki.ca}
        why = r"invalid username-password pair|WRONGPASS"
    else:
        options = {"password": server.password, "ssl_ca_certs": pki.other_ca}
        why = r"certificate verify failed"
    url = f"rediss://{server.address}"
    for source in (
        RedisStreamSource(url=url, streams=("s",), options=options),
        RedisStreamSource(url=url, pattern="s*", options=options),
    ):
        with pytest.raises(ConnectionError, match=rf"Redis at {url}.*({why})") as failed:
            source.partitions()
        assert "not-the-password" not in str(failed.value)
    writer = RedisStreamSink(url=url, stream="s", options=options).open(0, 1)
    try:
        with pytest.raises(OSError, match=rf"stream 's' at {url}.*({why})"):
            writer.write(["x"])
    finally:
        writer.abort()
