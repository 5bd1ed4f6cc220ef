"""FastAPI dependencies: the request's unit of work, the engine, and token scopes.

- :data:`SessionDep`: a session whose work commits once the route has returned (before
  the response is sent) and rolls back if it raised; see :func:`controlplane.db.unit_of_work`.
- :data:`EngineDep`, :data:`TrackerDep`: the app's :class:`~controlplane.engine.Engine`
  and :class:`~controlplane.tracking.Tracker`.
- :func:`require`: a dependency that lets a request through only with a bearer token
  granting a scope (401 without a known token, 403 with too little scope).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from controlplane import db
from controlplane.auth import service as auth
from controlplane.auth.models import Token
from controlplane.engine import Engine
from controlplane.errors import Unauthenticated
from controlplane.tracking import Tracker

__all__ = ["EngineDep", "SessionDep", "TrackerDep", "require"]


def _session(request: Request) -> Iterator[Session]:
    with db.unit_of_work(request.app.state.sessions) as session:
        yield session


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _tracker(request: Request) -> Tracker:
    return request.app.state.tracker


SessionDep = Annotated[Session, Depends(_session, scope="function")]
EngineDep = Annotated[Engine, Depends(_engine)]
TrackerDep = Annotated[Tracker, Depends(_tracker)]

_bearer = HTTPBearer(
    auto_error=False,
    description="A token from `streampilot token create --scope read|operate|admin` "
    "(or STREAMPILOT_ADMIN_TOKEN).",
)


def require(scope: auth.Scope) -> Callable[..., Token]:
    """A dependency admitting requests whose bearer token grants ``scope``."""

    def check(
        session: SessionDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Token:
        if credentials is None:
            raise Unauthenticated(
                "missing bearer token: send 'Authorization: Bearer <token>' (create one with "
                "`streampilot token create --scope read`)"
            )
        token = auth.authenticate(session=session, secret=credentials.credentials)
        if token is None:
            raise Unauthenticated(
                "unknown or revoked token; create one with `streampilot token create`"
            )
        auth.authorize(token, scope)
        return token

    check.__name__ = f"require_{scope}"
    return check
