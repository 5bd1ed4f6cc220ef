"""The coordinator's exceptions.

Exception tree::

    CoordinatorError (RuntimeError)       a request that cannot be carried out
    ReconfigurationError (RuntimeError)   a reconfiguration that cannot start or be cancelled
     └── ReconfigurationBusy              another one runs and the caller would not wait
"""

from __future__ import annotations

__all__ = ["CoordinatorError", "ReconfigurationBusy", "ReconfigurationError"]


class CoordinatorError(RuntimeError):
    """A request the coordinator cannot carry out (no workers, unknown job, timeout)."""


class ReconfigurationError(RuntimeError):
    """A reconfiguration that cannot start (bad layout, job not running) or be cancelled."""


class ReconfigurationBusy(ReconfigurationError):
    """Another reconfiguration of the same job is running and the caller would not wait."""
