"""``/api/v1/controllers``: attach (admin), list and read (read), start and stop
(operate), logs and decisions (read)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile

from controlplane import db
from controlplane.deps import SessionDep, require
from controlplane.errors import BadController
from controlplane.isolation import MAX_SOURCE_BYTES
from controlplane.pagination import Page, PageParams
from controlplane.params import MAX_ID, ControllerId
from controlplane.statuses import ControllerStatus

from . import service
from .schemas import ControllerRead, DecisionRead, LogRead

__all__ = ["router"]

router = APIRouter(prefix="/controllers", tags=["controllers"])


def _json_object(field: str, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadController(f"{field}: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise BadController(f"{field}: expected a JSON object, got {type(value).__name__}")
    return value


def _wake(request: Request, session: Any, controller_id: int) -> None:
    host = request.app.state.controllers
    db.after_commit(session, lambda: host.wake(controller_id))


@router.post("", status_code=201, dependencies=[Depends(require("admin"))])
def attach_controller(
    request: Request,
    session: SessionDep,
    name: Annotated[str, Form(min_length=1, max_length=200)],
    job_id: Annotated[int, Form(ge=1, le=MAX_ID, description="the job it controls")],
    file: Annotated[
        UploadFile | None, File(description="a .py file defining one Controller subclass")
    ] = None,
    builtin: Annotated[
        str | None,
        Form(
            max_length=100,
            description="or a built-in: load_balancer, latency_autoscaler, "
            "dsc_placement, logic_updater",
        ),
    ] = None,
    config: Annotated[str | None, Form(description="JSON object given to the controller")] = None,
    safety: Annotated[
        str | None,
        Form(
            description='JSON object: {"cooldown_s", "scale_out_cooldown_s", '
            '"min_parallelism", "max_parallelism", "max_moves_per_hour", '
            '"max_state_bytes_per_step"}'
        ),
    ] = None,
    dry_run: Annotated[bool, Form(description="record plans without applying them")] = False,
) -> ControllerRead:
    """Attach a controller to a running job and start it. The script is loaded by the
    sandboxed process that then runs it: 422 with the line and the reason if it does not
    compile, does not define exactly one Controller subclass, or refuses its config
    (nothing is recorded, the process is gone); 503 (``sandbox_unavailable``) for a script
    on a server where no sandbox can start (bubblewrap missing), built-ins still
    accepted."""
    data = file.file.read(MAX_SOURCE_BYTES + 1) if file is not None else None
    limits = _json_object("safety", safety)
    limits["dry_run"] = dry_run or bool(limits.get("dry_run", False))
    row = service.attach(
        session=session,
        name=name,
        job_id=job_id,
        filename=file.filename if file is not None else None,
        data=data,
        builtin=builtin or None,
        config=_json_object("config", config),
        safety=limits,
        settings=request.app.state.settings,
        loader=request.app.state.controllers,
    )
    _wake(request, session, row.id)
    return ControllerRead.model_validate(row)


@router.get("", dependencies=[Depends(require("read"))])
def list_controllers(
    session: SessionDep,
    page: PageParams,
    job_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only this job's")] = None,
) -> Page[ControllerRead]:
    rows, total = service.list_controllers(
        session=session, limit=page.limit, offset=page.offset, job_id=job_id
    )
    return Page(items=[ControllerRead.model_validate(r) for r in rows], total=total, **vars(page))


@router.get("/{controller_id}", dependencies=[Depends(require("read"))])
def get_controller(controller_id: ControllerId, session: SessionDep) -> ControllerRead:
    return ControllerRead.model_validate(
        service.get_controller(session=session, controller_id=controller_id)
    )


@router.post("/{controller_id}/start", dependencies=[Depends(require("operate"))])
def start_controller(
    controller_id: ControllerId, request: Request, session: SessionDep
) -> ControllerRead:
    """Run it again (its failure count starts over); 409 if its job has ended."""
    row = service.set_status(
        session=session, controller_id=controller_id, status=ControllerStatus.RUNNING
    )
    _wake(request, session, row.id)
    return ControllerRead.model_validate(row)


@router.post("/{controller_id}/stop", dependencies=[Depends(require("operate"))])
def stop_controller(
    controller_id: ControllerId, request: Request, session: SessionDep
) -> ControllerRead:
    """Stop it (its process exits; a plan it submitted already goes on)."""
    row = service.set_status(
        session=session,
        controller_id=controller_id,
        status=ControllerStatus.STOPPED,
        error="stopped by a user",
    )
    _wake(request, session, row.id)
    return ControllerRead.model_validate(row)


@router.get("/{controller_id}/logs", dependencies=[Depends(require("read"))])
def controller_logs(
    controller_id: ControllerId, session: SessionDep, page: PageParams
) -> Page[LogRead]:
    """What it printed and what the host noted about it, newest first."""
    rows, total = service.list_logs(
        session=session, controller_id=controller_id, limit=page.limit, offset=page.offset
    )
    return Page(items=[LogRead.model_validate(r) for r in rows], total=total, **vars(page))


@router.get("/{controller_id}/decisions", dependencies=[Depends(require("read"))])
def controller_decisions(
    controller_id: ControllerId, session: SessionDep, page: PageParams
) -> Page[DecisionRead]:
    """Every plan it returned, newest first: applied or not, and the outcome."""
    rows, total = service.list_decisions(
        session=session, controller_id=controller_id, limit=page.limit, offset=page.offset
    )
    return Page(items=[DecisionRead.model_validate(r) for r in rows], total=total, **vars(page))
