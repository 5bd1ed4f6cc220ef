"""Worker backends: what starts and stops worker processes.

Every backend starts the same ``python -m runtime.worker`` program, which dials the
coordinator; the backend only decides where the process runs. Siblings: ``local``
(subprocesses on this machine) and ``spark`` (inside long-running Spark tasks; imports
pyspark only when chosen). :func:`make_backend` picks one from the settings.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from runtime.handshake import TlsFiles

from .base import BackendError, RegisteredWorker, WorkerBackend, WorkerRegistry
from .local import LocalBackend

if TYPE_CHECKING:
    from controlplane.config import Settings

__all__ = [
    "BackendError",
    "LocalBackend",
    "RegisteredWorker",
    "WorkerBackend",
    "WorkerRegistry",
    "make_backend",
    "tls_files",
]


def tls_files(settings: Settings) -> TlsFiles | None:
    """The TLS files ``settings`` name (``tls_cert``, ``tls_key``, ``tls_ca``), if any."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return TlsFiles(settings.tls_cert, settings.tls_key, settings.tls_ca)


async def make_backend(
    settings: Settings, coordinator: WorkerRegistry, secret: str
) -> WorkerBackend:
    """The backend ``settings.backend`` names, for a started ``coordinator``. For ``spark``
    this creates the SparkSession (in a thread, bounded: see :func:`.spark.spark_session`),
    which the backend stops when it closes (a session this process already ran is used and
    left running), and raises :class:`BackendError` when Spark cannot start or its master
    cannot be reached. Workers get the TLS files of the settings, if any (see
    :func:`tls_files`); on Spark they must exist at the same paths on the executors."""
    tls = tls_files(settings)
    tls_args = tls.worker_args() if tls is not None else []
    if settings.backend == "spark":
        from .spark import SparkBackend, session_running, spark_session

        owned = not session_running()
        session = await asyncio.to_thread(spark_session, settings.spark_master, settings.spark_conf)
        return SparkBackend(
            coordinator,
            secret,
            session,
            log_level=settings.worker_log_level,
            register_timeout_s=settings.workers_timeout_s,
            owns_session=owned,
            reserve_mb=settings.worker_reserve_mb,
            extra_args=tls_args,
        )
    return LocalBackend(
        coordinator.address,
        secret,
        log_level=settings.worker_log_level,
        reserve_mb=settings.worker_reserve_mb,
        extra_args=tls_args,
    )
