"""A real S3 server for tests: moto's, served from a thread of the test process on
127.0.0.1 and a free port.

    with running_s3_server() as s3:
        s3.create_bucket("checkpoints")
        store = ArrowStore(s3.uri("checkpoints", "job-1"))

:meth:`S3Server.uri` carries everything pyarrow needs (credentials as user info, the
endpoint, plain http, a region, so nothing asks AWS), so the URI alone also works in a
child process. Credentials are fixed test values; moto accepts any. Buckets are made
through pyarrow with ``allow_bucket_creation``, which stores never set;
:meth:`S3Server.client` gives a boto3 client for what pyarrow does not show, such as
incomplete multipart uploads.

Served in-process, since pyarrow releases the GIL while it waits for the server. moto
keeps the buckets in memory, in one store for the whole process, until it exits: use a
fresh prefix or bucket per test. Leaving the ``with`` block stops the server and waits
for its threads (the serving loop, one per open connection) to end. werkzeug logs each
request at INFO; its logger is raised to WARNING to keep that quiet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
from moto.server import ThreadedMotoServer

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Server", "running_s3_server"]

ACCESS_KEY = "streampilot-test"
SECRET_KEY = "streampilot-test-secret"
REGION = "us-east-1"
STOP_TIMEOUT_S = 10  # the serve loop polls for shutdown every 0.5 s
# Threads are named after their target: the serving loop, and one per connection.
SERVER_THREADS = ("(_server_entry)", "(process_request_thread)")


@dataclass(frozen=True)
class S3Server:
    """A running server: ``endpoint`` is ``host:port``."""

    endpoint: str

    def query(self, **extra: str) -> str:
        """The URI query that points pyarrow at this server."""
        params = {"endpoint_override": self.endpoint, "scheme": "http", "region": REGION}
        return "&".join(f"{k}={v}" for k, v in {**params, **extra}.items())

    def uri(self, bucket: str, prefix: str = "") -> str:
        """``s3://`` URI of ``prefix`` in ``bucket`` on this server, with credentials."""
        path = f"{bucket}/{prefix}" if prefix else bucket
        return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{path}?{self.query()}"

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow filesystem of the whole server, allowed to create buckets."""
        fs, _ = pafs.FileSystem.from_uri(
            f"s3://{ACCESS_KEY}:{SECRET_KEY}@?{self.query(allow_bucket_creation='true')}"
        )
        return fs

    def create_bucket(self, bucket: str) -> None:
        self.filesystem().create_dir(bucket)

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        import boto3  # moto's dependency; only the tests that look under pyarrow need it

        return boto3.client(
            "s3",
            endpoint_url=f"http://{self.endpoint}",
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Serve S3 on 127.0.0.1 (a free port) for the ``with`` block."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    before = set(threading.enumerate())
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(endpoint=f"{host}:{port}")
    finally:
        server.stop()
        for thread in set(threading.enumerate()) - before:
            if thread.name.endswith(SERVER_THREADS):
                thread.join(timeout=STOP_TIMEOUT_S)
                if thread.is_alive():
                    raise RuntimeError(f"the S3 server left thread {thread.name!r} running")
