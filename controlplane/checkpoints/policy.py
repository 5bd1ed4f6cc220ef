"""A job's checkpoint policy: what its submission asks (:class:`CheckpointSettings`) over
the server's defaults (:class:`~controlplane.config.Settings`), and the document the jobs
table keeps of it so that a restarted control plane knows it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointPolicy

from .schemas import CheckpointSettings

__all__ = ["from_document", "policy_for", "to_document"]


def policy_for(settings: Settings, requested: CheckpointSettings | None) -> CheckpointPolicy | None:
    """The policy of a job whose submission asked ``requested`` (None: nothing), or None
    when it is not checkpointed. Each field the request left out takes the server's
    default; an interval of ``null`` in the request, or a server default of 0 that the
    request does not override, means no checkpoints."""
    asked = requested.model_dump(exclude_unset=True) if requested is not None else {}
    default_interval = settings.checkpoint_interval_s or None  # 0: off
    interval = asked.get("interval_s", default_interval)  # an explicit null: off
    if interval is None:
        return None
    return CheckpointPolicy(
        interval_s=interval,
        timeout_s=asked.get("timeout_s") or settings.checkpoint_timeout_s,
        retained=asked.get("retained") or settings.checkpoints_retained,
    )


def to_document(policy: CheckpointPolicy | None) -> dict[str, Any] | None:
    """The JSON document of ``policy`` (None when off), as the jobs table keeps it."""
    return asdict(policy) if policy is not None else None


def from_document(document: dict[str, Any] | None) -> CheckpointPolicy | None:
    """The policy :func:`to_document` wrote (None when off)."""
    return CheckpointPolicy(**document) if document is not None else None
