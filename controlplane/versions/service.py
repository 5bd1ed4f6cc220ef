"""Abstraction versions: record each one, read one, list them, diff two.

Every version of a job's abstraction is kept (version 1 from the submission, one more per
completed reconfiguration). Functions take the session as a keyword argument and never
commit.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.abstraction import Abstraction, AbstractionError, Diff, diff
from controlplane.errors import InvalidRequest, NotFound
from controlplane.jobs.models import JobRecord
from controlplane.pagination import fetch_page

from .models import AbstractionVersion

__all__ = ["add_version", "diff_versions", "get_version", "list_versions"]


def _job(session: Session, job_id: int) -> JobRecord:
    job = session.get(JobRecord, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    return job


def add_version(
    *,
    session: Session,
    job: JobRecord,
    document: dict[str, Any],
    reconfiguration_id: int | None = None,
) -> AbstractionVersion:
    """Record ``document`` (an abstraction's ``to_dict()``) as a version of ``job``, which
    becomes the job's current version if it is the newest."""
    version = int(document["job"]["version"])
    row = AbstractionVersion(
        job_id=job.id,
        version=version,
        document=document,
        reconfiguration_id=reconfiguration_id,
    )
    session.add(row)
    if (job.version or 0) < version:
        job.version = version
    session.flush()
    return row


def get_version(*, session: Session, job_id: int, version: int | None = None) -> AbstractionVersion:
    """Version ``version`` of the job's abstraction (the current one when None)."""
    job = _job(session, job_id)
    if version is None:
        version = job.version
        if version is None:
            raise NotFound(f"job {job_id} never deployed: it has no abstraction ({job.error})")
    row = session.scalar(
        select(AbstractionVersion).where(
            AbstractionVersion.job_id == job_id, AbstractionVersion.version == version
        )
    )
    if row is None:
        have = f"versions 1 to {job.version}" if job.version else "no version"
        raise NotFound(f"job {job_id} has no abstraction version {version} ({have})")
    return row


def list_versions(
    *, session: Session, job_id: int, limit: int, offset: int
) -> tuple[list[AbstractionVersion], int]:
    """A page of the job's versions, newest first, and how many there are."""
    _job(session, job_id)
    query = select(AbstractionVersion).where(AbstractionVersion.job_id == job_id)
    return fetch_page(session, query, AbstractionVersion.version.desc(), limit, offset)


def diff_versions(
    *, session: Session, job_id: int, old: int | None = None, new: int | None = None
) -> Diff:
    """What changed from version ``old`` to ``new`` (defaults: the current version and
    the one before it)."""
    newer = get_version(session=session, job_id=job_id, version=new)
    if old is None:
        old = newer.version - 1
        if old < 1:
            raise InvalidRequest(
                f"job {job_id} has only version 1: give ?from= and ?to= to compare",
                code="no_previous_version",
            )
    older = get_version(session=session, job_id=job_id, version=old)
    try:
        return diff(Abstraction.from_dict(older.document), Abstraction.from_dict(newer.document))
    except AbstractionError as exc:
        raise InvalidRequest(str(exc), code="not_comparable") from None
