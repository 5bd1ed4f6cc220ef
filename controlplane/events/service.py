"""Events: record (services call :func:`record` inside their own unit of work, so an event
is stored exactly when what it tells is) and list. Functions never commit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.pagination import fetch_page

from .models import Event

__all__ = ["list_events", "record"]


def record(
    *,
    session: Session,
    kind: str,
    message: str,
    job_id: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> Event:
    event = Event(kind=kind, message=message, job_id=job_id, data=dict(data or {}))
    session.add(event)
    return event


def list_events(
    *,
    session: Session,
    limit: int,
    offset: int,
    job_id: int | None = None,
    kind: str | None = None,
) -> tuple[list[Event], int]:
    """A page of events, newest first; ``kind`` may be a prefix ending in ``.``
    (``"job."``)."""
    query = select(Event)
    if job_id is not None:
        query = query.where(Event.job_id == job_id)
    if kind is not None:
        query = query.where(
            Event.kind.startswith(kind, autoescape=True)
            if kind.endswith(".")
            else Event.kind == kind
        )
    return fetch_page(session, query, Event.id.desc(), limit, offset)
