"""The coordinator: registers workers, deploys jobs, injects barriers, follows outcomes.

Layers, bottom up (a module imports only modules on its line or the lines above; ``tests/
test_imports.py`` checks that there is no import cycle):

- :mod:`.errors`; :mod:`.report`: a reconfiguration's report; :mod:`.slot`: one
  reconfiguration of a job at a time, and cancellation; :mod:`.model`, :mod:`.metrics`:
  running jobs, workers, runtime settings.
- :mod:`.ports`: what the layers above need of the coordinator, as Protocols
  (:class:`~.ports.Membership`, :class:`~.ports.JobHost`).
- :mod:`.cluster`: membership: the port, registrations, heartbeats, sending to workers.
- :mod:`.events`, :mod:`.protocol`: the reconfiguration protocol as a pure state machine
  (its events and commands; the machine).
- :mod:`.reconfig` (its asyncio driver) / :mod:`.restart`: live reconfiguration and the
  stop-and-restart baseline; :mod:`.workers`: workers started on demand.
- :mod:`.layouts`, :mod:`.validation`, :mod:`.fluid`, :mod:`.plans`: plans of the
  abstraction validated once and carried out on running jobs, in one run or in steps.
- :mod:`.deployment`: deploying and starting a job; :mod:`.inbox`: what workers tell
  about jobs (deploy answers, outcomes, losses), with :mod:`.recovery` for failures.
- :mod:`.core`: the :class:`Coordinator` (a :class:`~.cluster.Cluster` with jobs: deploy,
  barriers, outcomes), the facade that forwards to the modules above.

Exception tree (:mod:`.errors`)::

    CoordinatorError (RuntimeError)       a request that cannot be carried out
     └── SourceError                      a source that cannot list its partitions
    ReconfigurationError (RuntimeError)   a reconfiguration that cannot start or be cancelled
     └── ReconfigurationBusy              another one runs and the caller would not wait
"""

from .core import Coordinator
from .errors import CoordinatorError, ReconfigurationBusy, ReconfigurationError, SourceError
from .model import RunningJob, RuntimeConfig, WorkerInfo
from .report import RunReport
from .slot import Cancellation
from .validation import ValidatedPlan

__all__ = [
    "Cancellation",
    "Coordinator",
    "CoordinatorError",
    "ReconfigurationBusy",
    "ReconfigurationError",
    "RunReport",
    "RunningJob",
    "RuntimeConfig",
    "SourceError",
    "ValidatedPlan",
    "WorkerInfo",
]
