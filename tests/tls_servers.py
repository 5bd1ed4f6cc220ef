"""Throwaway TLS servers for the connector tests: a certificate authority made for the
test session, and a ``nats-server`` (JetStream, TLS, a user and password) and a
``redis-server`` (TLS only, ``requirepass``) started on free loopback ports.

:func:`make_pki` writes, with ``cryptography``, a CA and a server certificate it signs
for ``localhost`` and ``127.0.0.1``, and a second CA that signed nothing the servers
show (a client trusting only it must refuse them). :func:`running_nats` and
:func:`running_redis` start a real server process each, wait (at most
:data:`START_TIMEOUT_S`) until it says it is ready, and stop it on exit, killing it if it
does not stop within :data:`STOP_TIMEOUT_S`: no process is left behind. A test module
makes them session fixtures.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["Pki", "TlsServer", "make_pki", "running_nats", "running_redis"]

START_TIMEOUT_S = 30.0  # a server says it is ready within this (a loaded machine)
STOP_TIMEOUT_S = 10.0  # a terminated server exits within this, or it is killed
NATS_SERVER = "/usr/sbin/nats-server"
REDIS_SERVER = "/usr/bin/redis-server"
USER = "streampilot"
PASSWORD = "s3cret-for-tests"


@dataclass(frozen=True)
class Pki:
    """PEM files: ``ca`` signed ``cert``/``key`` (the servers'); ``other_ca`` signed
    nothing they show."""

    ca: str
    cert: str
    key: str
    other_ca: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
    encipher_only=False, decipher_only=False,
)  # fmt: skip


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(path: Path, cert: x509.Certificate) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for ``localhost``/``127.0.0.1`` signed by it, and an
    unrelated CA, as PEM files in ``directory``."""
    ca_key, ca = _ca("streampilot test CA")
    _, other = _ca("streampilot untrusted CA")
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_path = directory / "server-key.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return Pki(
        ca=_pem(directory / "ca.pem", ca),
        cert=_pem(directory / "server.pem", cert),
        key=str(key_path),
        other_ca=_pem(directory / "other-ca.pem", other),
    )


def free_port() -> int:
    """A loopback port free now (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TlsServer:
    """A running server: where it listens and the credentials it wants."""

    host: str
    port: int
    user: str
    password: str
    pid: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@contextmanager
def _process(argv: list[str], ready: str, what: str) -> Iterator[subprocess.Popen]:
    """``argv`` running until the context exits, once its output has a line containing
    ``ready``; raises :class:`RuntimeError` with its output if it exits first or says
    nothing of the kind within START_TIMEOUT_S."""
    if not Path(argv[0]).exists() and shutil.which(argv[0]) is None:
        raise RuntimeError(f"{what}: {argv[0]} is not installed")
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    output: list[str] = []
    is_ready = threading.Event()

    def drain() -> None:  # keeps reading to the end: the pipe never fills up
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if ready in line:
                is_ready.set()
        is_ready.set()  # it exited: stop waiting, the check below tells

    reader = threading.Thread(target=drain, name=f"{what}-output", daemon=True)
    reader.start()
    try:
        if not is_ready.wait(START_TIMEOUT_S) or process.poll() is not None:
            raise RuntimeError(
                f"{what} did not start within {START_TIMEOUT_S:.0f}s:\n{''.join(output[-30:])}"
            )
        yield process
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
        reader.join(STOP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def running_nats(directory: Path, pki: Pki) -> Iterator[TlsServer]:
    """nats-server with JetStream (memory and files in ``directory``) on a free loopback
    port, TLS required (``pki``'s server certificate), user :data:`USER` with
    :data:`PASSWORD`."""
    port = free_port()
    config = directory / "nats.conf"
    config.write_text(
        f"""
listen: "127.0.0.1:{port}"
tls {{
  cert_file: "{pki.cert}"
  key_file: "{pki.key}"
  timeout: 2
}}
authorization {{
  user: "{USER}"
  password: "{PASSWORD}"
}}
jetstream {{
  store_dir: "{directory / "jetstream"}"
  max_memory_store: 64MB
  max_file_store: 64MB
}}
"""
    )
    argv = [NATS_SERVER, "-c", str(config)]
    with _process(argv, "Server is ready", "nats-server") as process:
        yield TlsServer("127.0.0.1", port, USER, PASSWORD, process.pid)


@contextmanager
def running_redis(directory: Path, pki: Pki) -> Iterator[TlsServer]:
    """redis-server on a free loopback port, TLS only (no plain port; clients need no
    certificate of their own), ``requirepass`` :data:`PASSWORD` (user ``default``),
    nothing saved to disk."""
    port = free_port()
    argv = [
        REDIS_SERVER,
        "--bind", "127.0.0.1",
        "--port", "0",
        "--tls-port", str(port),
        "--tls-cert-file", pki.cert,
        "--tls-key-file", pki.key,
        "--tls-ca-cert-file", pki.ca,
        "--tls-auth-clients", "no",
        "--requirepass", PASSWORD,
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
    ]  # fmt: skip
    with _process(argv, "Ready to accept connections", "redis-server") as process:
        yield TlsServer("127.0.0.1", port, "default", PASSWORD, process.pid)
