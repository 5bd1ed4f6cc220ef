"""``/api/v1/jobs/{job_id}/reconfigurations`` and the helpers ``/scale``, ``/rebalance``,
``/migrate``, ``/logic``.

Posting (scope operate) validates at once (422 naming the culprit, 409 for a stale
``base_version`` or a reconfiguration under way) and answers 202 with the ``pending``
record; a plan that starts workers (``"new"``) needs scope admin unless the server lets
operate do it (``operate_starts_workers``), and counts against ``max_workers``; poll ``GET .../reconfigurations/{id}`` until its status is completed, failed,
aborted or cancelled. ``POST .../reconfigurations/{id}/cancel`` (scope operate) stops one
under way at its next safe point; ``POST .../reconfigurations/preview`` (scope operate)
says what one would do without doing it. Reading needs scope read.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from controlplane.auth import service as auth
from controlplane.auth.models import Token
from controlplane.deps import EngineDep, SessionDep, TrackerDep, require
from controlplane.engine import PlanBuilder
from controlplane.errors import PlanRefused
from controlplane.pagination import Page, PageParams
from controlplane.params import JobId, ReconfigurationId

from . import service
from .schemas import (
    LogicRequest,
    MigrateRequest,
    PlanCreate,
    PreviewRead,
    PreviewRequest,
    RebalanceRequest,
    ReconfigurationRead,
    ScaleRequest,
)

__all__ = ["router"]

router = APIRouter(prefix="/jobs/{job_id}", tags=["reconfigurations"])

_operate = [Depends(require("operate"))]


def _may_start_workers(
    request: Request, token: Annotated[Token, Depends(require("operate"))]
) -> bool:
    """Whether the caller's plans may start workers: an admin's, or (when the server
    allows it) an operator's."""
    return auth.grants(token.scopes, "admin") or request.app.state.settings.operate_starts_workers


StartsWorkers = Annotated[bool, Depends(_may_start_workers)]


def _request(
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    job_id: JobId,
    origin: str,
    build: PlanBuilder,
    may_start_workers: bool,
) -> ReconfigurationRead:
    rec = service.request_reconfiguration(
        session=session,
        engine=engine,
        launch=tracker.launch,
        job_id=job_id,
        origin=origin,
        build=build,
        may_start_workers=may_start_workers,
    )
    return ReconfigurationRead.of(rec)


def _builder(
    request: Request,
    body: PlanCreate | ScaleRequest | RebalanceRequest | MigrateRequest | LogicRequest,
) -> PlanBuilder:
    """The plan builder a request describes (the same whether posted or previewed)."""
    match body:
        case PlanCreate():
            most = request.app.state.settings.max_plan_ops
            if len(body.ops) > most:
                raise PlanRefused(
                    f"the plan has {len(body.ops)} operations; this server takes at most "
                    f"{most} in one plan (STREAMPILOT_MAX_PLAN_OPS): split it into several",
                    code="plan_too_large",
                )
            build = service.parse_plan(body.document())
            if body.batch_bytes is not None:
                build = service.paced(build, body.mode, None, body.batch_bytes)
            return build
        case ScaleRequest():
            build = service.scale_plan(body.operator, body.parallelism, body.workers)
        case RebalanceRequest():
            build = service.rebalance_plan(body.operator, body.loads, body.threshold, body.window_s)
        case MigrateRequest():
            build = service.migrate_plan(body.task, body.worker, body.with_forward)
        case LogicRequest():
            return service.logic_plan(body.operator, body.logic, body.tasks)
    return service.paced(build, body.mode, body.batch_size, body.batch_bytes)


@router.post("/reconfigurations", status_code=202)
def post_plan(
    request: Request,
    job_id: JobId,
    body: PlanCreate,
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    may_start_workers: StartsWorkers,
) -> ReconfigurationRead:
    """Apply a plan: ``assignWorkload`` / ``assignResource`` / ``assignLogic`` operations
    against ``base_version`` (the current abstraction version), all in one reconfiguration."""
    build = _builder(request, body)
    return _request(session, engine, tracker, job_id, "plan", build, may_start_workers)


