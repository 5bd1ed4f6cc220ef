"""``/api/v1/jobs/{job_id}/abstraction``: the current or an old version, the version
history, and the diff between two versions (scope read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from controlplane.deps import SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import MAX_ID, JobId

from . import service
from .schemas import AbstractionRead, DiffRead, VersionRead

__all__ = ["router"]

router = APIRouter(
    prefix="/jobs/{job_id}/abstraction",
    tags=["abstraction"],
    dependencies=[Depends(require("read"))],
)


@router.get("")
def get_abstraction(
    job_id: JobId,
    session: SessionDep,
    version: Annotated[int | None, Query(ge=1, le=MAX_ID, description="an old version")] = None,
) -> AbstractionRead:
    """The job's task-centric abstraction: operators, their tasks (logic, key groups or
    weight, worker) and the workers; the current version unless ``version`` is given."""
    row = service.get_version(session=session, job_id=job_id, version=version)
    return AbstractionRead.model_validate(row.document)


@router.get("/versions")
def list_versions(job_id: JobId, session: SessionDep, page: PageParams) -> Page[VersionRead]:
    """Every version of the abstraction, newest first."""
    rows, total = service.list_versions(
        session=session, job_id=job_id, limit=page.limit, offset=page.offset
    )
    return Page(items=[VersionRead.of(r) for r in rows], total=total, **vars(page))


@router.get("/diff")
def diff_versions(
    job_id: JobId,
    session: SessionDep,
    old: Annotated[
        int | None,
        Query(alias="from", ge=1, le=MAX_ID, description="default: the version before `to`"),
    ] = None,
    new: Annotated[
        int | None, Query(alias="to", ge=1, le=MAX_ID, description="default: current")
    ] = None,
) -> DiffRead:
    """Key-group moves, weight changes, added / removed / moved tasks, logic changes and
    the affected tasks between two versions."""
    d = service.diff_versions(session=session, job_id=job_id, old=old, new=new)
    return DiffRead.model_validate(d.to_dict())
