"""The coordinator: registers workers, deploys jobs, injects barriers, follows outcomes.

Exception tree::

    CoordinatorError (RuntimeError)   a request that cannot be carried out
"""

from .core import Coordinator, CoordinatorError, Job, RuntimeConfig, WorkerInfo
from .placement import Placement, initial_placement

__all__ = [
    "Coordinator",
    "CoordinatorError",
    "Job",
    "Placement",
    "RuntimeConfig",
    "WorkerInfo",
    "initial_placement",
]
