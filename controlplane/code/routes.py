"""``/api/v1/code``: upload a Python module (admin), list and read uploads (read)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile

from controlplane.deps import SessionDep, require
from controlplane.isolation import MAX_SOURCE_BYTES
from controlplane.pagination import Page, PageParams
from controlplane.params import CodeId

from . import service
from .schemas import CodeRead, CodeSource

__all__ = ["router"]

router = APIRouter(prefix="/code", tags=["code"])


@router.post("", status_code=201, dependencies=[Depends(require("admin"))])
def upload_code(
    request: Request,
    file: Annotated[UploadFile, File(description="a .py module (UTF-8, at most 1 MiB)")],
    session: SessionDep,
    name: Annotated[str | None, Form(max_length=200, description="default: file name")] = None,
) -> CodeRead:
    """Store a module; its callables become ``code:<id>:<callable>`` for jobs and
    ``assignLogic``. It is imported once in a throwaway interpreter first: 422 with the
    file and line if it does not compile or raises at import."""
    data = file.file.read(MAX_SOURCE_BYTES + 1)  # a sync route: runs in a thread
    row = service.upload(
        session=session,
        filename=file.filename or "upload.py",
        name=name,
        data=data,
        settings=request.app.state.settings,
    )
    return CodeRead.of(row)


@router.get("", dependencies=[Depends(require("read"))])
def list_code(session: SessionDep, page: PageParams) -> Page[CodeRead]:
    """Uploaded modules, newest first."""
    rows, total = service.list_code(session=session, limit=page.limit, offset=page.offset)
    return Page(items=[CodeRead.of(r) for r in rows], total=total, **vars(page))


@router.get("/{code_id}", dependencies=[Depends(require("read"))])
def get_code(code_id: CodeId, session: SessionDep) -> CodeSource:
    """One upload with its source."""
    return CodeSource.of(service.get_code(session=session, code_id=code_id))
