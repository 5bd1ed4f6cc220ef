"""Uploaded code: check, store, register, list; and the resolver of logic refs.

An upload is checked in a throwaway interpreter first (``python -m runtime.codecheck``,
bounded by :data:`CHECK_TIMEOUT_S`): it must be UTF-8 Python that compiles and imports.
Then it is stored, and once its unit of work has committed, registered in this process
(:func:`runtime.codeload.register`: its source, never executed here) so jobs and
``assignLogic`` can name ``code:<id>:callable`` (:mod:`.registry`); the coordinator ships
it to the workers that need it. At start-up :func:`install_all` registers every stored
upload again.

Functions take the session as a keyword argument and never commit.
"""

from __future__ import annotations

import hashlib
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.abstraction import Resolver
from controlplane.config import Settings
from controlplane.errors import BadCode, NotFound
from controlplane.events import service as events
from controlplane.isolation import python_source, run_check
from controlplane.pagination import fetch_page
from runtime import codeload

from .models import CodeModule
from .registry import Registry

__all__ = ["get_code", "install_all", "list_code", "logic_resolver", "upload"]

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 20.0  # importing an upload (in a throwaway process) takes at most this


def _check(source: str, filename: str, settings: Settings) -> list[str]:
    """The callables ``source`` defines, found by importing it in a throwaway process."""
    result = run_check(
        "runtime.codecheck",
        [filename],
        source,
        timeout=CHECK_TIMEOUT_S,
        error=BadCode,
        doing=f"{filename}: importing the module",
        settings=settings,
    )
    if "error" in result:
        raise BadCode(str(result["error"]))
    return [str(c) for c in result["callables"]]


def upload(
    *, session: Session, filename: str, name: str | None, data: bytes, settings: Settings
) -> CodeModule:
    """Check and store one module, registered once the unit of work commits;
    :class:`BadCode` says what is wrong with it (not UTF-8, too large, not a .py file, a
    syntax error or an exception at import, with its line)."""
    source = python_source(filename, data, error=BadCode)
    callables = _check(source, filename, settings)
    row = CodeModule(
        name=name or filename.removesuffix(".py"),
        filename=filename,
        sha256=hashlib.sha256(data).hexdigest(),
        source=source,
        callables=callables,
    )
    session.add(row)
    session.flush()  # the id names the module
    code_id = row.id
    db.after_commit(session, lambda: codeload.register(code_id, source))
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
    """Register every stored upload in this process (at start-up; nothing is executed);
    returns how many. An upload that no longer imports (a dependency went away) fails the
    jobs naming it where they are built, with that reason."""
    count = 0
    for row in session.scalars(select(CodeModule).order_by(CodeModule.id)):
        codeload.register(row.id, row.source)
        count += 1
    return count


def logic_resolver(settings: Settings) -> Resolver:
    """The control plane's ``resolve_logic``: registered code only (:meth:`Registry.logic`),
    named, never imported."""
    return Registry.of(settings).logic
