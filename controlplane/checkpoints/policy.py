"""A job's checkpoint and restart policies: what its submission asks
(:class:`CheckpointSettings`, :class:`RestartSettings`) over the server's defaults
(:class:`~controlplane.config.Settings`), and the documents the jobs table keeps of them
so that a restarted control plane knows them."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from controlplane.config import Settings
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, RestartPolicy

from .schemas import CheckpointSettings, RestartSettings

__all__ = [
    "from_document",
    "policy_for",
    "restart_from_document",
    "restart_policy_for",
    "restart_to_document",
    "to_document",
]


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


def restart_policy_for(settings: Settings, requested: RestartSettings | None) -> RestartPolicy:
    """The restart policy of a job whose submission asked ``requested`` (None: nothing):
    each field the request left out, or gave as null, takes the server's default
    (``restart_max_failures``, ``restart_window_s``, ``restart_delay_s``)."""
    asked = requested.model_dump(exclude_none=True) if requested is not None else {}
    return RestartPolicy(
        max_failures=asked.get("max_failures", settings.restart_max_failures),
        window_s=asked.get("window_s", settings.restart_window_s),
        delay_s=asked.get("delay_s", settings.restart_delay_s),
    )


def restart_to_document(policy: RestartPolicy) -> dict[str, Any]:
    """The JSON document of ``policy``, as the jobs table keeps it."""
    return asdict(policy)


def restart_from_document(document: dict[str, Any] | None, settings: Settings) -> RestartPolicy:
    """The policy :func:`restart_to_document` wrote; for a job recorded before restart
    policies were (no document), the server's defaults."""
    if document is None:
        return restart_policy_for(settings, None)
    return RestartPolicy(**document)
