"""The coordinator's exceptions.

Exception tree::

    CoordinatorError (RuntimeError)       a request that cannot be carried out
     └── SourceError                      a source that cannot list its partitions
    ReconfigurationError (RuntimeError)   a reconfiguration that cannot start or be cancelled
     └── ReconfigurationBusy              another one runs and the caller would not wait
"""

from __future__ import annotations

__all__ = ["CoordinatorError", "ReconfigurationBusy", "ReconfigurationError", "SourceError"]


class CoordinatorError(RuntimeError):
    """A request the coordinator cannot carry out (no workers, unknown job, timeout)."""


class SourceError(CoordinatorError):
    """A job's partitioned source cannot list its partitions (a broker unreachable, a
    topic missing): the job is not submitted; the message names the source and why."""


class ReconfigurationError(RuntimeError):
    """A reconfiguration that cannot start (bad layout, job not running) or be cancelled."""


class ReconfigurationBusy(ReconfigurationError):
    """Another reconfiguration of the same job is running and the caller would not wait."""
