"""The end of a data connection, seen from the receiving worker's data server (in process,
real loopback sockets): a peer's reset fails the jobs whose channels from it are still being
read, and is quiet once nothing it carried is (its streams ended, or their jobs stopped
here), as when workers shut down one after another, or once its channels' tasks moved
off either end (a drained worker retired). A connection that carries key-group
state fails only the job whose reconfiguration it carried state for, while it is pending.
And from the sending side: a link whose peer has gone says so when written to, and a
peer's reset fails the job only while a channel on the link is still fed from here.
Fencing: once a worker runs a later deployment of a job, a connection of an earlier one
is closed with nothing more of it read, and refused if it comes later; a connection of a
later deployment (its peer deployed first) is taken."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable

import pytest

from runtime import handshake, protocol
from runtime.channels import ChannelError, InputChannel
from runtime.dataserver import DataServer
from runtime.peerlink import PeerLink, RemoteOutputChannel
from runtime.records import BarrierKind, EndOfStream

SECRET = "cluster-secret"
KEY = protocol.channel_key("job-1", "split-0", "count-0")
JOB_KEY = handshake.data_key(SECRET, "job-1")  # the data key of job-1's connections
# A stream a peer ends last: the server routes a connection's frames in order, so once it
# is closed, the server has read all the peer sent before. Closed, it counts for nothing
# when the connection breaks (only open streams, state and detaches do).
PROBE = protocol.channel_key("job-1", "split-1", "count-0")
WAIT_S = 30.0  # the longest wait for the server or a link to take something in


async def until(condition: Callable[[], object], what: str) -> None:
    """Wait until ``condition()``; fails the test after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT_S:g}s")
        await asyncio.sleep(0.01)


async def reset_peer(caplog: pytest.LogCaptureFixture, *, running: bool, ended: bool) -> list:
    """A peer says hello, sends a barrier (and the end of stream when ``ended``) on one
    channel of job-1, then resets its connection; returns the errors the server reported
    once it has taken the reset in."""
    frames = [[protocol.BARRIER, KEY, BarrierKind.RECONFIG.value, 1]]
    if ended:
        frames.append([protocol.END, KEY])
    return await send_then_reset(caplog, frames, has_job=lambda job: running and job == "job-1")


async def send_then_reset(
    caplog: pytest.LogCaptureFixture,
    frames: list,
    payload: bytes = b"",
    inputs: dict | None = None,
    **options,
) -> list:
    """A peer of job-1 proves its key, says hello, sends ``frames`` and ``payload``, then
    resets its connection to a
    data server made with ``options`` and reading ``inputs`` (by default KEY, read here);
    returns the errors the server reported once it has taken the reset in."""
    errors: list = []
    inputs = {KEY: InputChannel(KEY, "split-0")} if inputs is None else inputs
    probe = inputs[PROBE] = InputChannel(PROBE, "split-1")
    server = DataServer(
        SECRET, inputs, on_error=lambda message, jobs: errors.append((message, jobs)), **options
    )
    host, port = await server.start("127.0.0.1")
    try:
        reader, writer = await asyncio.open_connection(host, port)
        await handshake.dial(reader, writer, JOB_KEY, handshake.data_context("job-1"))
        protocol.write_frame(writer, [protocol.HELLO, "w9"])
        for frame in frames:
            protocol.write_frame(writer, frame)
        writer.write(payload)
        protocol.write_frame(writer, [protocol.END, PROBE])
        await writer.drain()
        await until(lambda: probe.closed, "the server reading the frames")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()  # with linger 0: a reset, not a clean close
        await until(
            lambda: errors or "reset after its streams" in caplog.text,
            "the data server taking the reset in",
        )
        return errors
    finally:
        await server.close()


