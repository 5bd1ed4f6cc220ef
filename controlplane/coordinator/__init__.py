"""The coordinator: registers workers, deploys jobs, injects barriers, follows outcomes.

Layers, bottom up (a module imports only modules on its line or the lines above; ``tests/
test_imports.py`` checks that there is no import cycle):

- :mod:`.model`, :mod:`.metrics`: jobs, workers, runtime settings, the error.
- :mod:`.ports`: what the layers above need of the coordinator, as Protocols
  (:class:`~.ports.Membership`, :class:`~.ports.JobHost`).
- :mod:`.cluster`: membership: the port, registrations, heartbeats, sending to workers.
- :mod:`.reconfig` / :mod:`.restart`: live reconfiguration and the stop-and-restart
  baseline; :mod:`.workers`: workers started on demand.
- :mod:`.layouts`, :mod:`.fluid`, :mod:`.plans`: plans of the abstraction carried out on
  running jobs, in one run or in steps.
- :mod:`.core`: the :class:`Coordinator` (a :class:`~.cluster.Cluster` with jobs: deploy,
  barriers, outcomes), the facade that forwards to the modules above.

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
