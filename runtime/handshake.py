"""The handshake every TCP connection of a cluster starts with: both ends prove that they
hold the key of what the connection is for, without sending it, before anything else is
read (nothing is msgpack-decoded, let alone unpickled, from a peer that has not).

A mutual challenge-response with HMAC-SHA256, over raw bytes, in three messages:

1. server -> ``greeting``: ``MAGIC`` (4 bytes: ``b"SPH"`` and the version) and a fresh
   32-byte server nonce.
2. client -> ``proof``: ``MAGIC``, the context (what the connection is for, 1 length byte
   then 1-``MAX_CONTEXT`` printable ASCII bytes: ``"control"``, ``"heartbeat:<worker>"``,
   ``"data:<job>@<attempt>"``: the attempt is which deployment of the job the connection
   belongs to, see :func:`data_context`), a fresh 32-byte client nonce and
   ``HMAC(key, b"streampilot client\\0" + greeting + the proof so far)``. The server
   picks the key by the context (:func:`control_key`, :func:`data_key`) and checks the MAC.
3. server -> ``answer``: ``HMAC(key, b"streampilot server\\0" + greeting + the whole
   proof)``: the client checks that the server holds the key too.

Both ends fail closed: anything else (another magic, a context the server does not take, a
wrong MAC, more than the message needs) raises :class:`HandshakeError`, and the caller
closes the connection without saying why. A server reads at most ``MAX_PROOF`` bytes
before the client has proved itself and gives it ``HANDSHAKE_TIMEOUT_S`` to do so. Then
the connection's own protocol (:mod:`runtime.protocol`) starts; when TLS is on, all of
this runs inside it.

:class:`ServerHandshake` and :class:`ClientHandshake` are pure (bytes in, bytes out, no
I/O); :func:`accept`, :func:`dial` (asyncio streams) and :func:`dial_socket` (a blocking
socket) drive them. :class:`TlsFiles` (:func:`server_tls`, :func:`client_tls`) builds
the TLS contexts.

Exception tree::

    HandshakeError (ConnectionError)   the peer did not prove itself; close the connection
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import secrets
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StreamRuntimeError

__all__ = [
    "FIRST_ATTEMPT",
    "HANDSHAKE_TIMEOUT_S",
    "MAX_CONTEXT",
    "MAX_PROOF",
    "ClientHandshake",
    "HandshakeError",
    "RefusalLog",
    "ServerHandshake",
    "TlsFiles",
    "accept",
    "client_tls",
    "control_key",
    "data_context",
    "data_key",
    "data_of_context",
    "dial",
    "dial_socket",
    "server_tls",
]

VERSION = 1
MAGIC = b"SPH" + bytes([VERSION])
NONCE = 32
MAC = 32
MAX_CONTEXT = 128
GREETING = len(MAGIC) + NONCE
MAX_PROOF = len(MAGIC) + 1 + MAX_CONTEXT + NONCE + MAC  # 197 bytes
# A server drops a peer that has not proved itself within this: an honest client needs
# one round trip, and a stranger holds a connection (and its few buffered bytes) no longer.
HANDSHAKE_TIMEOUT_S = 5.0
# A client waits this long for the server's part: a worker's loop may be busy for a while
# in a long user function call, and waiting costs an honest client nothing.
CLIENT_TIMEOUT_S = 30.0
# Refused connections are logged at debug level, and as one warning at most this often
# (with how many): a port scan or a flood of strangers must not flood the log.
REFUSAL_WARNING_EVERY_S = 60.0

_CLIENT_LABEL = b"streampilot client\0"
_SERVER_LABEL = b"streampilot server\0"
_DATA_CONTEXT = re.compile(r"data:(.+)@([1-9][0-9]{0,17})")
FIRST_ATTEMPT = 1  # a job's first deployment; each later one (a recovery...) is one more


class HandshakeError(StreamRuntimeError, ConnectionError):
    """The peer did not prove that it holds the key (or did not speak this protocol)."""


def control_key(secret: str) -> bytes:
    """The key of the connections between workers and the coordinator."""
    return hmac.digest(secret.encode(), b"streampilot control", "sha256")


def data_key(secret: str, job_id: str) -> bytes:
    """The key of the data connections of job ``job_id`` (worker to worker): a connection
    made with it carries that job's frames only."""
    return hmac.digest(secret.encode(), b"streampilot data " + job_id.encode(), "sha256")


def data_context(job_id: str, attempt: int = FIRST_ATTEMPT) -> str:
    """The context of a data connection of job ``job_id`` made by its tasks of deployment
    ``attempt`` (the coordinator's count of the job's deployments: a receiving worker
    refuses connections of an earlier one than it runs, see :mod:`runtime.dataserver`)."""
    if attempt < FIRST_ATTEMPT:
        raise ValueError(f"a job's deployments count from {FIRST_ATTEMPT}, not {attempt}")
    return f"data:{job_id}@{attempt}"


