"""Worker backends: what starts and stops worker processes.

Every backend starts the same ``python -m runtime.worker`` program, which dials the
coordinator; the backend only decides where the process runs. Siblings: ``local``
(subprocesses on this machine) and, later, ``spark`` (inside Spark executors).
"""

from .base import BackendError, WorkerBackend
from .local import LocalBackend

__all__ = ["BackendError", "LocalBackend", "WorkerBackend"]
