"""``/api/v1/jobs/{job_id}/checkpoints``: a job's checkpoints, as recorded (scope read).

404 names the job when it does not exist, else the checkpoint.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from controlplane.deps import SessionDep, require
from controlplane.pagination import Page, PageParams
from controlplane.params import MAX_ID, JobId
from controlplane.statuses import CheckpointStatus

from . import service
from .schemas import CheckpointRead

__all__ = ["router"]

router = APIRouter(
    prefix="/jobs/{job_id}/checkpoints",
    tags=["checkpoints"],
    dependencies=[Depends(require("read"))],
)

CheckpointId = Annotated[
    int, Path(ge=1, le=MAX_ID, description="the coordinator's id of a checkpoint of the job")
]


@router.get("")
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


@router.get("/{checkpoint_id}")
def get_checkpoint(
    job_id: JobId, checkpoint_id: CheckpointId, session: SessionDep
) -> CheckpointRead:
    """One checkpoint of the job, by the coordinator's id of it."""
    rec = service.get(session=session, job_id=job_id, checkpoint_id=checkpoint_id)
    return CheckpointRead.of(rec)
