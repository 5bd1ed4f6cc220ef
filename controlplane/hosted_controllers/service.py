"""Controllers: attach (check, store), list, read, start/stop, and the records the host
keeps (views it builds, decisions, outcomes, failures, log lines).

Attaching an uploaded script loads it in the sandboxed process that will then run it (a
:class:`Loader`: the host, :meth:`.host.ControllerHost.load`), so its import-time code
never runs in a throwaway process: it must compile, define exactly one
``controllers.Controller`` subclass and accept its config, else the attach is refused
with the reason and line and nothing is recorded. A built-in is looked up by name in a
throwaway interpreter (``python -m controlplane.hosted_controllers.child --check``, bounded by
:data:`CHECK_TIMEOUT_S`, :func:`controlplane.isolation.run_check`) and started by the
host once attached. Where no sandbox can start, an uploaded script is refused
(:class:`SandboxUnavailable`) before anything of it runs; built-ins are still checked and
run. Functions take the session as a keyword argument and never commit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from controlplane import db, sandbox
from controlplane.config import Settings
from controlplane.errors import BadController, Conflict, NotFound, Unavailable
from controlplane.events import service as events
from controlplane.isolation import python_source, run_check
from controlplane.jobs import service as jobs
from controlplane.jobs.models import TERMINAL_JOB_STATUSES
from controlplane.pagination import fetch_page
from controlplane.reconfigurations.models import (
    TERMINAL_RECONFIGURATION_STATUSES,
    ReconfigurationRecord,
)
from controlplane.statuses import ControllerStatus, DecisionStatus

from .models import ControllerDecision, ControllerLog, ControllerRecord

__all__ = [
    "CHECK_TIMEOUT_S",
    "MAX_LOG_LINES",
    "Loader",
    "SandboxUnavailable",
    "attach",
    "fail",
    "get_controller",
    "list_controllers",
    "list_decisions",
    "list_logs",
    "set_status",
]

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 30.0  # looking a built-in up (imports, constructor) takes at most this
MAX_LOG_LINES = 2000  # log lines kept per controller (older ones are dropped)
MAX_LOG_LINE = 2000  # characters kept of one log line
HISTORY = 50  # outcomes of earlier plans a view carries (plus those the limits count)
MOVES_WINDOW_S = 3600.0  # as controllers.safety: moves per hour count the last hour


class SandboxUnavailable(Unavailable):
    """No sandbox can start on this server (bubblewrap missing, or unable to create its
    namespaces), so uploaded controllers are refused; the message says what to install."""

    code = "sandbox_unavailable"


class Loader(Protocol):
    """Loads an uploaded script in the process that will run the controller (the host)."""

    def load(self, controller_id: int, request: dict[str, Any]) -> dict[str, Any]:
        """Start the controller's process and load ``request`` (``source``, ``filename``,
        ``config``) in it: its ``loaded`` reply (``class``, ``interval_s``), the process
        kept for the controller; :class:`BadController` with the reason and line, and
        no process, if the script does not load."""
        ...

    def discard(self, controller_id: int) -> None:
        """Kill the process :meth:`load` kept (the attach rolled back)."""
        ...


def check_script(
    request: Mapping[str, Any], filename: str, *, settings: Settings
) -> dict[str, Any]:
    """Load the controller in a throwaway process (used for built-ins, our code); its
    ``loaded`` reply, or :class:`BadController` with the reason and line."""
    reply = run_check(
        "controlplane.hosted_controllers.child",
        ["--check", filename],
        json.dumps(dict(request)),
        timeout=CHECK_TIMEOUT_S,
        error=BadController,
        doing=f"{filename}: loading the controller",
        settings=settings,
    )
    if reply.get("type") != "loaded":
        raise BadController(str(reply.get("error")))
    return reply


def attach(
    *,
    session: Session,
    name: str,
    job_id: int,
    filename: str | None,
    data: bytes | None,
    builtin: str | None,
    config: Mapping[str, Any] | None,
    safety: Mapping[str, Any],
    settings: Settings,
    loader: Loader,
) -> ControllerRecord:
    """Check and record a controller for ``job_id``, status ``running``: a script is loaded
    by ``loader`` in the process that will run it (killed if the unit of work rolls back),
    a built-in checked in a throwaway one; the host runs it once the unit of work commits
    (:meth:`.host.ControllerHost.wake`). An uploaded script where no sandbox can start is
    a :class:`SandboxUnavailable`; one that does not load, a :class:`BadController`."""
    from controllers import SafetyConfig

    job = jobs.get_row(session=session, job_id=job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        raise Conflict(f"job {job_id} is {job.status}: attach controllers to a running job")
    if (data is None) == (builtin is None):
        raise BadController("give either a .py file or the name of a built-in, not both")
    try:
        safety = SafetyConfig.from_dict(safety).to_dict()
    except ValueError as exc:
        raise BadController(f"safety: {exc}") from None
    source = None
    if data is not None:
        missing = sandbox.unavailable(settings)
        if missing is not None:
            raise SandboxUnavailable(
                f"this server cannot run uploaded controllers: {missing}; built-in "
                "controllers (builtin=...) still run"
            )
        filename = filename or "controller.py"
        source = python_source(filename, data, error=BadController)
        loaded: dict[str, Any] = {"class": "", "interval_s": 0.0}  # its process says, below
    else:
        filename = None
        request = {"builtin": builtin, "config": config}
        loaded = check_script(request, f"<builtin {builtin}>", settings=settings)
    row = ControllerRecord(
        name=name,
        job_id=job_id,
        builtin=builtin,
        filename=filename,
        source=source,
        class_name=str(loaded["class"]),
        config=dict(config or {}),
        safety=safety,
        interval_s=float(loaded["interval_s"]),
        status=ControllerStatus.RUNNING,
        error=None,
        restarts=0,
        failures=0,
        decisions_without_plan=0,
    )
    session.add(row)
    session.flush()  # the id names the controller's process
    if source is not None:
        controller_id = row.id
        db.after_rollback(session, lambda: loader.discard(controller_id))
        script = {"source": source, "filename": filename, "config": config}
        loaded = loader.load(controller_id, script)
        row.class_name, row.interval_s = str(loaded["class"]), float(loaded["interval_s"])
        session.flush()
    _event(session, row, "attached", f"{builtin or filename} ({row.class_name})")
    logger.info("controller %s (%s) attached to job %s", row.id, row.class_name, job_id)
    return row


def get_controller(*, session: Session, controller_id: int) -> ControllerRecord:
    row = session.get(ControllerRecord, controller_id)
    if row is None:
        raise NotFound(f"controller {controller_id} does not exist")
    return row


def list_controllers(
    *, session: Session, limit: int, offset: int, job_id: int | None = None
) -> tuple[list[ControllerRecord], int]:
    query = select(ControllerRecord)
    if job_id is not None:
        query = query.where(ControllerRecord.job_id == job_id)
    return fetch_page(session, query, ControllerRecord.id.desc(), limit, offset)


def set_status(
    *, session: Session, controller_id: int, status: str, error: str | None = None
) -> ControllerRecord:
    """Start (``running``: failures reset) or stop a controller; starting one whose job has
    ended is a :class:`Conflict`."""
    row = get_controller(session=session, controller_id=controller_id)
    if status == ControllerStatus.RUNNING:
        job = jobs.get_row(session=session, job_id=row.job_id)
        if job.status in TERMINAL_JOB_STATUSES:
            raise Conflict(f"job {row.job_id} is {job.status}: its controllers cannot run any more")
        row.failures = 0
    if row.status != status:
        _event(
            session, row, "started" if status == ControllerStatus.RUNNING else status, error or ""
        )
    row.status, row.error = status, error
    session.flush()
    return row


def fail(*, session: Session, controller_id: int, reason: str) -> ControllerRecord:
    """Mark a ``running`` controller ``failed`` with ``reason`` (its host cannot run it);
    one in another status is left as it is."""
    row = get_controller(session=session, controller_id=controller_id)
    if row.status == ControllerStatus.RUNNING:
        row.status, row.error = ControllerStatus.FAILED, reason
        _event(session, row, "failed", reason)
        session.flush()
    return row


def _event(session: Session, row: ControllerRecord, what: str, detail: str) -> None:
    events.record(
        session=session,
        kind=f"controller.{what}",
        job_id=row.job_id,
        message=f"controller {row.id} ({row.name}) of job {row.job_id} {what}"
        + (f": {detail}" if detail else ""),
        data={"controller": row.id},
    )


def list_decisions(
    *, session: Session, controller_id: int, limit: int, offset: int
) -> tuple[list[ControllerDecision], int]:
    get_controller(session=session, controller_id=controller_id)
    query = select(ControllerDecision).where(ControllerDecision.controller_id == controller_id)
    return fetch_page(session, query, ControllerDecision.id.desc(), limit, offset)


def list_logs(
    *, session: Session, controller_id: int, limit: int, offset: int
) -> tuple[list[ControllerLog], int]:
    get_controller(session=session, controller_id=controller_id)
    query = select(ControllerLog).where(ControllerLog.controller_id == controller_id)
    return fetch_page(session, query, ControllerLog.id.desc(), limit, offset)


# -- what the host records -------------------------------------------------------------------


def add_logs(*, session: Session, controller_id: int, lines: list[tuple[str, str]]) -> None:
    """Append (source, message) lines, keeping the newest :data:`MAX_LOG_LINES`."""
    for source, message in lines:
        session.add(
            ControllerLog(
                controller_id=controller_id, source=source, message=message[:MAX_LOG_LINE]
            )
        )
    session.flush()
    count = session.scalar(select(func.count()).where(ControllerLog.controller_id == controller_id))
    if count and count > MAX_LOG_LINES:
        cutoff = session.scalar(
            select(ControllerLog.id)
            .where(ControllerLog.controller_id == controller_id)
            .order_by(ControllerLog.id.desc())
            .offset(MAX_LOG_LINES)
            .limit(1)
        )
        session.execute(
            delete(ControllerLog).where(
                ControllerLog.controller_id == controller_id, ControllerLog.id <= cutoff
            )
        )


def history(*, session: Session, controller_id: int) -> list[dict[str, Any]]:
    """The outcomes a view carries, oldest first: the last :data:`HISTORY` ones, and every
    applied or dry-run one of the last hour (the safety limits count those, so refusals
    must not push them out)."""
    ended = (
        ControllerDecision.controller_id == controller_id,
        ControllerDecision.status != DecisionStatus.PENDING,
    )
    recent = select(ControllerDecision).where(*ended).order_by(ControllerDecision.id.desc())
    hour_ago = datetime.now(UTC) - timedelta(seconds=MOVES_WINDOW_S)
    counted = select(ControllerDecision).where(
        *ended,
        ControllerDecision.status != DecisionStatus.REFUSED,
        ControllerDecision.time >= hour_ago,
    )
    rows = {r.id: r for r in session.scalars(recent.limit(HISTORY))}
    rows.update({r.id: r for r in session.scalars(counted)})
    return [outcome_of(rows[i]) for i in sorted(rows)]


def outcome_of(row: ControllerDecision) -> dict[str, Any]:
    """The ``controllers.Outcome`` JSON of a decided plan."""
    ended = row.ended_at or row.time
    return {
        "time": ended.timestamp(),
        "plan": row.plan,
        "status": row.status,
        "error": row.error,
        "moves": row.moves,
        "reconfiguration_id": row.reconfiguration_id,
    }


def record_decision(
    *,
    session: Session,
    controller_id: int,
    view: dict[str, Any],
    plan: dict[str, Any],
    status: str,
    moves: int,
    error: str | None = None,
    reconfiguration_id: int | None = None,
) -> ControllerDecision:
    row = ControllerDecision(
        controller_id=controller_id,
        view=view,
        plan=plan,
        status=status,
        applied=reconfiguration_id is not None,
        moves=moves,
        reconfiguration_id=reconfiguration_id,
        error=error,
        ended_at=None if status == DecisionStatus.PENDING else datetime.now(UTC),
    )
    session.add(row)
    session.flush()
    return row


def settle_decision(*, session: Session, decision_id: int) -> ControllerDecision | None:
    """The decision, ended if its reconfiguration has; None while it is still under way."""
    row = session.get(ControllerDecision, decision_id)
    if row is None or row.status != DecisionStatus.PENDING:
        return row
    rec = (
        session.get(ReconfigurationRecord, row.reconfiguration_id)
        if row.reconfiguration_id
        else None
    )
    if rec is None:
        row.status, row.error, row.ended_at = (
            "failed",
            "its reconfiguration is gone",
            datetime.now(UTC),
        )
    elif rec.status in TERMINAL_RECONFIGURATION_STATUSES:
        row.status, row.error, row.ended_at = rec.status, rec.error, datetime.now(UTC)
    else:
        return None
    session.flush()
    return row


def settle_pending(*, session: Session, controller_id: int) -> int:
    """Settle the controller's decisions still ``pending`` whose reconfiguration has ended
    (one submitted just before a stop or a restart); returns how many."""
    pending = session.scalars(
        select(ControllerDecision.id).where(
            ControllerDecision.controller_id == controller_id,
            ControllerDecision.status == DecisionStatus.PENDING,
        )
    )
    settled = [settle_decision(session=session, decision_id=i) for i in list(pending)]
    return sum(1 for d in settled if d is not None)


def note_decided(*, session: Session, controller_id: int, with_plan: bool) -> None:
    row = get_controller(session=session, controller_id=controller_id)
    row.last_decision_at = datetime.now(UTC)
    if not with_plan:
        row.decisions_without_plan += 1


def note_failure(
    *, session: Session, controller_id: int, reason: str, max_failures: int, restarted: bool
) -> ControllerRecord:
    """Count a failure (and a restart of its process); past ``max_failures`` in a row the
    controller is marked ``failed`` with the reason."""
    row = get_controller(session=session, controller_id=controller_id)
    row.failures += 1
    row.restarts += int(restarted)
    row.error = reason
    if row.failures >= max_failures and row.status == ControllerStatus.RUNNING:
        row.status = ControllerStatus.FAILED
        row.error = f"{row.failures} failures in a row; last: {reason}"
        _event(session, row, "failed", row.error)
    session.flush()
    return row


def note_success(*, session: Session, controller_id: int) -> None:
    row = get_controller(session=session, controller_id=controller_id)
    if row.failures:
        row.failures = 0


def running_ids(*, session: Session) -> list[int]:
    return list(
        session.scalars(
            select(ControllerRecord.id).where(ControllerRecord.status == ControllerStatus.RUNNING)
        )
    )