def data_of_context(context: str) -> tuple[str, int] | None:
    """The job and the attempt a data connection's context names, or None for any other
    context."""
    named = _DATA_CONTEXT.fullmatch(context)
    return None if named is None else (named[1], int(named[2]))


def _check_context(length: int, context: bytes) -> None:
    """Raise unless ``context`` (what came so far of one of ``length`` bytes) can be one."""
    if not 1 <= length <= MAX_CONTEXT or not all(0x21 <= b <= 0x7E for b in context):
        raise HandshakeError(
            f"a handshake context is 1 to {MAX_CONTEXT} printable ASCII characters"
        )


class ServerHandshake:
    """The accepting end. Send :meth:`greeting`, then give :meth:`receive` the bytes that
    come (at most :attr:`wanted` at a time, to read nothing past the proof); once it
    returns the answer (send it), :attr:`context` says what the connection is for.

    ``key_for(context)`` gives the key of a context, or None to refuse it.
    """

    def __init__(self, key_for: Callable[[str], bytes | None], nonce: bytes | None = None) -> None:
        self._key_for = key_for
        self._greeting = MAGIC + (nonce or secrets.token_bytes(NONCE))
        self._got = bytearray()
        self.context: str | None = None  # set once the client has proved itself

    def greeting(self) -> bytes:
        return self._greeting

    @property
    def wanted(self) -> int:
        """How many more bytes the proof needs at least (0 once it is complete)."""
        if self.context is not None:
            return 0
        head = len(MAGIC) + 1
        if len(self._got) < head:
            return head - len(self._got)
        return head + self._got[head - 1] + NONCE + MAC - len(self._got)

    def receive(self, data: bytes) -> bytes:
        """Take bytes of the client's proof; returns the answer to send once it is
        complete and right, else b"". Raises :class:`HandshakeError` on anything wrong,
        including bytes past the proof."""
        if self.context is not None or len(data) > self.wanted:
            raise HandshakeError("the peer sent more than a handshake")
        self._got += data
        got = bytes(self._got)
        if not MAGIC.startswith(got[: len(MAGIC)]):
            raise HandshakeError("the peer does not speak the streampilot handshake")
        n = len(MAGIC)
        if len(got) > n:
            _check_context(got[n], got[n + 1 : n + 1 + got[n]])
        if self.wanted:
            return b""
        head, mac = got[:-MAC], got[-MAC:]
        context = head[len(MAGIC) + 1 : -NONCE].decode("ascii")
        key = self._key_for(context)
        if key is None:
            raise HandshakeError(f"no connection for {context!r} is taken here")
        expected = hmac.digest(key, _CLIENT_LABEL + self._greeting + head, "sha256")
        if not hmac.compare_digest(mac, expected):
            raise HandshakeError(f"wrong key for {context!r}")
        self.context = context
        return hmac.digest(key, _SERVER_LABEL + self._greeting + got, "sha256")


class ClientHandshake:
    """The dialling end, with ``key`` for ``context``. Give :meth:`receive` the server's
    bytes (at most :attr:`wanted` at a time): it returns the proof to send once the
    greeting is complete, and sets :attr:`done` once the server's answer checks out."""

    def __init__(self, key: bytes, context: str, nonce: bytes | None = None) -> None:
        raw = context.encode("utf-8", errors="surrogatepass")
        _check_context(len(raw), raw)
        self._key = key
        self._head = MAGIC + bytes([len(raw)]) + raw + (nonce or secrets.token_bytes(NONCE))
        self._got = bytearray()
        self._proof = b""
        self.done = False

    @property
    def wanted(self) -> int:
        return 0 if self.done else (GREETING if not self._proof else MAC) - len(self._got)

    def receive(self, data: bytes) -> bytes:
        """Take the server's bytes; returns the proof to send (once), else b"". Raises
        :class:`HandshakeError` when the server is not one holding the key."""
        if self.done or len(data) > self.wanted:
            raise HandshakeError("the server sent more than a handshake")
        self._got += data
        if not self._proof and not MAGIC.startswith(bytes(self._got[: len(MAGIC)])):
            raise HandshakeError("the server does not speak the streampilot handshake")
        if self.wanted:
            return b""
        got, self._got = bytes(self._got), bytearray()
        if not self._proof:
            self._greeting = got
            mac = hmac.digest(self._key, _CLIENT_LABEL + got + self._head, "sha256")
            self._proof = self._head + mac
            return self._proof
        expected = hmac.digest(self._key, _SERVER_LABEL + self._greeting + self._proof, "sha256")
        if not hmac.compare_digest(got, expected):
            raise HandshakeError("the server does not hold the key (wrong cluster secret?)")
        self.done = True
        return b""


