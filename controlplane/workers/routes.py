"""``/api/v1/workers``: list (read), add and drain (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from controlplane.deps import EngineDep, SessionDep, require
from controlplane.pagination import Page, PageParams

from . import service
from .schemas import WorkerRead, WorkerRecordRead, WorkersCreate

__all__ = ["router"]

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", dependencies=[Depends(require("read"))])
def list_workers(engine: EngineDep) -> list[WorkerRead]:
    """Every worker that registered with the coordinator (lost ones too)."""
    return [WorkerRead.of(w) for w in engine.worker_views()]


@router.get("/history", dependencies=[Depends(require("read"))])
def worker_history(session: SessionDep, page: PageParams) -> Page[WorkerRecordRead]:
    """Every worker of this and earlier runs of the control plane, newest first, with why
    each one was lost."""
    rows, total = service.list_history(session=session, limit=page.limit, offset=page.offset)
    return Page(items=[WorkerRecordRead.model_validate(r) for r in rows], total=total, **vars(page))


@router.post("", status_code=201, dependencies=[Depends(require("admin"))])
def add_workers(body: WorkersCreate, engine: EngineDep) -> list[WorkerRead]:
    """Start ``count`` workers with the backend; returns them once they have registered
    (503 if they do not within the server's workers timeout)."""
    return [WorkerRead.of(w) for w in engine.add_workers(body.count)]


@router.delete("/{worker_id}", dependencies=[Depends(require("admin"))])
def drain_worker(worker_id: str, engine: EngineDep) -> WorkerRead:
    """Stop a worker that hosts no task of a running job (409 naming the tasks if it
    does: migrate them first)."""
    return WorkerRead.of(engine.drain_worker(worker_id))
