"""The NATS JetStream connectors against the machine's NATS server: the connector
contract suites, decoding, dead letters, an unreachable server, discovery, a consumer
deleted and a connection dropped under a reader, and a word count job through the
runtime with checkpoints; and against a nats-server of the test session's own with TLS
and a user and password (tests/tls_servers.py): the options passed through, and a wrong
password or an untrusted certificate named."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from stream_servers import (
    NATS_URL,
    closed_port,
    lines,
    require,
    run_with_checkpoints,
    running_counts,
    unique,
    word_count,
)
from tls_servers import Pki, TlsServer, make_pki, running_nats

from connectors.nats import (
    IoLoop,
    JetStreamReader,
    JetStreamSink,
    JetStreamSource,
    UndecodableMessageError,
)
from controlplane.statuses import JobStatus
from tests.connector_contract import check_partitioned_source, check_two_phase_sink, drain

WAIT_S = 10.0  # longest a reader may take to have fetched what the stream holds


def wait_poll(reader: Any) -> Any:
    """A poll of one record (``drain`` counts records only between polls) that first
    waits (bounded) until the reader (or, for a task's set, one of its partitions'
    readers) has something to give."""
    polled = reader.poll(1e12, 1)
    if polled is not None and not polled[0]:
        readers = [reader] if isinstance(reader, JetStreamReader) else reader._readers.values()
        for r in readers:  # a set's reader is empty only if each of its readers is
            r.wait(WAIT_S)
        polled = reader.poll(1e12, 1)
    return polled


async def _js(question: Callable[[Any], Any]) -> Any:
    nc = await nats.connect(NATS_URL)
    try:
        return await question(nc.jetstream())
    finally:
        await nc.close()


def js(question: Callable[[Any], Any]) -> Any:
    """``await question(jetstream)`` on a connection of the test's own."""
    return asyncio.run(_js(question))


class Stream:
    """A JetStream stream of the test's own capturing ``<name>.>``, deleted afterwards."""

    def __init__(self, duplicate_window: float = 120.0) -> None:
        self.name = unique("SP_TEST_")

        async def create(j: Any) -> None:
            await j.add_stream(
                name=self.name, subjects=[f"{self.name}.>"], duplicate_window=duplicate_window
            )

        js(create)

    def subject(self, part: str) -> str:
        return f"{self.name}.{part}"

    def publish(self, subject: str, payloads: list[bytes]) -> None:
        async def publish(j: Any) -> None:
            for p in payloads:
                await j.publish(subject, p)

        js(publish)

    def read(self, subject: str) -> list[Any]:
        """The JSON payloads of ``subject``, in stream order."""

        async def read(j: Any) -> list[Any]:
            info = await j.stream_info(self.name)
            if not info.state.messages:
                return []
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await j.get_msg(self.name, seq)
                if msg.subject == subject:
                    out.append(json.loads(msg.data))
            return out

        return js(read)

    def consumers(self) -> list[str]:
        async def names(j: Any) -> list[str]:
            return [c.name for c in await j.consumers_info(self.name)]

        return js(names)

    def delete_consumers(self) -> int:
        async def delete(j: Any) -> int:
            consumers = await j.consumers_info(self.name)
            for c in consumers:
                await j.delete_consumer(self.name, c.name)
            return len(consumers)

        return js(delete)

    def delete(self) -> None:
        js(lambda j: j.delete_stream(self.name))


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    require("127.0.0.1", 4222, "NATS")
    made: list[Stream] = []

    def make(**settings: Any) -> Stream:
        made.append(Stream(**settings))
        return made[-1]

    yield make
    for s in made:
        s.delete()
    assert not any(t.name == "nats-io" for t in threading.enumerate()), "IoLoop left running"


def test_the_source_keeps_the_partitioned_source_contract(streams: Callable[..., Stream]) -> None:
    s = streams()
    expected = {}
    for p in range(3):
        records = [[p, i] for i in range(300 + 41 * p)]
        s.publish(s.subject(f"p{p}"), [json.dumps(r).encode() for r in records])
        expected[s.subject(f"p{p}")] = records
    source = JetStreamSource(servers=NATS_URL, stream=s.name, codec="json", bounded=True)
    check_partitioned_source(source, expected, poll=wait_poll)
    assert s.consumers() == [], "a reader left its consumer behind"


