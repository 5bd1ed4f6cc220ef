"""A worker's connections to the coordinator: the control connection it registers on, and
the heartbeat.

:func:`register` dials the coordinator, proves the worker holds the cluster secret
(:mod:`runtime.handshake`), sends its resources (``register``) and waits for the answer;
the connection then carries the coordinator's messages to the worker and its reports
back. :func:`heartbeat`, run in a thread of its own, keeps a second connection that says
"alive" every second, whatever the event loop does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading

from . import handshake, messages, protocol
from .errors import StreamRuntimeError

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "REGISTER_TIMEOUT_S",
    "RegistrationRefused",
    "heartbeat",
    "register",
]

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0  # heartbeats come from a thread: a long UDF call does not stop them
REGISTER_TIMEOUT_S = 10.0  # the coordinator must answer a registration within this time


class RegistrationRefused(StreamRuntimeError, RuntimeError):
    """The coordinator refused this worker (wrong secret, or it said why)."""


async def register(
    coordinator: tuple[str, int],
    secret: str,
    tls: ssl.SSLContext | None,
    resources: messages.Register,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
    """Register with ``coordinator`` (over TLS with ``tls``) as a worker with
    ``resources``; the control connection and the worker id the coordinator gave.

    Raises :class:`RegistrationRefused` when the coordinator does not take the worker's
    proof of ``secret``, refuses it or does not answer within ``REGISTER_TIMEOUT_S``, and
    ``ConnectionError`` when it cannot be reached."""
    where = f"{coordinator[0]}:{coordinator[1]}"
    try:
        reader, writer = await asyncio.open_connection(
            *coordinator,
            ssl=tls,
            ssl_handshake_timeout=REGISTER_TIMEOUT_S if tls else None,
        )
    except ssl.SSLError as exc:
        raise RegistrationRefused(f"TLS with the coordinator at {where} failed: {exc}") from exc
    except OSError as exc:
        raise ConnectionError(f"cannot reach the coordinator at {where}: {exc}") from exc
    try:
        await handshake.dial(
            reader, writer, handshake.control_key(secret), "control", REGISTER_TIMEOUT_S
        )
    except handshake.HandshakeError as exc:
        writer.close()
        raise RegistrationRefused(
            f"the coordinator at {where} did not accept this worker's proof of the cluster "
            f"secret (wrong cluster secret?): {exc}"
        ) from exc
    if not writer.is_closing():
        protocol.write_frame(writer, messages.encode(resources))
    try:
        frame = await asyncio.wait_for(
            protocol.read_frame(reader, "coordinator"), REGISTER_TIMEOUT_S
        )
        reply = messages.decode(frame, "coordinator", messages.ToWorker)
    except (EOFError, TimeoutError) as exc:
        raise RegistrationRefused(
            "the coordinator closed the connection without answering"
        ) from exc
    except messages.MessageError as exc:
        raise RegistrationRefused(str(exc)) from exc
    match reply:
        case messages.Registered(worker_id=worker_id):
            return reader, writer, worker_id
        case messages.Refused(reason=reason):
            raise RegistrationRefused(reason)
        case _:
            raise RegistrationRefused(f"the coordinator answered {reply.TYPE}, not registered")


def heartbeat(
    coordinator: tuple[str, int],
    secret: str,
    tls: ssl.SSLContext | None,
    worker_id: str,
    stop: threading.Event,
) -> None:
    """Thread: a second connection that says "alive" every second, whatever the loop does,
    until ``stop`` is set or the connection fails.

    The event loop may be busy in a long UDF call; the coordinator must still tell a
    slow worker from a dead or hung one (a hung process stops this thread too).
    """
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection(coordinator, timeout=10))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock))
            context = f"heartbeat:{worker_id}"
            handshake.dial_socket(sock, handshake.control_key(secret), context)
            beat = protocol.encode(messages.encode(messages.Heartbeat()))
            while not stop.wait(HEARTBEAT_INTERVAL_S):
                sock.sendall(beat)
    except OSError as exc:  # a HandshakeError too
        logger.info("heartbeat connection ended: %s", exc)
