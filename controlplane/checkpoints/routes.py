"""``/api/v1/jobs/{job_id}/checkpoints``: a job's checkpoints, as recorded (scope read);
``/api/v1/jobs/{job_id}/savepoints``: take (and stop with), list, get and delete a job's
savepoints (reading: scope read; taking and deleting: scope operate).

404 names the job when it does not exist, else the checkpoint or savepoint. ``router``
holds both.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from controlplane.deps import EngineDep, SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import MAX_ID, JobId
from controlplane.statuses import CheckpointStatus

from . import savepoints, service
from .schemas import CheckpointRead, SavepointCreate, SavepointRead

__all__ = ["router"]

checkpoints_router = APIRouter(
    prefix="/jobs/{job_id}/checkpoints",
    tags=["checkpoints"],
    dependencies=[Depends(require("read"))],
)
savepoints_router = APIRouter(prefix="/jobs/{job_id}/savepoints", tags=["savepoints"])

CheckpointId = Annotated[
    int, Path(ge=1, le=MAX_ID, description="the coordinator's id of a checkpoint of the job")
]


@checkpoints_router.get("")
def list_checkpoints(
    job_id: JobId,
    session: SessionDep,
    page: PageParams,
    status: Annotated[
        CheckpointStatus | None, Query(description="only checkpoints in this status")
    ] = None,
) -> Page[CheckpointRead]:
    """The job's checkpoints, newest first: status, version, sizes, timings."""
    rows, total = service.list_for_job(
        session=session, job_id=job_id, limit=page.limit, offset=page.offset, status=status
    )
    return Page(items=[CheckpointRead.of(r) for r in rows], total=total, **vars(page))


@checkpoints_router.get("/{checkpoint_id}")
def get_checkpoint(
    job_id: JobId, checkpoint_id: CheckpointId, session: SessionDep
) -> CheckpointRead:
    """One checkpoint of the job, by the coordinator's id of it."""
    rec = service.get(session=session, job_id=job_id, checkpoint_id=checkpoint_id)
    return CheckpointRead.of(rec)


SavepointId = Annotated[
    int, Path(ge=1, le=MAX_ID, description="the coordinator's id of a savepoint of the job")
]


@savepoints_router.post("", status_code=201, dependencies=[Depends(require("operate"))])
def take_savepoint(
    job_id: JobId, session: SessionDep, engine: EngineDep, body: SavepointCreate | None = None
) -> SavepointRead:
    """Take a savepoint of the running job and answer once it is complete (it waits
    behind a checkpoint in flight or a reconfiguration under way). With ``"stop": true``
    the job is then stopped, its sinks having committed everything up to the savepoint.
    409 says why none was taken (the job runs on)."""
    asked = body or SavepointCreate()
    return savepoints.take(session=session, engine=engine, job_id=job_id, stop=asked.stop)


@savepoints_router.get("", dependencies=[Depends(require("read"))])
def list_savepoints(
    job_id: JobId,
    session: SessionDep,
    page: PageParams,
    status: Annotated[
        CheckpointStatus | None, Query(description="only savepoints in this status")
    ] = None,
) -> Page[SavepointRead]:
    """The job's savepoints, newest first."""
    rows, total = savepoints.list_for_job(
        session=session, job_id=job_id, limit=page.limit, offset=page.offset, status=status
    )
    return Page(items=[SavepointRead.of(r) for r in rows], total=total, **vars(page))


@savepoints_router.get("/{savepoint_id}", dependencies=[Depends(require("read"))])
def get_savepoint(job_id: JobId, savepoint_id: SavepointId, session: SessionDep) -> SavepointRead:
    """One savepoint of the job; its ``ref`` is what ``POST /jobs`` takes as
    ``from_savepoint``."""
    return SavepointRead.of(
        savepoints.get(session=session, job_id=job_id, savepoint_id=savepoint_id)
    )


@savepoints_router.delete(
    "/{savepoint_id}", status_code=204, dependencies=[Depends(require("operate"))]
)
def delete_savepoint(
    job_id: JobId, savepoint_id: SavepointId, session: SessionDep, engine: EngineDep
) -> Response:
    """Delete the savepoint and its files (jobs started from it keep running: they have
    their own copy). 409 while it is in progress."""
    savepoints.delete(session=session, engine=engine, job_id=job_id, savepoint_id=savepoint_id)
    return Response(status_code=204)


router = APIRouter()
router.include_router(checkpoints_router)
router.include_router(savepoints_router)