def test_the_sink_keeps_the_two_phase_contract(streams: Callable[..., Stream]) -> None:
    s = streams()
    sink = JetStreamSink(servers=NATS_URL, subject=s.subject("out"), stream=s.name)
    check_two_phase_sink(lambda: sink.open(0, 1), lambda: s.read(s.subject("out")))


def test_a_commit_repeated_by_a_restore_is_dropped_as_a_duplicate(
    streams: Callable[..., Stream],
) -> None:
    s = streams()
    sink = JetStreamSink(servers=NATS_URL, subject=s.subject("out"))
    first = sink.open(0, 1)
    first.transactional()
    first.write(["a", "b"])
    state = first.prepare(1)
    first.commit(1)
    first.abort()
    again = sink.open(0, 1)
    again.transactional()
    again.restore(state)  # within the duplicate window: the server drops them
    again.close()
    assert s.read(s.subject("out")) == ["a", "b"]


def test_records_are_decoded_as_configured(streams: Callable[..., Stream]) -> None:
    s = streams()
    subject = s.subject("x")
    s.publish(subject, ["héllo".encode(), b"\xff"])

    def read(codec: str, limit: int) -> list:
        source = JetStreamSource(servers=NATS_URL, stream=s.name, codec=codec, bounded=True)
        reader = source.open_partition(subject, 0)
        try:
            return drain(reader, limit, wait_poll)
        finally:
            reader.close()

    assert read("bytes", 10) == ["héllo".encode(), b"\xff"]
    assert read("utf-8", 1) == ["héllo"]
    with pytest.raises(ValueError, match=rf"subject '{subject}', sequence 2: cannot decode"):
        read("utf-8", 10)


def raw_messages(s: Stream, subject: str) -> list[Any]:
    """The messages of ``subject`` in ``s`` as stored (payload and headers)."""

    async def read(j: Any) -> list[Any]:
        info = await j.stream_info(s.name)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await j.get_msg(s.name, seq)
            if msg.subject == subject:
                found.append(msg)
        return found

    return js(read)


def test_an_undecodable_message_fails_the_read_naming_it_and_what_to_do(
    streams: Callable[..., Stream],
) -> None:
    s = streams()
    subject = s.subject("x")
    s.publish(subject, [b"a", b"\xff", b"c"])
    reader = JetStreamSource(servers=NATS_URL, stream=s.name, bounded=True).open_partition(
        subject, 0
    )
    try:
        assert drain(reader, 1, wait_poll) == ["a"]  # the records before it first
        with pytest.raises(UndecodableMessageError) as failed:
            drain(reader, 10, wait_poll)
        assert reader.position() == 1  # not passed: a recovery reads it again
    finally:
        reader.close()
    message = str(failed.value)
    assert f"subject '{subject}', sequence 2: cannot decode as utf-8" in message
    assert "set dead_letter_subject" in message


def test_undecodable_messages_go_to_the_dead_letter_subject_naming_where_they_were(
    streams: Callable[..., Stream],
) -> None:
    s = streams()
    subject, dead = s.subject("x"), s.subject("dead")
    s.publish(subject, [b"1", b"{no", b"3", b"\xff"])
    source = JetStreamSource(
        servers=NATS_URL, stream=s.name, codec="json", bounded=True, dead_letter_subject=dead
    )
    assert source.partitions() == [subject]  # the dead letters are not a partition
    reader = source.open_partition(subject, 0)
    try:
        assert drain(reader, 10, wait_poll) == [1, 3]
        assert reader.position() == 4  # past the dead letters
    finally:
        reader.close()
    letters = raw_messages(s, dead)
    assert [m.data for m in letters] == [b"{no", b"\xff"]
    assert [m.headers["Streampilot-Sequence"] for m in letters] == ["2", "4"]
    for m in letters:
        assert m.headers["Streampilot-Stream"] == s.name
        assert m.headers["Streampilot-Subject"] == subject
    assert "cannot decode as json" in letters[0].headers["Streampilot-Error"]
    again = source.open_partition(subject, 0)  # a recovery to before them, within the window
    try:
        assert drain(again, 10, wait_poll) == [1, 3]
    finally:
        again.close()
    assert len(raw_messages(s, dead)) == 2, "a dead letter sent again was not dropped"