@pytest.mark.parametrize(("running", "ended"), [(False, False), (True, True), (False, True)])
def test_a_reset_after_the_streams_is_quiet(
    caplog: pytest.LogCaptureFixture, running: bool, ended: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    assert asyncio.run(reset_peer(caplog, running=running, ended=ended)) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_reset_while_a_channel_is_read_fails_its_job(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    errors = asyncio.run(reset_peer(caplog, running=True, ended=False))
    assert len(errors) == 1, errors
    message, jobs = errors[0]
    assert jobs == {"job-1"}
    assert "data connection from worker w9 broke" in message


def test_a_reset_after_its_sender_moved_away_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """split-0 moved to another worker: its old worker said DETACH, and the channel goes on
    from the new one; the old worker going away later is none of the channel's business
    (without the DETACH, the test above fails the job)."""
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    frames = [[protocol.BARRIER, KEY, BarrierKind.RECONFIG.value, 1], [protocol.DETACH, KEY]]
    assert asyncio.run(send_then_reset(caplog, frames, has_job=lambda job: True)) == []
    assert "reset after its streams" in caplog.text


def test_a_reset_after_its_reader_moved_away_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """count-0 moved to another worker: the channel it read here is no longer registered
    (its sender, which stays, now sends to the new worker)."""
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    inputs = {KEY: InputChannel(KEY, "split-0")}

    async def scenario() -> list:
        async def unregister_once_read() -> None:
            await until(lambda: inputs[KEY].items, "the server reading the barrier")
            del inputs[KEY]

        watcher = asyncio.ensure_future(unregister_once_read())
        frames = [[protocol.BARRIER, KEY, BarrierKind.RECONFIG.value, 1]]
        errors = await send_then_reset(caplog, frames, inputs=inputs, has_job=lambda job: True)
        assert watcher.done()
        return errors

    assert asyncio.run(scenario()) == []
    assert "reset after its streams" in caplog.text


def reset_state_link(caplog: pytest.LogCaptureFixture, pending: dict[int, str]) -> list:
    """A peer sends the first of two chunks of key-group state for reconfiguration 7, then
    resets; ``pending`` is the reconfiguration pending for each job on the worker."""
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    frame = [protocol.STATE, 7, "count-0", 3, 0, 2, True, 100]
    return asyncio.run(
        send_then_reset(
            caplog,
            [frame],
            b"x" * 100,
            on_state=lambda job, frame, chunk, read: None,
            has_job=lambda job: job in pending.values(),
            changing=lambda rids: {job for rid, job in pending.items() if rid in rids},
        )
    )


def test_a_reset_state_link_fails_only_the_job_whose_change_it_carried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = reset_state_link(caplog, {7: "job-1", 8: "job-2"})
    assert len(errors) == 1, errors
    message, jobs = errors[0]
    assert jobs == {"job-1"}
    assert "data connection from worker w9 broke" in message


def test_a_reset_state_link_fails_no_job_once_its_change_is_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before: a connection that had carried state only failed every job on the worker.
    assert reset_state_link(caplog, {8: "job-2"}) == []
    assert "reset after its streams" in caplog.text


async def send_until_refused() -> str:
    """A link to a data server that then closes; returns the error a send finally raises
    (the first writes may still reach the kernel before the peer's reset comes back)."""
    server = DataServer(SECRET, {}, on_error=lambda message, jobs: None)
    host, port = await server.start("127.0.0.1")
    link = await PeerLink.connect("w1", host, port, "w9", job_id="job-1", key=JOB_KEY)
    refused: list[str] = []

    def send_refused() -> bool:
        try:
            link.send([protocol.DATA, KEY, ["word"], [0.0]])
        except ChannelError as exc:
            refused.append(str(exc))
        return bool(refused)

    try:
        # The server answered the handshake before connect returned: the connection is
        # its own, and closing the server closes it.
        await server.close()
        await until(send_refused, "a send on the link whose peer closed it to fail")
        return refused[0]
    finally:
        await link.close()


def test_a_send_to_a_worker_that_has_gone_says_which() -> None:
    message = asyncio.run(send_until_refused())
    assert message == ("the data connection to worker w1 is closed (the worker stopped or died)"), (
        message
    )


async def reset_by_peer(caplog: pytest.LogCaptureFixture, settle: str) -> list:
    """A link carries one channel (KEY); the channel is left as ``settle`` says (``live``,
    ``detached`` or ``ended``), then the peer resets the connection; returns what the link
    reported once it has taken the reset in."""
    errors: list = []
    settled = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await handshake.accept(reader, writer, lambda context: JOB_KEY)
        await settled.wait()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()  # with linger 0: a reset

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = await PeerLink.connect("w1", "127.0.0.1", port, "w9", job_id="job-1", key=JOB_KEY)
    link.on_error = errors.append
    try:
        channel = RemoteOutputChannel(KEY, "count-0", 4, link)
        if settle == "ended":
            await channel.send_control(EndOfStream(), 512)
        elif settle == "detached":
            channel.detach()
        await link.writer.drain()
        settled.set()
        await until(
            lambda: errors or "reset once unused" in caplog.text, "the link taking the reset in"
        )
        return errors
    finally:
        await link.close()
        server.close()
        await server.wait_closed()


def test_a_peer_resetting_a_link_that_still_feeds_it_fails_the_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="runtime.peerlink")
    errors = asyncio.run(reset_by_peer(caplog, "live"))
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError), errors


@pytest.mark.parametrize("settle", ["detached", "ended"])
def test_a_peer_resetting_a_link_once_its_channels_are_over_is_quiet(
    caplog: pytest.LogCaptureFixture, settle: str
) -> None:
    """The channel's task moved away (detached) or its stream ended: the peer may go."""
    caplog.set_level(logging.DEBUG, logger="runtime.peerlink")
    assert asyncio.run(reset_by_peer(caplog, settle)) == []
    assert "data link to worker w1 reset once unused" in caplog.text


