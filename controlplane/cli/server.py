"""``streampilot server`` runs the StreamManager; ``streampilot db upgrade`` migrates its
database. Both build a :class:`~controlplane.config.Settings` from the environment with
the options that were given on top: an option is ``None`` unless typed, and
:func:`server_settings` passes on only the typed ones (a new option is one parameter and
one keyword there)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from controlplane.config import Settings

from .output import console, err, fail
from .remote import settings_or_exit

__all__ = ["DbOption", "db_app", "server", "server_settings"]

db_app = typer.Typer(help="The StreamManager's database.", no_args_is_help=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="database URL (sqlite:///path.db or postgresql+psycopg://user@host/db); "
        "default STREAMPILOT_DATABASE_URL or sqlite:///./streampilot.db",
        show_default=False,
    ),
]


def server_settings(**overrides: object) -> Settings:
    """The server's settings: ``STREAMPILOT_*`` with the given (non-None) options on top."""
    return settings_or_exit(Settings, **overrides)


def server(
    host: Annotated[str | None, typer.Option(help="address to bind (default: 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: 8420)")] = None,
    db: DbOption = None,
    local_workers: Annotated[
        int | None, typer.Option(help="local worker processes to start (default: 2)")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="log level (default: INFO)")] = None,
    backend: Annotated[
        str | None, typer.Option(help="what starts workers: local or spark (default: local)")
    ] = None,
    spark_master: Annotated[
        str | None, typer.Option(help="Spark master URL with --backend spark (default: local[2])")
    ] = None,
) -> None:
    """Run the StreamManager: REST API under /api/v1, console at /docs.

    It runs a coordinator and workers (local processes, or Spark tasks with --backend spark;
    --local-workers says how many). Options override STREAMPILOT_* environment variables."""
    import uvicorn

    from controlplane.app import create_app

    settings = server_settings(
        host=host,
        port=port,
        database_url=db,
        local_workers=local_workers,
        log_level=log_level,
        backend=backend,
        spark_master=spark_master,
    )
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    workers = f"{settings.local_workers} {settings.backend} workers"
    if settings.backend == "spark":
        workers += f" on Spark {settings.spark_master}"
    err.print(
        f"streampilot server on http://{settings.host}:{settings.port} "
        f"(database {settings.redacted_database_url()}, {workers})"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        lifespan="on",
    )


@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Option(help="target revision")] = "head",
) -> None:
    """Create or upgrade the database schema (the server also does this at start)."""
    from controlplane import db as database

    settings = server_settings(database_url=db)
    try:
        database.upgrade(settings.database_url, revision)
        current = database.current_revision(settings.database_url)
    except SQLAlchemyError as exc:
        fail(f"database {settings.redacted_database_url()}: {exc}", 1)
    console.print(f"database {settings.redacted_database_url()} is at revision {current}")