def test_a_dead_letter_subject_no_stream_captures_fails_the_read_saying_so(
    streams: Callable[..., Stream],
) -> None:
    s = streams()
    subject = s.subject("x")
    s.publish(subject, [b"\xff"])
    source = JetStreamSource(
        servers=NATS_URL, stream=s.name, bounded=True, dead_letter_subject="SP_TEST_NOWHERE.dead"
    )
    reader = source.open_partition(subject, 0)
    try:
        with pytest.raises(ValueError, match=r"'SP_TEST_NOWHERE.dead'.*make a stream capture"):
            drain(reader, 10, wait_poll)
    finally:
        reader.close()
    with pytest.raises(ValueError, match=r"dead_letter_subject 'a.x' is one of the subjects"):
        JetStreamSource(stream="A", subjects=("a.x",), dead_letter_subject="a.x")


def test_an_unreachable_server_is_named_and_a_reader_of_it_retries() -> None:
    servers = f"nats://127.0.0.1:{closed_port()}"
    with pytest.raises(ConnectionError, match=rf"cannot reach NATS at {servers}"):
        JetStreamSource(servers=servers, stream="S").partitions()
    reader = JetStreamSource(servers=servers, stream="S").open_partition("S.x", 0)
    try:
        assert reader.poll(0.0, 10) == ([], [])  # not an error: it retries
    finally:
        reader.close()
    assert not any(t.name == "nats-io" for t in threading.enumerate())


def test_a_missing_stream_is_named(streams: Callable[..., Stream]) -> None:
    with pytest.raises(ValueError, match=r"no stream 'SP_TEST_NONE'"):
        JetStreamSource(servers=NATS_URL, stream="SP_TEST_NONE").partitions()


def test_discovery_finds_a_new_subject(streams: Callable[..., Stream]) -> None:
    s = streams()
    source = JetStreamSource(servers=NATS_URL, stream=s.name, discovery_interval_s=1.0)
    assert source.partitions() == []
    s.publish(s.subject("b"), [b"1"])
    s.publish(s.subject("a"), [b"1"])
    assert source.partitions() == [s.subject("a"), s.subject("b")]


def delete_consumer(s: Stream, reader: JetStreamReader) -> None:
    assert s.delete_consumers() == 1


def drop_connection(s: Stream, reader: JetStreamReader) -> None:
    """Shut the reader's TCP connection down under it, as a network failure would."""
    client = reader._client
    assert client is not None
    io = IoLoop.acquire()
    try:
        io.run(_drop(client), WAIT_S)
    finally:
        IoLoop.release()


@pytest.mark.parametrize("fault", [delete_consumer, drop_connection])
def test_a_reader_whose_consumer_or_connection_is_lost_loses_and_repeats_nothing(
    streams: Callable[..., Stream], fault: Callable[[Stream, JetStreamReader], None]
) -> None:
    """Halfway through, the consumer is deleted or the connection dropped: the reader
    makes a new consumer after the last sequence it fetched (nats-py reconnects)."""
    s = streams()
    subject = s.subject("x")
    records = list(range(3000))
    s.publish(subject, [json.dumps(r).encode() for r in records])
    source = JetStreamSource(servers=NATS_URL, stream=s.name, codec="json", bounded=True)
    reader = source.open_partition(subject, 0)
    try:
        got = drain(reader, 100, wait_poll)
        fault(s, reader)
        got += drain(reader, 10_000, wait_poll)
    finally:
        reader.close()
    assert got == records
    assert s.consumers() == []


def test_an_unbounded_reader_reads_what_comes_after_its_consumer_is_deleted(
    streams: Callable[..., Stream],
) -> None:
    s = streams()
    subject = s.subject("x")
    s.publish(subject, [b"1", b"2"])
    source = JetStreamSource(servers=NATS_URL, stream=s.name, codec="json")
    reader = source.open_partition(subject, 0)
    try:
        assert drain(reader, 2, wait_poll) == [1, 2]
        assert s.delete_consumers() == 1
        s.publish(subject, [b"3"])
        assert drain(reader, 1, wait_poll) == [3]
        assert reader.position() == 3
    finally:
        reader.close()


