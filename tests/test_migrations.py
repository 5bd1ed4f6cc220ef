"""Alembic owns the schema: upgrade, downgrade to base and upgrade again leave exactly the
models' schema (autogenerate finds no drift), on SQLite and on PostgreSQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from api_support import postgres_database
from sqlalchemy import inspect

from controlplane import db

TABLES = {
    "jobs",
    "abstraction_versions",
    "reconfigurations",
    "tokens",
    "code",
    "controllers",
    "controller_decisions",
    "controller_logs",
    "events",
    "workers",
    "checkpoints",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            yield f"sqlite:///{tmp_path}/migrations.db"
        else:
            yield stack.enter_context(postgres_database())


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _drift(url: str) -> list:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(context, db.load_models())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_leaves_no_drift(database_url: str) -> None:
    head = ScriptDirectory.from_config(db.alembic_config(database_url)).get_current_head()
    db.upgrade(database_url)
    assert _tables(database_url) == TABLES
    assert db.current_revision(database_url) == head
    assert _drift(database_url) == []

    db.downgrade(database_url, "base")
    assert _tables(database_url) == set()
    assert db.current_revision(database_url) is None

    db.upgrade(database_url)
    assert _tables(database_url) == TABLES
    assert _drift(database_url) == []


def test_revisions_are_date_prefixed_and_linear() -> None:
    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1
    for path in (db.MIGRATIONS_DIR / "versions").glob("*.py"):
        assert path.name[:8].isdigit() and path.name[8] == "_", path.name
