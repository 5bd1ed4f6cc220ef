"""The coordinator: registers workers, deploys jobs, injects barriers, follows outcomes.

- :mod:`.core`: the :class:`Coordinator` (worker connections, deploy, barriers).
- :mod:`.model`: jobs, workers, runtime settings, the error.
- :mod:`.reconfig` / :mod:`.restart`: live reconfiguration and the stop-and-restart baseline.
- :mod:`.plans`: plans of the abstraction carried out on running jobs.

Exception tree::

    CoordinatorError (RuntimeError)   a request that cannot be carried out
"""

from .core import Coordinator
from .model import CoordinatorError, Job, RuntimeConfig, WorkerInfo

__all__ = [
    "Coordinator",
    "CoordinatorError",
    "Job",
    "RuntimeConfig",
    "WorkerInfo",
]
