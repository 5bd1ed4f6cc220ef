"""The coordinator: registers workers, deploys jobs, injects barriers, follows outcomes.

Exception tree::

    CoordinatorError (RuntimeError)   a request that cannot be carried out
"""

from .core import Coordinator, CoordinatorError, Job, RuntimeConfig, WorkerInfo

__all__ = [
    "Coordinator",
    "CoordinatorError",
    "Job",
    "RuntimeConfig",
    "WorkerInfo",
]
