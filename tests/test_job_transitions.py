"""A job's end is recorded once although requests and the tracker refresh it at the same
time, each in its own transaction (SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import postgres_database
from sqlalchemy import func, select

from controlplane import db
from controlplane.engine_views import JobState
from controlplane.events.models import Event
from controlplane.jobs import service as jobs
from controlplane.jobs.models import JobRecord


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path}/jobs.db"
        else:
            url = stack.enter_context(postgres_database())
        db.upgrade(url)
        engine = db.make_engine(url)
        stack.callback(engine.dispose)
        yield db.session_factory(engine)


def test_two_sessions_ending_a_job_record_one_event(sessions) -> None:
    with sessions() as s:
        job = JobRecord(name="j", job_ref="examples.wordcount:build", params={}, status="running")
        s.add(job)
        s.commit()
        jid = job.id
    a, b = sessions(), sessions()
    try:
        seen_by_a, seen_by_b = a.get(JobRecord, jid), b.get(JobRecord, jid)  # both read "running"
        assert seen_by_a.status == seen_by_b.status == "running"
        done = JobState(job_id=str(jid), status="finished", error=None, version=1)
        assert jobs.refresh(seen_by_a, done)
        a.commit()
        jobs.refresh(seen_by_b, done)  # too late: a made the change
        b.commit()
        assert seen_by_b.status == "finished"
    finally:
        a.close()
        b.close()
    with sessions() as s:
        ended = s.scalar(
            select(func.count()).where(Event.job_id == jid, Event.kind == "job.finished")
        )
        assert ended == 1
        assert s.get(JobRecord, jid).status == "finished"
