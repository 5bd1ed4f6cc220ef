"""The wire, attacked: strangers on the coordinator's port and on a worker's data port
(real coordinator and worker processes) get nothing decoded, break no job and run no
code; a peer of one job cannot feed another; the secret is on no command line; TLS
refuses plaintext and foreign certificates. And the pure handshake, tampered with."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from controlplane.runner import LocalCluster
from controlplane.testing import BackgroundCluster
from runtime import handshake, protocol
from runtime.channels import InputChannel
from runtime.codec import packb, unpackb
from runtime.dataflow import load_job
from runtime.dataserver import DataServer
from runtime.handshake import (
    MAX_PROOF,
    ClientHandshake,
    HandshakeError,
    ServerHandshake,
    TlsFiles,
)
from tests.e2e_jobs import counting_reference, final_counts, held_until_released

# A server closes a silent stranger after HANDSHAKE_TIMEOUT_S: waits for that are bounded
# by this, generously (a loaded machine, two processes' event loops in between).
CLOSE_WAIT_S = 6 * handshake.HANDSHAKE_TIMEOUT_S
JOB_WAIT_S = 60.0  # a few seconds' job ends within this
FLOOD = 200 << 20  # the body a flooding stranger announces and tries to send


class _Touch:
    """Unpickling this creates the file at ``path`` (what a code-execution payload does)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def pickle_frame(obj: object) -> bytes:
    """One frame whose msgpack body carries ``obj`` pickled (extension type 1)."""
    body = packb(obj)
    return struct.pack(">I", len(body)) + body


# -- a stranger's moves ------------------------------------------------------------------------


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts)."""
    got = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), CLOSE_WAIT_S):
            got += chunk
    except ConnectionError:
        pass
    return got


async def send_then_closed(address: tuple[str, int], data: bytes) -> bytes:
    """Connect, send ``data``, and return what came back once the server hung up."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):  # it may hang up before we are done
            await writer.drain()
        return await until_closed(reader)
    finally:
        writer.close()


async def silent(address: tuple[str, int]) -> bytes:
    """Connect and send nothing: the server hangs up after its deadline."""
    return await send_then_closed(address, b"")


async def flood(address: tuple[str, int]) -> int:
    """Announce a 200 MB frame and send its body; returns how much went out before the
    server cut the connection."""
    _, writer = await asyncio.open_connection(*address)
    sent = 0
    chunk = bytes(1 << 20)
    try:
        writer.write(struct.pack(">I", FLOOD))
        while sent < FLOOD:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), CLOSE_WAIT_S)
            sent += len(chunk)
    except ConnectionError:
        pass
    finally:
        writer.close()
    return sent


