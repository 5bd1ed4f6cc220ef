"""``streampilot token create``: a bearer token, printed once (it is stored hashed).

Two ways, one command. With a token to authenticate (``--token`` or ``STREAMPILOT_TOKEN``,
scope admin) or an explicit ``--server``, it asks the server (``POST /api/v1/tokens``).
Otherwise, or whenever ``--db`` is given, it writes to the database directly: that is how
the first admin token is made, before there is any token to ask with.
"""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from controlplane.config import Settings

from .client import ClientSettings
from .output import emit, fail
from .remote import JsonOpt, ServerOpt, TokenOpt, connect, settings_or_exit
from .server import DbOption, server_settings

__all__ = ["app", "create_token_in_database"]

app = typer.Typer(help="Bearer tokens for the REST API.", no_args_is_help=True)


def create_token_in_database(settings: Settings, name: str, scopes: list[str]) -> str:
    """Create a token in ``settings``' database (migrated first when
    ``settings.migrate_on_start``) and return its secret. Raises
    :class:`controlplane.errors.InvalidRequest` for unknown scopes and SQLAlchemy's errors
    when the database cannot be reached."""
    from controlplane import db as database
    from controlplane.auth import service as auth

    if settings.migrate_on_start:
        database.upgrade(settings.database_url)
    engine = database.make_engine(settings.database_url)
    try:
        with database.unit_of_work(database.session_factory(engine)) as session:
            _, secret = auth.create_token(session=session, name=name, scopes=scopes)
    finally:
        engine.dispose()
    return secret


def _create_locally(db: str | None, name: str, scopes: list[str]) -> str:
    from controlplane.errors import InvalidRequest

    settings = server_settings(database_url=db)
    try:
        return create_token_in_database(settings, name, scopes)
    except InvalidRequest as exc:
        fail(str(exc), 2)
    except SQLAlchemyError as exc:
        fail(f"database {settings.redacted_database_url()}: {exc}", 1)


@app.command("create")
def create(
    scope: Annotated[
        list[str],
        typer.Option(help="read, operate (also reconfigure and stop) or admin (everything)"),
    ] = ["read"],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="what the token is for")] = None,
    db: DbOption = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a bearer token and print it (only now: it is stored hashed).

    Through the server with --token/STREAMPILOT_TOKEN or --server; otherwise, or with
    --db, straight in the database (how the first admin token is made)."""
    name = name or f"{'+'.join(scope)} token"
    authenticated = settings_or_exit(ClientSettings, token=token).token is not None
    if db is not None or (server is None and not authenticated):
        created = {"name": name, "scopes": scope, "token": _create_locally(db, name, scope)}
    else:
        with connect(server, token) as api:
            created = api.post("/tokens", {"name": name, "scopes": scope})
    emit(created, as_json, lambda c: typer.echo(c["token"]))
