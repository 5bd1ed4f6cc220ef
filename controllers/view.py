"""What a controller sees each period (:class:`View`) and what became of its plans
(:class:`Outcome`); both frozen and JSON round-tripping, so the host can ship them to the
controller's subprocess.

The JSON form of a view (``View.to_dict()``; ``View.from_dict`` reads it back equal)::

    {
      "job_id": "7",                      # the abstraction's job id (str of the database id)
      "now": 1795000000.0,                # the host's clock, seconds since the epoch
      "abstraction": {...},               # GET /api/v1/jobs/7/abstraction (Abstraction.to_dict)
      "metrics": {...} | null,            # GET /api/v1/jobs/7/metrics (JobMetricsRead); null:
                                          #   nothing reported yet (an empty window)
      "workers": [{...}, ...],            # optional, Worker.to_dict each; default: the
                                          #   abstraction's workers
      "history": [                        # optional, oldest first; this controller's plans
        {"time": 1794999940.0, "plan": {...Plan.to_dict()},
         "status": "completed", "error": null, "moves": 12, "reconfiguration_id": 31}
      ]
    }

Fields beyond these are ignored (the REST responses may grow); a missing or mistyped one
raises :class:`~controllers.errors.ViewError` naming its path, and so do parts that
belong to different jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.abstraction import Abstraction, AbstractionError, Plan, Worker

from . import _json as js
from .errors import ViewError
from .metrics import MetricsWindow

__all__ = ["APPLIED_STATUSES", "OUTCOME_STATUSES", "Outcome", "View"]

OUTCOME_STATUSES = ("completed", "failed", "aborted", "refused", "dry_run")
# Outcomes that count as a reconfiguration of the job for the safety limits: the ones that
# reached it, and dry-run decisions (so a dry run records what would really be applied).
APPLIED_STATUSES = frozenset({"completed", "failed", "aborted", "dry_run"})


def _wrap(path: str, read: Any, value: Any) -> Any:
    """``read(value)`` with the abstraction package's SchemaError turned into a ViewError."""
    try:
        return read(value)
    except AbstractionError as exc:
        raise ViewError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Outcome:
    """What became of one plan a controller returned.

    ``status``: ``completed`` / ``failed`` / ``aborted`` (the reconfiguration's end),
    ``refused`` (by validation or the safety limits; ``error`` says why) or ``dry_run``
    (recorded, not applied). ``time`` is when the outcome was known (seconds since the
    epoch); ``moves`` the key groups the plan moves (the host records
    :attr:`controllers.safety.Verdict.moves`); ``reconfiguration_id`` the reconfiguration
    it became, if any.
    """

    time: float
    plan: Plan
    status: str
    error: str | None = None
    moves: int = 0
    reconfiguration_id: int | None = None

    def __post_init__(self) -> None:
        if self.status not in OUTCOME_STATUSES:
            raise ViewError(
                f"outcome status {self.status!r} is not one of {', '.join(OUTCOME_STATUSES)}"
            )

    @property
    def applied(self) -> bool:
        """True if the plan reached the job (or would have: dry run); see APPLIED_STATUSES."""
        return self.status in APPLIED_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "plan": self.plan.to_dict(),
            "status": self.status,
            "error": self.error,
            "moves": self.moves,
            "reconfiguration_id": self.reconfiguration_id,
        }

    @classmethod
    def from_dict(cls, data: Any, path: str = "outcome") -> Outcome:
        d = js.obj(data, path)
        rid = js.field(d, "reconfiguration_id", path, None)
        return cls(
            js.number(js.field(d, "time", path), f"{path}.time"),
            _wrap(f"{path}.plan", Plan.from_dict, js.field(d, "plan", path)),
            _status(js.field(d, "status", path), f"{path}.status"),
            js.opt_string(js.field(d, "error", path, None), f"{path}.error"),
            js.integer(js.field(d, "moves", path, 0), f"{path}.moves"),
            None if rid is None else js.integer(rid, f"{path}.reconfiguration_id"),
        )


def _status(value: Any, path: str) -> str:
    if value not in OUTCOME_STATUSES:
        raise ViewError(f"{path}: expected one of {', '.join(OUTCOME_STATUSES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class View:
    """One period's view of a job, given to ``on_start`` and ``decide``.

    ``abstraction`` is the job's current version (build plans against it); ``metrics`` the
    recent window; ``workers`` the workers the job may use (those a plan may name);
    ``history`` this controller's earlier outcomes, oldest first; ``now`` the host's clock
    (use it, not ``time.time()``, so decisions replay from recorded views).
    """

    job_id: str
    abstraction: Abstraction
    metrics: MetricsWindow
    workers: tuple[Worker, ...]
    history: tuple[Outcome, ...]
    now: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "history", tuple(self.history))
        if self.abstraction.job_id != self.job_id:
            raise ViewError(
                f"view of job {self.job_id!r} holds the abstraction of job "
                f"{self.abstraction.job_id!r}"
            )
        if self.metrics.samples and str(self.metrics.job_id) != self.job_id:
            raise ViewError(
                f"view of job {self.job_id!r} holds the metrics of job {self.metrics.job_id!r}"
            )

    @classmethod
    def of(
        cls,
        abstraction: Abstraction,
        metrics: MetricsWindow | None = None,
        *,
        now: float,
        history: Iterable[Outcome] = (),
        workers: Iterable[Worker] | None = None,
    ) -> View:
        """A view of ``abstraction``'s job (for tests and replays): no metrics means an
        empty window, no workers the abstraction's."""
        return cls(
            abstraction.job_id,
            abstraction,
            metrics or MetricsWindow.empty(abstraction.job_id),
            tuple(abstraction.workers if workers is None else workers),
            tuple(history),
            now,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "now": self.now,
            "abstraction": self.abstraction.to_dict(),
            "metrics": self.metrics.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
            "history": [o.to_dict() for o in self.history],
        }

    @classmethod
    def from_dict(cls, data: Any) -> View:
        """Read the JSON form (module docstring); :class:`ViewError` names a bad field."""
        d = js.obj(data, "view")
        job_id = js.field(d, "job_id", "view")
        if not isinstance(job_id, int | str) or isinstance(job_id, bool):
            raise ViewError(f"view.job_id: expected a string, got {job_id!r}")
        abstraction = _wrap(
            "view.abstraction", Abstraction.from_dict, js.field(d, "abstraction", "view")
        )
        metrics = js.field(d, "metrics", "view", None)
        workers = js.field(d, "workers", "view", None)
        history = js.array(js.field(d, "history", "view", []), "view.history")
        return cls(
            str(job_id),
            abstraction,
            MetricsWindow.empty(str(job_id))
            if metrics is None
            else MetricsWindow.from_dict(metrics, "view.metrics"),
            abstraction.workers
            if workers is None
            else tuple(
                _wrap(f"view.workers[{i}]", Worker.from_dict, w)
                for i, w in enumerate(js.array(workers, "view.workers"))
            ),
            tuple(Outcome.from_dict(o, f"view.history[{i}]") for i, o in enumerate(history)),
            js.number(js.field(d, "now", "view"), "view.now"),
        )
