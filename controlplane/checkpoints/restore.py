"""What a job submitted with ``from_savepoint`` starts from: the savepoint named
``"<job id>/<savepoint id>"``, its manifest read from the checkpoint store and checked,
and whether it fits the new job's graph (:mod:`controlplane.coordinator.from_savepoint`
says what fits).

Functions take the session as a keyword argument and never commit; they raise
:class:`InvalidRequest` (422: a savepoint that does not exist, whose files are gone or
corrupt, or that does not fit the graph), :class:`Conflict` (409: one not completed) or
:class:`Unavailable` (503: a store that cannot be read now), each message saying what to
fix. They are called before the job is deployed: a refusal submits nothing.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointKind
from controlplane.coordinator.from_savepoint import incompatibility, parse_manifest
from controlplane.errors import Conflict, InvalidRequest, Unavailable
from controlplane.jobs.models import JobRecord
from controlplane.statuses import CheckpointStatus
from runtime.checkpoints.store import CheckpointNotFound, CheckpointStoreError, open_store
from runtime.dataflow import JobGraph

from .models import CheckpointRecord

__all__ = ["REF_PATTERN", "check_fits", "savepoint_manifest"]

REF_PATTERN = r"^[1-9][0-9]{0,17}/[1-9][0-9]{0,17}$"  # "<job id>/<savepoint id>"


def savepoint_manifest(*, session: Session, settings: Settings, ref: str) -> dict[str, Any]:
    """The manifest of the completed savepoint ``ref`` (``"<job id>/<savepoint id>"``),
    read from the checkpoint store and checked (module docstring for what it raises)."""
    if not re.fullmatch(REF_PATTERN, ref):
        raise InvalidRequest(
            f'from_savepoint {ref!r} is not "<job id>/<savepoint id>" (e.g. "3/14")',
            code="unknown_savepoint",
        )
    job_id, savepoint_id = (int(n) for n in ref.split("/"))
    rec = session.scalar(
        select(CheckpointRecord).where(
            CheckpointRecord.job_id == job_id,
            CheckpointRecord.checkpoint_id == savepoint_id,
            CheckpointRecord.kind == CheckpointKind.SAVEPOINT,
        )
    )
    said = f"from_savepoint {ref!r}"
    if rec is None:
        missing = (
            f"job {job_id} does not exist"
            if session.get(JobRecord, job_id) is None
            else f"job {job_id} has no savepoint {savepoint_id}"
        )
        raise InvalidRequest(
            f"{said}: {missing} (GET /jobs/{job_id}/savepoints lists its savepoints)",
            code="unknown_savepoint",
        )
    if rec.status != CheckpointStatus.COMPLETED or rec.path is None:
        raise Conflict(
            f"{said}: the savepoint is {rec.status}; only a completed one can be started "
            f"from (wait for it, or take another)",
            code="savepoint_not_completed",
        )
    try:
        data = open_store(settings.checkpoint_location()).get(rec.path)
    except CheckpointNotFound:
        raise InvalidRequest(
            f"{said}: its manifest {rec.path} is no longer in the checkpoint store "
            "(removed outside the control plane?); start from another savepoint",
            code="savepoint_unreadable",
        ) from None
    except CheckpointStoreError as exc:
        raise Unavailable(f"{said}: the checkpoint store cannot be read now: {exc}") from None
    try:
        manifest = parse_manifest(data)
        if (manifest["job_id"], manifest["checkpoint_id"]) != (str(job_id), savepoint_id):
            raise ValueError(
                f"it is the manifest of {manifest['job_id']}/{manifest['checkpoint_id']}"
            )
    except ValueError as exc:
        raise InvalidRequest(
            f"{said}: its manifest {rec.path} is corrupt ({exc}); start from another savepoint",
            code="corrupt_savepoint",
        ) from None
    return manifest


def check_fits(manifest: dict[str, Any], graph: JobGraph, ref: str) -> None:
    """:class:`InvalidRequest` ``incompatible_savepoint`` naming the operator when the job
    ``graph`` cannot start from savepoint ``ref``'s ``manifest``."""
    why = incompatibility(manifest, graph)
    if why is not None:
        raise InvalidRequest(f"from_savepoint {ref!r}: {why}", code="incompatible_savepoint")
