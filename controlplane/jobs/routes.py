"""``/api/v1/jobs``: submit, list, get and stop jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from controlplane.auth import service as auth
from controlplane.auth.models import Token
from controlplane.deps import EngineDep, SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import JobId

from . import service
from .schemas import JobCreate, JobRead, JobStatus

__all__ = ["router"]

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", status_code=201)
def submit_job(
    body: JobCreate,
    session: SessionDep,
    engine: EngineDep,
    token: Annotated[Token, Depends(require("operate"))],
) -> JobRead:
    """Build the job from its reference (registered code only: 422 with how to register
    code otherwise) and params in a throwaway process, deploy it on the workers and start
    it. Its sinks write under ``<data_dir>/jobs/<id>/`` (relative paths land there), or
    anywhere with an admin token. It is checkpointed as ``checkpoints`` asks and recovers
    from failures as ``restart`` allows, over the server's defaults (the policies it runs
    with are in the answer). With ``from_savepoint`` it starts from that savepoint (422
    naming the operator when the savepoint does not fit the job, or naming what is
    missing or corrupt; nothing is submitted then). A job that fails to deploy is
    returned with status ``failed`` and its ``error``."""
    job = service.submit_job(
        session=session,
        engine=engine,
        name=body.name,
        ref=body.job,
        params=body.params,
        write_anywhere=auth.grants(token.scopes, "admin"),
        checkpoints=body.checkpoints,
        restart=body.restart,
        from_savepoint=body.from_savepoint,
    )
    return JobRead.of(job)


@router.get("", dependencies=[Depends(require("read"))])
def list_jobs(
    session: SessionDep,
    engine: EngineDep,
    page: PageParams,
    status: Annotated[JobStatus | None, Query(description="only jobs in this status")] = None,
) -> Page[JobRead]:
    """Jobs, newest first, ``limit`` per page from ``offset``."""
    jobs, total = service.list_jobs(
        session=session, engine=engine, limit=page.limit, offset=page.offset, status=status
    )
    return Page(items=[JobRead.of(j) for j in jobs], total=total, **vars(page))


@router.get("/{job_id}", dependencies=[Depends(require("read"))])
def get_job(job_id: JobId, session: SessionDep, engine: EngineDep) -> JobRead:
    return JobRead.of(service.get_job(session=session, engine=engine, job_id=job_id))


@router.delete("/{job_id}", dependencies=[Depends(require("operate"))])
def stop_job(job_id: JobId, session: SessionDep, engine: EngineDep) -> JobRead:
    """Stop the job (its records stay); stopping a job that has ended changes nothing."""
    return JobRead.of(service.stop_job(session=session, engine=engine, job_id=job_id))