async def _drop(client: nats.NATS) -> None:
    client._transport._io_writer.transport.abort()  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_word_count_from_jetstream_to_jetstream_is_exactly_the_reference(
    streams: Callable[..., Stream], tmp_path: Path
) -> None:
    s = streams()
    texts = {}
    for p in range(3):
        texts[s.subject(f"lines.{p}")] = lines(seed=p, count_=2000)
        s.publish(s.subject(f"lines.{p}"), [t.encode() for t in texts[s.subject(f"lines.{p}")]])
    source = JetStreamSource(
        servers=NATS_URL, stream=s.name, subjects=tuple(texts), codec="utf-8", bounded=True
    )
    sink = JetStreamSink(servers=NATS_URL, subject=s.subject("counts"), stream=s.name)
    graph = word_count(source, sink)
    assert run_with_checkpoints(str(tmp_path / "checkpoints"), graph) == JobStatus.FINISHED
    got = sorted(tuple(r) for r in s.read(s.subject("counts")))
    assert got == running_counts(t for lines_ in texts.values() for t in lines_)


# -- TLS and a user with a password -------------------------------------------------------


@pytest.fixture(scope="session")
def tls_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsServer, Pki]]:
    """A nats-server of the session's own: JetStream, TLS, a user and password."""
    directory = tmp_path_factory.mktemp("tls-nats")
    pki = make_pki(directory)
    with running_nats(directory, pki) as server:
        yield server, pki


def tls_settings(server: TlsServer, ca: str, password: str | None = None) -> dict[str, Any]:
    """A connector's connection settings for ``server``, trusting ``ca``."""
    return {
        "servers": f"nats://{server.address}",
        "tls_ca": ca,
        "options": {"user": server.user, "password": password or server.password},
    }


def on_tls_server(server: TlsServer, pki: Pki, question: Callable[[Any], Any]) -> Any:
    async def ask() -> Any:
        tls = ssl.create_default_context(cafile=pki.ca)
        nc = await nats.connect(
            f"nats://{server.address}", tls=tls, user=server.user, password=server.password
        )
        try:
            return await question(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_the_source_and_sink_work_through_tls_and_a_password(
    tls_nats: tuple[TlsServer, Pki],
) -> None:
    server, pki = tls_nats
    name = unique("SP_TLS_")

    async def fill(j: Any) -> None:
        await j.add_stream(name=name, subjects=[f"{name}.>"])
        for r in range(30):
            await j.publish(f"{name}.in", json.dumps(r).encode())

    on_tls_server(server, pki, fill)
    try:
        settings = tls_settings(server, pki.ca)
        source = JetStreamSource(**settings, stream=name, codec="json", bounded=True)
        assert source.partitions() == [f"{name}.in"]
        reader = source.open_partition(f"{name}.in", 0)
        try:
            assert drain(reader, 100, wait_poll) == list(range(30))
        finally:
            reader.close()
        writer = JetStreamSink(**settings, subject=f"{name}.out", stream=name).open(0, 1)
        writer.transactional()
        writer.write(["a", "b"])
        writer.prepare(1)
        writer.commit(1)
        writer.close()

        async def out(j: Any) -> list[Any]:
            info = await j.stream_info(name, subjects_filter=">")
            return [(await j.get_last_msg(name, f"{name}.out")).data, info.state.subjects]

        last, subjects = on_tls_server(server, pki, out)
        assert last == b'"b"' and subjects == {f"{name}.in": 30, f"{name}.out": 2}
    finally:
        on_tls_server(server, pki, lambda j: j.delete_stream(name))
    assert not any(t.name == "nats-io" for t in threading.enumerate()), "IoLoop left running"


@pytest.mark.parametrize("fault", ["wrong password", "untrusted certificate"])
def test_a_wrong_password_or_an_untrusted_certificate_is_named_at_once(
    tls_nats: tuple[TlsServer, Pki], fault: str
) -> None:
    """The submission (``partitions``) and the sink's first write fail at once, naming
    the server and why."""
    server, pki = tls_nats
    if fault == "wrong password":
        settings = tls_settings(server, pki.ca, password="not-the-password")
        why = r"[Aa]uthorization"
    else:
        settings = tls_settings(server, pki.other_ca)
        why = r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"
    where = f"nats://{server.address}"
    with pytest.raises(ConnectionError, match=rf"NATS at {where}.*({why})"):
        JetStreamSource(**settings, stream="S").partitions()
    writer = JetStreamSink(**settings, subject="S.out").open(0, 1)
    try:
        with pytest.raises(OSError, match=rf"at NATS {where}.*({why})"):
            writer.write(["x"])
    finally:
        writer.abort()
    assert not any(t.name == "nats-io" for t in threading.enumerate()), "IoLoop left running"
