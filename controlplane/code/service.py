"""Uploaded code: check, store, install, list.

An upload is checked in a throwaway interpreter first (``python -m runtime.codecheck``,
bounded by :data:`CHECK_TIMEOUT_S`): it must be UTF-8 Python that compiles and imports.
Then it is stored, and installed in this process as ``streampilot_code.c<id>`` so jobs and
``assignLogic`` can name ``code:<id>:callable``; the coordinator ships it to the workers
that need it. At start-up :func:`install_all` installs every stored upload again.

Functions take the session as a keyword argument and never commit.
"""

from __future__ import annotations

import hashlib
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.errors import BadCode, NotFound
from controlplane.events import service as events
from controlplane.isolation import python_source, run_check
from controlplane.pagination import fetch_page
from runtime import codeload

from .models import CodeModule

__all__ = ["get_code", "install_all", "list_code", "upload"]

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 20.0  # importing an upload (in a throwaway process) takes at most this


def _check(source: str, filename: str) -> list[str]:
    """The callables ``source`` defines, found by importing it in a throwaway process."""
    result = run_check(
        "runtime.codecheck",
        [filename],
        source,
        timeout=CHECK_TIMEOUT_S,
        error=BadCode,
        doing=f"{filename}: importing the module",
    )
    if "error" in result:
        raise BadCode(str(result["error"]))
    return [str(c) for c in result["callables"]]


def upload(*, session: Session, filename: str, name: str | None, data: bytes) -> CodeModule:
    """Check, store and install one module; :class:`BadCode` says what is wrong with it
    (not UTF-8, too large, not a .py file, a syntax error or an exception at import, with
    its line)."""
    source = python_source(filename, data, error=BadCode)
    callables = _check(source, filename)
    row = CodeModule(
        name=name or filename.removesuffix(".py"),
        filename=filename,
        sha256=hashlib.sha256(data).hexdigest(),
        source=source,
        callables=callables,
    )
    session.add(row)
    session.flush()  # the id names the module
    try:
        codeload.install(row.id, source, filename=filename, replace=True)
    except codeload.CodeError as exc:  # it imported in the check: not deterministic?
        raise BadCode(str(exc)) from None
    events.record(
        session=session,
        kind="code.uploaded",
        message=f"code {row.id} uploaded: {filename} ({', '.join(callables) or 'no callables'})",
        data={"code": row.id, "sha256": row.sha256},
    )
    logger.info("code %s uploaded: %s (%d callables)", row.id, filename, len(callables))
    return row


def get_code(*, session: Session, code_id: int) -> CodeModule:
    row = session.get(CodeModule, code_id)
    if row is None:
        raise NotFound(f"code {code_id} does not exist")
    return row


def list_code(*, session: Session, limit: int, offset: int) -> tuple[list[CodeModule], int]:
    """A page of uploads, newest first, and how many there are."""
    return fetch_page(session, select(CodeModule), CodeModule.id.desc(), limit, offset)


def install_all(*, session: Session) -> int:
    """Install every stored upload in this process (at start-up); returns how many. An
    upload that no longer imports (a dependency went away) is logged and skipped: jobs
    naming it fail with that reason."""
    count = 0
    for row in session.scalars(select(CodeModule).order_by(CodeModule.id)):
        try:
            codeload.install(row.id, row.source, filename=row.filename, replace=True)
            count += 1
        except codeload.CodeError as exc:
            logger.warning("code %s no longer imports: %s", row.id, exc)
    return count