# -- fencing: a deployment of the job replaced by a later one -------------------------------------

STALE = [protocol.BARRIER, KEY, BarrierKind.CHECKPOINT.value, 3]  # what a zombie still held


def refused(link: PeerLink, frame: list) -> bool:
    """Send ``frame`` on ``link``; True once that raises (the peer closed it): the first
    writes after the peer closed may still reach the kernel before its reset comes back."""
    try:
        link.send(frame)
    except ChannelError:
        return True
    return False


async def replaced_while_connected() -> tuple[list, InputChannel, InputChannel]:
    """Deployment 1's link feeds KEY; the worker then runs deployment 2, whose task reads
    KEY on a new channel, and the old link sends a barrier it still held. Returns the
    errors reported, the old channel and the new one."""
    errors: list = []
    old = InputChannel(KEY, "split-0")
    inputs = {KEY: old}
    server = DataServer(
        SECRET,
        inputs,
        on_error=lambda message, jobs: errors.append(message),
        has_job=lambda job: True,
    )
    host, port = await server.start("127.0.0.1")
    server.fence("job-1", 1)
    link = await PeerLink.connect("w1", host, port, "w9", job_id="job-1", key=JOB_KEY, attempt=1)
    try:
        link.send([protocol.BARRIER, KEY, BarrierKind.CHECKPOINT.value, 4])
        await until(lambda: old.items, "the server reading deployment 1's barrier")
        new = inputs[KEY] = InputChannel(KEY, "split-0")  # deployment 2's task reads it
        server.fence("job-1", 2)
        await until(lambda: refused(link, STALE), "the old link to be closed")
        return errors, old, new
    finally:
        await link.close()
        await server.close()


def test_a_connection_of_a_replaced_deployment_is_closed_and_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The zombie's case: channels have the same names in every deployment, so only the
    deployment the connection names keeps its barrier from the recovered task."""
    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    errors, old, new = asyncio.run(replaced_while_connected())
    assert not new.items and len(old.items) == 1
    assert errors == [], errors  # the job, running deployment 2, hears nothing of it
    assert "it is of deployment 1 of job job-1, and deployment 2 runs here" in caplog.text


def test_a_connection_of_a_replaced_deployment_is_refused_once_proved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        server = DataServer(SECRET, {}, on_error=lambda *a: pytest.fail(str(a)))
        host, port = await server.start("127.0.0.1")
        server.fence("job-1", 2)
        try:
            with pytest.raises(ChannelError, match="did not take a data connection of job"):
                await PeerLink.connect(
                    "w1", host, port, "w9", job_id="job-1", key=JOB_KEY, attempt=1
                )
        finally:
            await server.close()

    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    asyncio.run(main())
    assert "it is of deployment 1 of job job-1, and deployment 2 runs here" in caplog.text


def test_a_connection_of_a_later_deployment_is_taken() -> None:
    """A peer of deployment 2 dials before this worker has read its own deploy of it; the
    deploy then keeps the connection."""

    async def main() -> InputChannel:
        channel = InputChannel(KEY, "split-0")
        server = DataServer(SECRET, {KEY: channel}, on_error=lambda *a: pytest.fail(str(a)))
        host, port = await server.start("127.0.0.1")
        server.fence("job-1", 1)
        link = await PeerLink.connect(
            "w1", host, port, "w9", job_id="job-1", key=JOB_KEY, attempt=2
        )
        try:
            link.send([protocol.BARRIER, KEY, BarrierKind.CHECKPOINT.value, 5])
            await until(lambda: channel.items, "the server reading the first barrier")
            server.fence("job-1", 2)
            link.send([protocol.BARRIER, KEY, BarrierKind.CHECKPOINT.value, 6])
            await until(lambda: len(channel.items) == 2, "the server reading the second")
            return channel
        finally:
            await link.close()
            await server.close()

    barriers = [item.id for item, _ in asyncio.run(main()).items]
    assert barriers == [5, 6]


def test_an_aborted_link_sends_nothing_more() -> None:
    """How a worker stops its tasks of a replaced deployment sending, at once."""

    async def main() -> str:
        server = DataServer(SECRET, {}, on_error=lambda *a: None)
        host, port = await server.start("127.0.0.1")
        link = await PeerLink.connect("w1", host, port, "w9", job_id="job-1", key=JOB_KEY)
        try:
            link.abort()
            with pytest.raises(ChannelError) as caught:
                link.send(STALE)
            return str(caught.value)
        finally:
            await link.close()
            await server.close()

    assert "the data connection to worker w1 is closed" in asyncio.run(main())
