"""Database plumbing: the declarative base, engines, sessions, the unit of work, migrations.

- :class:`Base` is the base of every ORM model (each resource package's ``models.py``);
  its metadata names constraints by convention so SQLite and PostgreSQL agree.
- :func:`make_engine` and :func:`session_factory` for a URL (SQLite file or PostgreSQL).
- :func:`unit_of_work` is the only place that commits: a request, a background update or
  a CLI command opens one; services only add, change and flush. Work that must happen
  only once the transaction is durable (start a reconfiguration) or undone if it is
  rolled back (stop a job just deployed) is registered with :func:`after_commit` /
  :func:`after_rollback`.
- Alembic owns the schema (``migrations/``): :func:`upgrade`, :func:`downgrade`,
  :func:`current_revision`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, DateTime, Dialect, MetaData, create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

__all__ = [
    "MIGRATIONS_DIR",
    "Base",
    "UTCDateTime",
    "after_commit",
    "after_rollback",
    "alembic_config",
    "current_revision",
    "downgrade",
    "load_models",
    "make_engine",
    "session_factory",
    "unit_of_work",
    "upgrade",
    "utcnow",
]

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 15.0  # a writer waits this long for SQLite's lock before failing

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_AFTER_COMMIT = "streampilot.after_commit"
_AFTER_ROLLBACK = "streampilot.after_rollback"


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database (SQLite keeps no zone: values
    are stored in UTC and read back as aware datetimes)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
    }


def load_models() -> MetaData:
    """Import every resource's ORM models and return the complete metadata."""
    from controlplane.auth import models as _auth  # noqa: F401
    from controlplane.checkpoints import models as _checkpoints  # noqa: F401
    from controlplane.code import models as _code  # noqa: F401
    from controlplane.events import models as _events  # noqa: F401
    from controlplane.hosted_controllers import models as _controllers  # noqa: F401
    from controlplane.jobs import models as _jobs  # noqa: F401
    from controlplane.reconfigurations import models as _reconfigurations  # noqa: F401
    from controlplane.versions import models as _versions  # noqa: F401
    from controlplane.workers import models as _workers  # noqa: F401

    return Base.metadata


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite gets foreign keys, WAL and a busy timeout, and may be
    used from several threads (requests run in a thread pool)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        if parsed.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (responses are built from them)."""
    return sessionmaker(engine, expire_on_commit=False)


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run ``action`` once the current unit of work has committed (never if it rolls back)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(action)


def after_rollback(session: Session, action: Callable[[], None]) -> None:
    """Run ``action`` if the current unit of work rolls back (undo of outside effects)."""
    session.info.setdefault(_AFTER_ROLLBACK, []).append(action)


@contextmanager
def unit_of_work(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits when the block ends normally and rolls back when it
    raises; then the matching :func:`after_commit` or :func:`after_rollback` actions run
    (an action that raises is logged, not propagated: the transaction has already ended)."""
    with sessions() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            _run_actions(session, _AFTER_ROLLBACK)
            raise
        _run_actions(session, _AFTER_COMMIT)


def _run_actions(session: Session, key: str) -> None:
    actions = session.info.pop(key, [])
    session.info.pop(_AFTER_COMMIT, None)
    session.info.pop(_AFTER_ROLLBACK, None)
    for action in actions:
        try:
            action()
        except Exception:
            logger.exception("%s action %r failed", key.rpartition(".")[2], action)


# -- migrations ------------------------------------------------------------------------------


def alembic_config(url: str, connection: Connection | None = None) -> Config:
    """The Alembic configuration for ``url`` (or an open ``connection`` to use as is)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["url"] = url
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema at ``url`` to ``revision`` (creating a SQLite file if needed)."""
    logger.info(
        "upgrading database %s to %s",
        make_url(url).render_as_string(hide_password=True),
        revision,
    )
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The schema revision of the database at ``url`` (None for an empty database)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
