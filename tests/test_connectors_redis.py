"""The Redis Streams connectors against the machine's Redis: the connector contract
suites, decoding, an unreachable server, discovery, a connection dropped under a
reader, and a word count job through the runtime with checkpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from stream_servers import (
    REDIS_URL,
    closed_port,
    lines,
    require,
    run_with_checkpoints,
    running_counts,
    unique,
    word_count,
)

from connectors.redis import RedisStreamReader, RedisStreamSink, RedisStreamSource
from controlplane.statuses import JobStatus
from tests.connector_contract import (
    check_partitioned_source,
    check_two_phase_sink,
    drain,
)


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
    first = sink.open(0, 1)
    first.transactional()
    first.write(["a"])
    first.prepare(1)
    first.write(["b"])
    state = first.prepare(2)  # commit(1) was lost: checkpoint 2 holds both epochs
    assert [c for c, _ in state["epochs"]] == [1, 2]
    first.commit(2)
    first.abort()
    again = sink.open(0, 1)
    again.transactional()
    again.restore(state)  # the commit of 2 was done: nothing again
    again.commit(2)
    again.close()
    assert read_stream(client, key) == ["a", "b"]
    fresh = sink.open(0, 1)  # a new run of the job: its checkpoint ids start again
    fresh.transactional()
    fresh.write(["c"])
    fresh.prepare(1)
    fresh.commit(1)
    fresh.close()
    assert read_stream(client, key) == ["a", "b", "c"]


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
