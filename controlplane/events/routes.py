"""``/api/v1/events``: what happened, newest first (read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from controlplane.deps import SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import MAX_ID

from . import service
from .schemas import EventRead

__all__ = ["router"]

router = APIRouter(prefix="/events", tags=["events"])


@router.get("", dependencies=[Depends(require("read"))])
def list_events(
    session: SessionDep,
    page: PageParams,
    job_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only this job's")] = None,
    kind: Annotated[
        str | None,
        Query(max_length=40, description='a kind ("job.failed") or a prefix ("worker.")'),
    ] = None,
) -> Page[EventRead]:
    """Jobs submitted, recovering, recovered and ended, a job's first completed checkpoint
    and its abandoned ones, reconfigurations ended, workers registered and lost, code
    uploaded, controllers attached, failed or stopped."""
    rows, total = service.list_events(
        session=session, limit=page.limit, offset=page.offset, job_id=job_id, kind=kind
    )
    return Page(items=[EventRead.model_validate(r) for r in rows], total=total, **vars(page))
