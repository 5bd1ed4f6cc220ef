"""Alembic owns the schema: upgrade, downgrade to base and upgrade again leave exactly the
models' schema (autogenerate finds no drift), on SQLite and on PostgreSQL; and a revision
that alters a table with rows keeps them (0009's columns of ``jobs``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from api_support import postgres_database
from sqlalchemy import MetaData, Table, insert, inspect, select

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


def _jobs(url: str) -> list[dict]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            jobs = Table("jobs", MetaData(), autoload_with=conn)
            return [dict(row._mapping) for row in conn.execute(select(jobs).order_by(jobs.c.id))]
    finally:
        engine.dispose()


def test_0009_adds_the_jobs_policies_and_write_anywhere_keeping_the_jobs_there(
    database_url: str,
) -> None:
    db.upgrade(database_url, "0008")
    engine = db.make_engine(database_url)
    try:
        with engine.begin() as conn:
            jobs = Table("jobs", MetaData(), autoload_with=conn)
            conn.execute(
                insert(jobs),
                [
                    {
                        "name": name,
                        "job_ref": "examples.wordcount:build",
                        "params": {"records": 10},
                        "status": "finished",
                        "created_at": db.utcnow(),
                        "updated_at": db.utcnow(),
                    }
                    for name in ("before-0009", "also-before")
                ],
            )
    finally:
        engine.dispose()
    before = _jobs(database_url)

    db.upgrade(database_url, "0009")
    engine = db.make_engine(database_url)
    try:
        columns = {c["name"]: c for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
    assert {"checkpoints", "restart", "write_anywhere"} <= set(columns)
    assert columns["restart"]["nullable"] and not columns["write_anywhere"]["nullable"]
    after = _jobs(database_url)
    assert [{k: j[k] for k in before[0]} for j in after] == before
    for job in after:  # the jobs already there: no policy recorded, confined
        assert (job["checkpoints"], job["restart"], job["write_anywhere"]) == (None, None, False)

    db.downgrade(database_url, "0008")
    assert _jobs(database_url) == before
    db.upgrade(database_url)
    assert _drift(database_url) == []
