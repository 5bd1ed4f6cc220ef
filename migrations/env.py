"""Alembic environment: the schema of every resource's models, on SQLite or PostgreSQL.

The URL comes from the caller (``controlplane.db.alembic_config`` puts it, or an open
connection, in ``config.attributes``), else ``sqlalchemy.url`` / ``-x url=...``, else the
control plane's settings. SQLite migrations run in batch mode (ALTER by table copy).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection, make_url

from controlplane.db import load_models, make_engine

config = context.config
target_metadata = load_models()

if config.config_file_name is not None and "url" not in config.attributes:
    # Run from the alembic command line: log as alembic.ini says, keeping our loggers.
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        from controlplane.config import Settings

        url = Settings().database_url
    return url


def _configure(**options: object) -> None:
    url = options.pop("url", None)
    connection = options.get("connection")
    dialect = connection.dialect.name if isinstance(connection, Connection) else None
    if dialect is None and isinstance(url, str):
        dialect = make_url(url).get_backend_name()
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=dialect == "sqlite",
        compare_type=True,
        **({"url": url} if url is not None else {}),
        **options,
    )


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