async def wrong_key(address: tuple[str, int], key: bytes, context: str) -> str:
    """Run the handshake with ``key``; returns why the server refused it."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        await handshake.dial(reader, writer, key, context, CLOSE_WAIT_S)
    except HandshakeError as exc:
        return "refused: " + str(exc)
    finally:
        writer.close()
    return "accepted"


def attacks(address: tuple[str, int], marker: Path, hello: bytes) -> dict[str, Awaitable]:
    """The moves of a stranger who does not speak the handshake against one port
    (``hello``: the frame that port's peers sent first before it, with a wrong secret)."""
    return {
        "pickle": send_then_closed(
            address, pickle_frame({"type": "register", "x": _Touch(marker)})
        ),
        "wrong-secret-hello": send_then_closed(address, hello),
        "garbage": send_then_closed(address, os.urandom(4096)),
        "4GB-header": send_then_closed(address, b"\xff\xff\xff\xff" + bytes(64)),
        "200MB-body": flood(address),
        "silent": silent(address),
    }


def greeting_only(got: bytes) -> bool:
    """What a stranger gets from a server: its greeting (a nonce), nothing else (or not
    even that: a reset may discard it before it is read)."""
    return len(got) <= handshake.GREETING and handshake.MAGIC.startswith(got[:4])


def check_refused(outcomes: dict[str, object]) -> None:
    for name, got in outcomes.items():
        if name == "200MB-body":
            assert isinstance(got, int) and got < FLOOD // 4, f"{name}: {got} bytes went out"
        elif isinstance(got, str):  # a handshake with a wrong key, or for another port
            assert got.startswith("refused"), f"{name}: {got}"
        else:
            assert isinstance(got, bytes) and greeting_only(got), f"{name}: got {got!r}"


# -- against real processes --------------------------------------------------------------------


def test_strangers_on_the_coordinator_and_data_ports_change_nothing(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """While a job runs, every stranger's move on the coordinator's port and on a worker's
    data port at once: each connection is closed, no code runs, the job's output is exact."""
    # The job's end is held until the attacks are over, however long they take.
    records = 10_000
    params = {"records": records, "rate": 5_000, "output": str(tmp_path / "out")}
    graph = load_job("tests.e2e_jobs:counting_job", params)
    job = cluster.submit(held_until_released(graph, held_end))
    workers_before = set(cluster.coordinator.workers)
    alive_before = {w.id for w in cluster.coordinator.alive_workers()}
    # A worker reading the job's records (the shared cluster may have lost others before).
    w1 = cluster.coordinator.workers[job.layout.placement["count-0"]]
    coordinator = cluster.coordinator.address
    data = (w1.data_host, w1.data_port)
    register = protocol.encode({"type": "register", "secret": "wrong", "host": "x"})
    hello = protocol.encode([protocol.HELLO, "intruder", "wrong"])

    async def all_at_once() -> tuple[dict, dict]:
        moves = {
            "coordinator": attacks(coordinator, tmp_path / "pwned-coordinator", register),
            "data": attacks(data, tmp_path / "pwned-worker", hello),
        }
        moves["coordinator"]["wrong-key"] = wrong_key(
            coordinator, handshake.control_key("wrong"), "control"
        )
        moves["coordinator"]["heartbeat-wrong-key"] = wrong_key(
            coordinator, handshake.control_key("wrong"), f"heartbeat:{w1.id}"
        )
        moves["coordinator"]["data-context"] = wrong_key(  # right secret, wrong port
            coordinator,
            handshake.data_key(cluster.cluster.secret, job.id),
            handshake.data_context(job.id),
        )
        moves["data"]["wrong-key"] = wrong_key(
            data, handshake.data_key("wrong", job.id), handshake.data_context(job.id)
        )
        moves["data"]["control-context"] = wrong_key(  # right secret, wrong port
            data, handshake.control_key(cluster.cluster.secret), "control"
        )
        names = [(port, name) for port, named in moves.items() for name in named]
        results = await asyncio.gather(*(moves[p][n] for p, n in names))
        out: dict[str, dict] = {"coordinator": {}, "data": {}}
        for (port, name), got in zip(names, results, strict=True):
            out[port][name] = got
        return out["coordinator"], out["data"]

    on_coordinator, on_data = asyncio.run(all_at_once())
    assert job.status == "running", job.error
    check_refused(on_coordinator)
    check_refused(on_data)
    held_end.unlink()
    assert cluster.wait(job, JOB_WAIT_S) == "finished", job.error
    assert final_counts(tmp_path / "out") == counting_reference(records)
    assert not (tmp_path / "pwned-coordinator").exists()
    assert not (tmp_path / "pwned-worker").exists()
    assert set(cluster.coordinator.workers) == workers_before, "a stranger registered"
    assert {w.id for w in cluster.coordinator.alive_workers()} == alive_before


def test_a_peer_of_one_job_cannot_feed_another(
    cluster: BackgroundCluster, tmp_path: Path, held_end: Path
) -> None:
    """A peer that holds job A's data key sends records on a channel of job B: the
    connection is refused (failing A, whose link it was), and B's output is exact."""
    records = 10_000
    a = cluster.submit(load_job("tests.e2e_jobs:counting_job", {"rate": 2_000}))
    params = {"records": records, "rate": 5_000, "output": str(tmp_path)}
    b = cluster.submit(
        held_until_released(load_job("tests.e2e_jobs:counting_job", params), held_end)
    )
    w1 = cluster.coordinator.workers[b.layout.placement["count-0"]]
    secret = cluster.cluster.secret
    target = protocol.channel_key(b.id, "keys-0", "count-0")  # read on w1

    async def feed_b_as_a() -> bytes:
        reader, writer = await asyncio.open_connection(w1.data_host, w1.data_port)
        try:
            key = handshake.data_key(secret, a.id)
            await handshake.dial(reader, writer, key, handshake.data_context(a.id))
            protocol.write_frame(writer, [protocol.HELLO, "intruder"])
            protocol.write_frame(writer, [protocol.DATA, target, ["k00001"] * 1000, [0.0] * 1000])
            await writer.drain()
            return await until_closed(reader)
        finally:
            writer.close()

    assert asyncio.run(feed_b_as_a()) == b""  # closed, not a credit given
    held_end.unlink()
    assert cluster.wait(b, JOB_WAIT_S) == "finished", b.error
    assert final_counts(tmp_path) == counting_reference(records)
    assert cluster.wait(a, JOB_WAIT_S) == "failed"
    assert f"not a channel of job {a.id}" in (a.error or ""), a.error


def test_the_secret_is_on_no_worker_command_line_or_environment(
    cluster: BackgroundCluster,
) -> None:
    secret = cluster.cluster.secret.encode()
    workers = [w for w in cluster.coordinator.workers.values() if w.status == "alive"]
    assert workers
    for w in workers:
        for what in ("cmdline", "environ"):
            seen = Path(f"/proc/{w.pid}/{what}").read_bytes()
            assert seen, f"/proc/{w.pid}/{what} is empty: nothing was checked"
            assert secret not in seen, f"the secret is in /proc/{w.pid}/{what}"
        assert b"--secret-fd" in Path(f"/proc/{w.pid}/cmdline").read_bytes()


def test_a_secret_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    from runtime.worker_cli import read_secret

    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_secret(path=str(path))
    path.chmod(0o600)
    assert read_secret(path=str(path)) == "s3cret"


# -- TLS -----------------------------------------------------------------------------------------


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_pki(where: Path, label: str) -> TlsFiles:
    """A CA and a certificate it signed for 127.0.0.1, as PEM files under ``where``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{label} CA"))
        .issuer_name(_name(f"{label} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{label} node"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    where.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(where / f"{label}.crt", where / f"{label}.key", where / f"{label}-ca.crt")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    assert files.ca is not None
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return files


async def tls_dial(address: tuple[str, int], tls: ssl.SSLContext, key: bytes, context: str) -> str:
    """Dial over TLS and run the handshake; returns how it went."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(*address, ssl=tls), CLOSE_WAIT_S
        )
    except (ssl.SSLError, ConnectionError) as exc:
        return f"refused: {exc}"
    try:
        await handshake.dial(reader, writer, key, context, CLOSE_WAIT_S)
    except (HandshakeError, ssl.SSLError) as exc:
        return f"refused: {exc}"
    finally:
        writer.close()
    return "accepted"


def test_a_job_runs_over_mutual_tls_and_strangers_are_refused(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """Coordinator and data ports serve mutual TLS: a job's output is exact; a plaintext
    client (a pickle frame) and a client whose certificate another CA signed (holding the
    right cluster secret, even) are refused on both ports."""
    cluster_pki = make_pki(tmp_path / "pki", "cluster")
    rogue = make_pki(tmp_path / "rogue", "rogue")
    assert cluster_pki.ca is not None
    # The rogue trusts the cluster's CA (it can see the server's certificate), but its own
    # certificate is not one the cluster's CA signed.
    rogue_tls = handshake.client_tls(rogue.cert, rogue.key, cluster_pki.ca)
    marker = tmp_path / "pwned"
    records = 10_000

    async def main() -> tuple[str, dict[str, object]]:
        async with LocalCluster(2, tls=cluster_pki) as c:
            params = {"records": records, "output": str(tmp_path / "out")}
            job = await c.coordinator.submit(load_job("tests.e2e_jobs:counting_job", params))
            w1 = c.coordinator.workers["w1"]
            data = (w1.data_host, w1.data_port)
            control = handshake.control_key(c.secret)
            job_key = handshake.data_key(c.secret, job.id)
            moves: dict[str, Callable[[], Awaitable[object]]] = {
                "plaintext-coordinator": lambda: send_then_closed(
                    c.coordinator.address, pickle_frame(_Touch(marker))
                ),
                "plaintext-data": lambda: send_then_closed(data, pickle_frame(_Touch(marker))),
                "rogue-coordinator": lambda: tls_dial(
                    c.coordinator.address, rogue_tls, control, "control"
                ),
                "rogue-data": lambda: tls_dial(
                    data, rogue_tls, job_key, handshake.data_context(job.id)
                ),
            }
            results = await asyncio.gather(*(move() for move in moves.values()))
            status = await job.wait(JOB_WAIT_S)
            return status, dict(zip(moves, results, strict=True))

    status, outcomes = asyncio.run(main())
    assert status == "finished"
    assert final_counts(tmp_path / "out") == counting_reference(records)
    for name in ("plaintext-coordinator", "plaintext-data"):
        got = outcomes[name]
        assert isinstance(got, bytes) and not got.startswith(handshake.MAGIC), (name, got)
    for name in ("rogue-coordinator", "rogue-data"):
        assert str(outcomes[name]).startswith("refused"), (name, outcomes[name])
    assert not marker.exists()


# -- the data server, in process -----------------------------------------------------------------


def test_state_for_another_jobs_reconfiguration_is_refused_and_fails_only_its_own_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer of job-1 sends key-group state for reconfiguration 7, job-2's: nothing is
    taken in, and only job-1 hears of it."""
    secret = "cluster-secret"
    key = protocol.channel_key("job-2", "split-0", "count-0")
    errors: list = []
    taken: list = []

    async def main() -> bytes:
        server = DataServer(
            secret,
            {key: InputChannel(key, "split-0")},
            on_error=lambda message, jobs: errors.append((message, jobs)),
            on_state=lambda *args: taken.append(args),
            has_job=lambda job: True,
            changing=lambda rids: {"job-2"} if 7 in rids else set(),
        )
        host, port = await server.start("127.0.0.1")
        try:
            reader, writer = await asyncio.open_connection(host, port)
            job1 = handshake.data_key(secret, "job-1")
            await handshake.dial(reader, writer, job1, handshake.data_context("job-1"))
            protocol.write_frame(writer, [protocol.HELLO, "w9"])
            protocol.write_frame(writer, [protocol.STATE, 7, "count-0", 3, 0, 1, True, 10])
            writer.write(b"x" * 10)
            await writer.drain()
            got = await until_closed(reader)
            writer.close()
            return got
        finally:
            await server.close()

    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    assert asyncio.run(main()) == b""
    assert taken == []
    assert len(errors) == 1 and errors[0][1] == {"job-1"}, errors
    assert "reconfiguration of job job-2" in errors[0][0]


def test_refused_strangers_make_one_warning_not_one_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        server = DataServer("cluster-secret", {}, on_error=lambda *a: pytest.fail(str(a)))
        address = await server.start("127.0.0.1")
        try:
            await asyncio.gather(
                *(send_then_closed(address, b"GET / HTTP/1.0\r\n") for _ in range(20))
            )
        finally:
            await server.close()

    caplog.set_level(logging.DEBUG, logger="runtime.dataserver")
    asyncio.run(main())
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 1, [r.getMessage() for r in warnings]
    assert sum("refused a connection" in r.getMessage() for r in caplog.records) == 20


# -- the pure handshake ---------------------------------------------------------------------------

KEY = handshake.data_key("cluster-secret", "job-1")


def exchange(
    server_key: bytes | None,
    client_key: bytes,
    context: str = "data:job-1@1",
    tamper: tuple[str, int, int] | None = None,
) -> str:
    """Run both sides in memory, byte by byte; ``tamper`` (message, index, xor) flips bits
    of one byte of ``greeting``, ``proof`` or ``answer`` on the way. Returns the context
    the server accepted; raises HandshakeError from whichever side refused."""
    server = ServerHandshake(lambda ctx: server_key if ctx == context else None)
    client = ClientHandshake(client_key, context)

    def wire(name: str, data: bytes) -> bytes:
        if tamper is None or tamper[0] != name:
            return data
        _, index, xor = tamper
        index %= len(data)
        return data[:index] + bytes([data[index] ^ xor]) + data[index + 1 :]

    proof = b""
    for b in wire("greeting", server.greeting()):
        proof += client.receive(bytes([b]))
    answer = b""
    read = 0
    for b in wire("proof", proof):
        answer += server.receive(bytes([b]))
        read += 1
    assert read <= MAX_PROOF
    if server.context is None:
        raise HandshakeError("the server still waits for bytes: it would time out")
    assert server.context == context
    for b in wire("answer", answer):
        client.receive(bytes([b]))
    assert client.done
    return server.context


def test_an_honest_exchange_agrees_on_the_context() -> None:
    assert exchange(KEY, KEY) == "data:job-1@1"


def test_a_wrong_key_is_refused_by_the_server() -> None:
    with pytest.raises(HandshakeError, match="wrong key"):
        exchange(KEY, handshake.data_key("cluster-secret", "job-2"))


def test_a_server_without_the_key_is_found_out_by_the_client() -> None:
    client = ClientHandshake(KEY, "data:job-1@1")
    proof = client.receive(handshake.MAGIC + bytes(32))
    assert proof
    with pytest.raises(HandshakeError, match="does not hold the key"):
        client.receive(bytes(32))  # an impostor cannot compute the answer


@given(
    message=st.sampled_from(["greeting", "proof", "answer"]),
    index=st.integers(min_value=0, max_value=MAX_PROOF),
    xor=st.integers(min_value=1, max_value=255),
)
def test_any_tampered_byte_fails_the_handshake(message: str, index: int, xor: int) -> None:
    with pytest.raises(HandshakeError):
        exchange(KEY, KEY, tamper=(message, index, xor))


@given(st.binary(min_size=1, max_size=2 * MAX_PROOF))
def test_a_server_reads_no_more_than_a_proof_of_anything(data: bytes) -> None:
    """Whatever a stranger sends, the server wants at most MAX_PROOF bytes in all before it
    refuses (or, for a right proof, which random bytes are not, accepts)."""
    server = ServerHandshake(lambda ctx: KEY)
    read = 0
    with pytest.raises(HandshakeError):
        while True:
            n = server.wanted
            assert n >= 1 and read + n <= MAX_PROOF
            chunk = data[read : read + n]
            if not chunk:
                raise HandshakeError("the stranger ran out of bytes")
            server.receive(chunk)
            read += len(chunk)


def test_the_server_refuses_bytes_past_the_proof_and_unknown_contexts() -> None:
    server = ServerHandshake(lambda ctx: KEY)
    with pytest.raises(HandshakeError, match="more than a handshake"):
        server.receive(bytes(MAX_PROOF + 1))
    server = ServerHandshake(lambda ctx: None)
    client = ClientHandshake(KEY, "data:job-1@1")
    proof = client.receive(server.greeting())
    with pytest.raises(HandshakeError, match="no connection for"):
        while proof:  # in the pieces it asks for
            n = server.wanted
            server.receive(proof[:n])
            proof = proof[n:]


@pytest.mark.parametrize(
    "context", ["data:job-1", "data:job-1@", "data:job-1@0", "data:job-1@02", "data:@2", "data:j@x"]
)
def test_a_data_connection_names_its_job_and_deployment(context: str) -> None:
    """A data server takes a context naming a job and a deployment of it (1, 2, ...),
    in one spelling only; anything else gets no key, so the peer is refused."""
    server = DataServer("cluster-secret", {})
    assert server.key_for(context) is None
    assert server.key_for("data:job-1@2") == KEY
    assert handshake.data_of_context(handshake.data_context("a@b", 12)) == ("a@b", 12)


@pytest.mark.parametrize("context", ["", "x" * 129, "data:jöb", "data job"])
def test_a_context_is_short_printable_ascii(context: str) -> None:
    with pytest.raises(HandshakeError, match="printable ASCII"):
        ClientHandshake(KEY, context)


def test_keys_are_per_purpose_and_per_job() -> None:
    keys = {
        handshake.control_key("s"),
        handshake.data_key("s", "job-1"),
        handshake.data_key("s", "job-2"),
        handshake.data_key("t", "job-1"),
    }
    assert len(keys) == 4


def test_the_pickle_payload_is_real(tmp_path: Path) -> None:
    """The frames the attacks send would run code if they were decoded: decoding one
    here creates its file (so the attacks above test something)."""
    marker = tmp_path / "control"
    frame = pickle_frame({"x": _Touch(marker)})
    decoded = unpackb(frame[4:])
    decoded["x"].close()
    assert marker.exists()


def test_dial_socket_runs_the_client_side_on_a_blocking_socket() -> None:
    async def main() -> str:
        accepted: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                accepted.set_result(await handshake.accept(reader, writer, lambda ctx: KEY))
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def client() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WAIT_S) as sock:
                handshake.dial_socket(sock, KEY, "heartbeat:w1")

        try:
            await asyncio.to_thread(client)
            return await asyncio.wait_for(accepted, CLOSE_WAIT_S)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) == "heartbeat:w1"