class RefusalLog:
    """Where a server notes the connections it refused (see ``REFUSAL_WARNING_EVERY_S``)."""

    def __init__(self, logger: logging.Logger, server: str) -> None:
        self._logger = logger
        self._server = server
        self._count = 0
        self._last = -REFUSAL_WARNING_EVERY_S

    def refused(self, peer: Any, exc: BaseException) -> None:
        self._logger.debug("%s refused a connection from %s: %s", self._server, peer, exc)
        self._count += 1
        now = time.monotonic()
        if now - self._last >= REFUSAL_WARNING_EVERY_S:
            self._logger.warning(
                "%s refused %d connection(s) that did not prove the cluster secret, "
                "the last from %s: %s",
                self._server,
                self._count,
                peer,
                exc,
            )
            self._count, self._last = 0, now


# -- drivers --------------------------------------------------------------------------------


async def _read(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise HandshakeError("the peer closed the connection during the handshake") from exc


async def accept(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key_for: Callable[[str], bytes | None],
    timeout_s: float = HANDSHAKE_TIMEOUT_S,
) -> str:
    """Run the server's side on a stream; returns the client's context. Raises
    :class:`HandshakeError` (the caller closes the connection) when the client does not
    prove itself within ``timeout_s``."""
    hs = ServerHandshake(key_for)

    async def run() -> str:
        writer.write(hs.greeting())
        while hs.context is None:
            answer = hs.receive(await _read(reader, hs.wanted))
        writer.write(answer)
        await writer.drain()
        return hs.context

    try:
        return await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        raise HandshakeError(f"no handshake within {timeout_s:g}s") from None
    except HandshakeError:
        raise
    except OSError as exc:
        raise HandshakeError(f"the connection failed during the handshake: {exc}") from exc


async def dial(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    key: bytes,
    context: str,
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> None:
    """Run the client's side on a stream. Raises :class:`HandshakeError` when the server
    does not prove itself within ``timeout_s`` (or refuses our proof by closing)."""
    hs = ClientHandshake(key, context)

    async def run() -> None:
        while not hs.done:
            proof = hs.receive(await _read(reader, hs.wanted))
            if proof:
                writer.write(proof)
                await writer.drain()

    try:
        await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        raise HandshakeError(f"the server did not answer the handshake in {timeout_s:g}s") from None
    except HandshakeError:
        raise
    except OSError as exc:
        raise HandshakeError(f"the connection failed during the handshake: {exc}") from exc


def dial_socket(sock: socket.socket, key: bytes, context: str) -> None:
    """Run the client's side on a blocking socket (its own timeout bounds each read)."""
    hs = ClientHandshake(key, context)
    while not hs.done:
        data = b""
        while len(data) < hs.wanted:
            chunk = sock.recv(hs.wanted - len(data))
            if not chunk:
                raise HandshakeError("the peer closed the connection during the handshake")
            data += chunk
        proof = hs.receive(data)
        if proof:
            sock.sendall(proof)


# -- TLS ------------------------------------------------------------------------------------


def server_tls(cert: Path | str, key: Path | str, ca: Path | str | None = None) -> ssl.SSLContext:
    """The context a listening end serves TLS with: ``cert`` and ``key``; with ``ca``,
    mutual (a client must present a certificate ``ca`` signed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_tls(cert: Path | str, key: Path | str, ca: Path | str | None = None) -> ssl.SSLContext:
    """The context a dialling end uses: it verifies the server against ``ca`` (or, without
    one, against ``cert`` itself: the cluster shares one certificate) and presents
    ``cert`` (which a server with a CA requires). Peers are dialled by address, and every
    certificate ``ca`` signed belongs to the cluster: host names are not checked."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(ca if ca is not None else cert))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of a cluster's TLS: every end presents ``cert`` (with ``key``); with
    ``ca`` TLS is mutual and peers' certificates must chain to it."""

    cert: Path
    key: Path
    ca: Path | None = None

    def server(self) -> ssl.SSLContext:
        return server_tls(self.cert, self.key, self.ca)

    def client(self) -> ssl.SSLContext:
        return client_tls(self.cert, self.key, self.ca)

    def worker_args(self) -> list[str]:
        """The ``runtime.worker`` options that give a worker these files (absolute paths)."""
        args = [
            "--tls-cert",
            str(Path(self.cert).resolve()),
            "--tls-key",
            str(Path(self.key).resolve()),
        ]
        if self.ca is not None:
            args += ["--tls-ca", str(Path(self.ca).resolve())]
        return args