@router.post("/reconfigurations/preview")
def preview(
    request: Request,
    job_id: JobId,
    body: PreviewRequest,
    session: SessionDep,
    engine: EngineDep,
    may_start_workers: StartsWorkers,
) -> PreviewRead:
    """What a reconfiguration would do, without doing it: the body of any of the posts
    that make one (a plan, scale, rebalance, migrate or logic) with its ``origin``. It is
    validated as if posted (the same 409 and 422) and answers with the plan, its diff
    against the current version, the versions it would go through and an estimate of the
    keyed state it would ship between workers. Nothing is recorded or reserved: a preview
    may be asked while another reconfiguration runs."""
    return service.preview_reconfiguration(
        session=session,
        engine=engine,
        job_id=job_id,
        origin=body.origin,
        build=_builder(request, body),
        may_start_workers=may_start_workers,
    )


@router.post("/scale", status_code=202)
def scale(
    request: Request,
    job_id: JobId,
    body: ScaleRequest,
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    may_start_workers: StartsWorkers,
) -> ReconfigurationRead:
    """Give an operator (and the operators forward-connected to it) ``parallelism``
    tasks, moving as few key groups as possible."""
    build = _builder(request, body)
    return _request(session, engine, tracker, job_id, "scale", build, may_start_workers)


@router.post("/rebalance", status_code=202)
def rebalance(
    request: Request,
    job_id: JobId,
    body: RebalanceRequest,
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    may_start_workers: StartsWorkers,
) -> ReconfigurationRead:
    """Even out an operator's work over its tasks (same tasks, same workers)."""
    build = _builder(request, body)
    return _request(session, engine, tracker, job_id, "rebalance", build, may_start_workers)


@router.post("/migrate", status_code=202)
def migrate(
    request: Request,
    job_id: JobId,
    body: MigrateRequest,
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    may_start_workers: StartsWorkers,
) -> ReconfigurationRead:
    """Move one task to another worker (or to a fresh one: ``"new"``) with its state, and
    with ``with_forward`` its forward-connected partners too."""
    build = _builder(request, body)
    return _request(session, engine, tracker, job_id, "migrate", build, may_start_workers)


@router.post("/logic", status_code=202)
def change_logic(
    request: Request,
    job_id: JobId,
    body: LogicRequest,
    session: SessionDep,
    engine: EngineDep,
    tracker: TrackerDep,
    may_start_workers: StartsWorkers,
) -> ReconfigurationRead:
    """Swap the callable of an operator's tasks (all, or ``tasks``), keeping their state."""
    build = _builder(request, body)
    return _request(session, engine, tracker, job_id, "logic", build, may_start_workers)


@router.post(
    "/reconfigurations/{reconfiguration_id}/cancel", status_code=202, dependencies=_operate
)
def cancel_reconfiguration(
    job_id: JobId, reconfiguration_id: ReconfigurationId, session: SessionDep, engine: EngineDep
) -> ReconfigurationRead:
    """Cancel a reconfiguration under way: it stops at its next safe point and ends
    ``cancelled``. Preparing or syncing, it aborts (the job goes on as before it); in fluid
    mode no further step or stage starts (those made stay applied, the error says up to
    which version). 409 when it has ended, or is a pause-mode change already moving state."""
    rec = service.cancel_reconfiguration(
        session=session, engine=engine, job_id=job_id, reconfiguration_id=reconfiguration_id
    )
    return ReconfigurationRead.of(rec)


@router.get("/reconfigurations", dependencies=[Depends(require("read"))])
def list_reconfigurations(
    job_id: JobId, session: SessionDep, page: PageParams
) -> Page[ReconfigurationRead]:
    """The job's reconfigurations, newest first."""
    rows, total = service.list_reconfigurations(
        session=session, job_id=job_id, limit=page.limit, offset=page.offset
    )
    return Page(items=[ReconfigurationRead.of(r) for r in rows], total=total, **vars(page))


@router.get("/reconfigurations/{reconfiguration_id}", dependencies=[Depends(require("read"))])
def get_reconfiguration(
    job_id: JobId, reconfiguration_id: ReconfigurationId, session: SessionDep
) -> ReconfigurationRead:
    """One reconfiguration: status, operations, affected tasks, error, phase timings and
    per-task pauses."""
    rec = service.get_reconfiguration(
        session=session, job_id=job_id, reconfiguration_id=reconfiguration_id
    )
    return ReconfigurationRead.of(rec)
