"""The exceptions of the StreamManager's services (HTTP-free; mapped in :mod:`.http`).

Services, the engine and auth raise these; :mod:`controlplane.http` is the one place that
turns them into HTTP responses ``{"error": {"code", "message"}}``. Each carries a message
a person can act on and a stable machine ``code``.

Exception tree::

    ServiceError (Exception)         anything a service refuses; .code, .message
    ├── NotFound                     an unknown job, abstraction version, reconfiguration
    ├── InvalidRequest               input that cannot be carried out as given
    │   ├── BadJob                   job ref, params or graph refused (codes: bad_job_ref,
    │   │                            bad_params, invalid_job, job_build_failed,
    │   │                            sink_path_refused, bad_source: a partitioned
    │   │                            source that cannot list its partitions)
    │   ├── BadCode                  an uploaded module that is not UTF-8 Python importing
    │   │                            cleanly (the message names the file and line)
    │   ├── BadController            a controller script or built-in that cannot be loaded
    │   │                            (the message names the file, line and reason)
    │   └── PlanRefused              a plan refused by validation (code: the PlanError's
    │                                kind, e.g. key_group_conflict, unknown_worker, no_change)
    ├── Conflict                     valid, but not now
    │   ├── StaleBaseVersion         the plan's base_version is not current
    │   ├── ReconfigurationInProgress   another reconfiguration of the job is under way
    │   ├── JobNotRunning            the job has ended or is not running yet
    │   ├── NotCancellable           a reconfiguration that has ended or cannot stop now
    │   ├── WorkerBusy               a worker to drain still hosts tasks of a running job
    │   └── WorkerLimit              starting workers would pass the server's maximum
    ├── Unavailable                  the cluster cannot take it now (no workers, shutting down)
    ├── Unauthenticated              no bearer token, or an unknown one
    ├── Forbidden                    a token without the scope the endpoint (or what the
    │                                request does, e.g. a plan starting workers) needs
    └── PayloadTooLarge              a request body over the server's limit
"""

from __future__ import annotations

import re

from controlplane.abstraction import AbstractionError, StaleVersion

__all__ = [
    "BadCode",
    "BadController",
    "BadJob",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "JobNotRunning",
    "NotCancellable",
    "NotFound",
    "PayloadTooLarge",
    "PlanRefused",
    "ReconfigurationInProgress",
    "ServiceError",
    "StaleBaseVersion",
    "Unauthenticated",
    "Unavailable",
    "WorkerBusy",
    "WorkerLimit",
    "from_abstraction_error",
]


class ServiceError(Exception):
    """Base of the tree. ``code`` is a stable snake_case identifier for programs; the
    message (``str(exc)``, also ``.message``) is for people and says what to fix."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotFound(ServiceError):
    code = "not_found"


class InvalidRequest(ServiceError):
    code = "invalid_request"


class BadJob(InvalidRequest):
    code = "invalid_job"


class BadCode(InvalidRequest):
    code = "bad_code"


class BadController(InvalidRequest):
    code = "bad_controller"


class PlanRefused(InvalidRequest):
    code = "invalid_plan"


class Conflict(ServiceError):
    code = "conflict"


class StaleBaseVersion(Conflict):
    code = "stale_version"


class ReconfigurationInProgress(Conflict):
    code = "reconfiguration_in_progress"


class JobNotRunning(Conflict):
    code = "job_not_running"


class NotCancellable(Conflict):
    code = "not_cancellable"


class WorkerBusy(Conflict):
    code = "worker_busy"


class WorkerLimit(Conflict):
    code = "worker_limit"


class Unavailable(ServiceError):
    code = "unavailable"


class Unauthenticated(ServiceError):
    code = "unauthenticated"


class Forbidden(ServiceError):
    code = "forbidden"


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def from_abstraction_error(exc: AbstractionError) -> ServiceError:
    """The service error for a plan the abstraction refused: :class:`StaleBaseVersion` for
    a stale base version, else :class:`PlanRefused` coded after the refusal's kind
    (``KeyGroupConflict`` -> ``key_group_conflict``, ``SchemaError`` -> ``schema_error``).
    The message is the abstraction's, which names the operation, key group, task or worker
    at fault."""
    if isinstance(exc, StaleVersion):
        return StaleBaseVersion(str(exc))
    return PlanRefused(str(exc), code=_snake(type(exc).__name__))
