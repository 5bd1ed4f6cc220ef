"""The worker's command line: its flags, the cluster secret and the TLS contexts.

``python -m runtime.worker`` (see :mod:`runtime.worker`) parses its arguments with
:func:`parse`; a wrong flag, a secret that cannot be read or TLS files that do not load
end the process with argparse's usage error (exit code 2), before anything starts.
"""

from __future__ import annotations

import argparse
import os
import ssl
import stat
from dataclasses import dataclass, field

from . import handshake

__all__ = ["MAX_SECRET_BYTES", "WorkerOptions", "parse", "read_secret"]


@dataclass(frozen=True)
class WorkerOptions:
    """What the command line asks of a worker, checked and loaded."""

    coordinator: tuple[str, int]
    secret: str = field(repr=False)
    server_tls: ssl.SSLContext | None  # serve data connections with TLS
    client_tls: ssl.SSLContext | None  # dial the coordinator and peers with TLS
    host: str
    cpus: float
    memory_mb: int | None
    reserve_mb: int
    name: str | None
    executor_id: str | None
    log_level: str


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of MiB, 0 or more, got {text!r}")
    return int(text)


MAX_SECRET_BYTES = 4096  # a cluster secret is a short string, not a file's worth


def read_secret(fd: int | None = None, path: str | None = None) -> str:
    """The cluster secret, from the inherited file descriptor ``fd`` (read to its end, then
    closed) or from the file ``path``, which must belong to this process's user and be
    unreadable by anyone else. One trailing newline is dropped. Raises ValueError saying
    what is wrong."""
    if fd is not None:
        try:
            with os.fdopen(fd, "rb") as pipe:
                data = pipe.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--secret-fd {fd}: cannot read it: {exc}") from exc
        where = f"--secret-fd {fd}"
    else:
        assert path is not None
        try:
            with open(path, "rb") as file:
                info = os.fstat(file.fileno())
                if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                    raise ValueError(
                        f"--secret-file {path}: it must belong to this user and be readable "
                        f"by no one else (run: chmod 600 {path})"
                    )
                data = file.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"--secret-file {path}: cannot read it: {exc}") from exc
        where = f"--secret-file {path}"
    text = data.decode("utf-8", errors="surrogateescape").removesuffix("\n").removesuffix("\r")
    if not text or len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"{where}: expected the cluster secret, 1 to {MAX_SECRET_BYTES} bytes")
    return text


def parse(argv: list[str] | None, description: str) -> WorkerOptions:
    """The options of ``argv`` (the process's arguments if None), its secret read and its
    TLS files loaded; on an error, argparse prints the usage and exits with code 2."""
    parser = argparse.ArgumentParser(prog="python -m runtime.worker", description=description)
    parser.add_argument(
        "--coordinator", required=True, type=_parse_address, help="HOST:PORT of the coordinator"
    )
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument(
        "--secret-fd",
        type=int,
        metavar="N",
        help="read the cluster secret from inherited file descriptor N (a pipe), then close it",
    )
    secret.add_argument(
        "--secret-file",
        metavar="PATH",
        help="read the cluster secret from PATH (owned by this user, mode 600)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate: serve and dial with TLS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-ca", help="PEM CA that peers' certificates must chain to (mutual TLS)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address peers reach this worker at")
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument(
        "--reserve-mb",
        type=_non_negative,
        default=0,
        help="heap memory (MiB) faulted in at start and kept for state that comes later",
    )
    parser.add_argument("--name", default=None)
    parser.add_argument("--executor-id", default=None, help="the Spark executor hosting it")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    try:
        cluster_secret = read_secret(args.secret_fd, args.secret_file)
    except ValueError as exc:
        parser.error(str(exc))
    if (args.tls_cert is None) != (args.tls_key is None) or (args.tls_ca and not args.tls_cert):
        parser.error("--tls-cert and --tls-key go together (and --tls-ca with them)")
    server_tls = client_tls = None
    if args.tls_cert is not None:
        try:
            server_tls = handshake.server_tls(args.tls_cert, args.tls_key, args.tls_ca)
            client_tls = handshake.client_tls(args.tls_cert, args.tls_key, args.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            parser.error(f"cannot load the TLS files: {exc}")
    return WorkerOptions(
        coordinator=args.coordinator,
        secret=cluster_secret,
        server_tls=server_tls,
        client_tls=client_tls,
        host=args.host,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        reserve_mb=args.reserve_mb,
        name=args.name,
        executor_id=args.executor_id,
        log_level=args.log_level,
    )
