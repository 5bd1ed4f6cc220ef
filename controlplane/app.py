"""The StreamManager: ``create_app(settings)`` builds the FastAPI application.

Its lifespan, in order (shutdown in reverse; a failing step stops the start-up and undoes
the steps before it):

1. Upgrade the database schema (``settings.migrate_on_start``), register
   ``settings.admin_token`` and install the uploaded code modules.
2. Mark jobs and reconfigurations a previous run left unfinished as failed.
3. Start the coordinator and ``settings.local_workers`` workers with ``settings.backend``
   (the engine).
4. Start mirroring job states into the database.
5. Start the controllers recorded running (:class:`~controlplane.hosted_controllers.host.ControllerHost`).

Routes live under ``/api/v1`` in one package per resource; ``/healthz`` and ``/metrics`` (Prometheus text; see :mod:`controlplane.metrics.routes`)
need no token, nor do the pages: ``/`` (the dashboard, :mod:`controlplane.console`),
``/docs`` and ``/redoc``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version as package_version
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from controlplane import console, db, http
from controlplane.auth import routes as tokens
from controlplane.auth import service as auth
from controlplane.checkpoints import routes as checkpoints
from controlplane.code import routes as code
from controlplane.code import service as code_service
from controlplane.config import Settings
from controlplane.engine import Engine
from controlplane.events import routes as event_routes
from controlplane.hosted_controllers import routes as controller_routes
from controlplane.hosted_controllers.host import ControllerHost
from controlplane.jobs import routes as jobs
from controlplane.metrics import routes as metrics
from controlplane.reconfigurations import routes as reconfigurations
from controlplane.tracking import Tracker
from controlplane.versions import routes as versions
from controlplane.workers import routes as workers

__all__ = ["API_PREFIX", "create_app"]

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
BOOTSTRAP_TOKEN_NAME = "bootstrap admin (STREAMPILOT_ADMIN_TOKEN)"


class Health(BaseModel):
    status: Literal["ok"]
    workers: int
    database: Literal["ok"]


def _prepare_database(settings: Settings, sessions: sessionmaker[Session]) -> None:
    if settings.migrate_on_start:
        db.upgrade(settings.database_url)
    if settings.admin_token is not None:
        with db.unit_of_work(sessions) as session:
            auth.ensure_token(
                session=session,
                name=BOOTSTRAP_TOKEN_NAME,
                secret=settings.admin_token.get_secret_value(),
                scopes=["admin"],
            )
    with db.unit_of_work(sessions) as session:
        installed = code_service.install_all(session=session)
    logger.info("%d uploaded code modules installed", installed)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    database = db.make_engine(settings.database_url)
    sessions = db.session_factory(database)
    try:
        # Step 1. Schema and bootstrap token.
        await asyncio.to_thread(_prepare_database, settings, sessions)
        # Step 2. What a previous run left unfinished.
        engine = Engine(settings)
        engine.coordinator.resolve_logic = code_service.logic_resolver(settings)  # registered
        tracker = Tracker(engine, sessions)
        await asyncio.to_thread(tracker.recover)
        # Step 3. Coordinator and workers.
        await engine.start()
        try:
            # Step 4. Mirror job states.
            await tracker.start()
            app.state.sessions, app.state.engine, app.state.tracker = sessions, engine, tracker
            # Step 5. Controllers.
            controllers = ControllerHost(settings, engine, tracker, sessions)
            await controllers.start()
            app.state.controllers = controllers
            logger.info(
                "streampilot serving with %s and %d %s workers",
                settings.redacted_database_url(),
                settings.local_workers,
                settings.backend,
            )
            yield
        finally:
            if hasattr(app.state, "controllers"):
                await app.state.controllers.close()
            await tracker.stop()
            await engine.close()
            await asyncio.to_thread(tracker.shutdown, engine.states())
    finally:
        database.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The application for ``settings`` (default: from the environment). Nothing starts
    until the ASGI server runs its lifespan."""
    settings = settings or Settings()
    app = FastAPIOffline(  # /docs assets served by the app: no CDN, no internet
        redoc_url=None,  # /redoc: see controlplane.console (its bundle's logo made local)
        title="streampilot",
        version=package_version("streampilot"),
        summary="Control plane for Python stream jobs: live scaling, rebalancing, "
        "migration and change of logic (after Trisk).",
        lifespan=_lifespan,
    )
    app.state.settings = settings
    http.install(app)

    api = APIRouter(prefix=API_PREFIX)
    for module in (
        jobs,
        versions,
        reconfigurations,
        checkpoints,
        metrics,
        workers,
        code,
        controller_routes,
        event_routes,
        tokens,
    ):
        api.include_router(module.router)
    app.include_router(api)
    app.include_router(metrics.prometheus)
    console.install(app)  # the dashboard at / and its assets under /console/static

    @app.get("/healthz", tags=["health"])
    def healthz(request: Request) -> Health:
        """Liveness: the database answers and the coordinator counts its workers (no token)."""
        with request.app.state.sessions() as session:
            session.execute(text("SELECT 1"))
        return Health(status="ok", workers=request.app.state.engine.workers(), database="ok")

    return app
