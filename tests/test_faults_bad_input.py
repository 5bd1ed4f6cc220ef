"""Bad checkpoint locations: one that cannot be written (a path under a regular file,
which fails for root too), one of a scheme no store has, an ``s3://`` store whose
endpoint is a closed port; and a store that fails under a running job.

Each gives a clear error naming the location, and the jobs already running are
untouched: they finish with their exact output.
"""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pytest
from api_support import running_server

from controlplane.coordinator.checkpoint_report import CheckpointPolicy, CheckpointReport
from controlplane.statuses import CheckpointStatus
from controlplane.testing import BackgroundCluster
from examples import wordcount
from runtime.sinks import read_parts
from tests.faults_support import (
    WAIT_S,
    Events,
    assert_exact,
    counting_job,
    finish_job,
    kill,
    reference,
    start_job,
)

pytestmark = pytest.mark.slow

PARAMS = {"records": 4_000, "rate": 2_000, "output": "out"}


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bad_location(kind: str, tmp_path: Path) -> tuple[str, str]:
    """A checkpoint location of ``kind`` and what an error about it must name."""
    if kind == "under_a_file":
        afile = tmp_path / "a-file"
        afile.write_text("not a directory\n")
        return str(afile / "checkpoints"), str(afile / "checkpoints")
    if kind == "unknown_scheme":
        return "nosuch://bucket/checkpoints", "nosuch"
    port = closed_port()
    return f"s3://bucket/checkpoints?endpoint_override=127.0.0.1:{port}&scheme=http", str(port)


@pytest.mark.parametrize("kind", ["under_a_file", "unknown_scheme", "s3_closed_port"])
def test_a_bad_checkpoint_location_fails_the_checkpointed_submission_naming_it(
    tmp_path: Path, held_end: Path, kind: str
) -> None:
    """The server starts with the bad location (it is only used by jobs that take
    checkpoints). A job without checkpoints runs; a checkpointed job submitted next is
    answered at once, naming the location: 201 with the job ``failed`` and the error
    (what the API does for any job that cannot start), or a 4xx; never a 5xx. The first
    job is untouched: it finishes with its exact output."""
    location, named = bad_location(kind, tmp_path)
    with (
        running_server("sqlite", str(tmp_path), checkpoint_dir=location) as api,
        api.client() as http,
    ):
        body = {
            "name": "plain",
            "job": "tests.e2e_jobs:held_wordcount",
            "params": {**PARAMS, "held": str(held_end)},
            "checkpoints": {"interval_s": None},
        }
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201 and r.json()["status"] == "running", r.text
        plain = r.json()["id"]
        body = {**body, "name": "checkpointed", "checkpoints": {"interval_s": 0.2}}
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code < 500, r.text
        if r.status_code == 201:
            assert r.json()["status"] == "failed", r.text
            error = r.json()["error"]
            assert error.startswith("checkpoints cannot be taken"), error
            page = http.get(f"/api/v1/jobs/{r.json()['id']}/checkpoints").json()
            assert page["total"] == 0, page
        else:
            assert 400 <= r.status_code < 500, r.text
            error = r.text
        assert named in error, error
        assert http.get(f"/api/v1/jobs/{plain}").json()["status"] == "running"
        held_end.unlink()
        final = api.wait_job(http, plain, {"finished", "failed", "stopped"}, timeout=WAIT_S)
        assert final["status"] == "finished", final
    (out,) = list(tmp_path.glob(f"data/jobs/{plain}/out"))
    lines = read_parts(out)
    assert not [w for w, n in Counter(w for w, _ in lines).items() if n > 1], "a word twice"
    assert dict(lines) == wordcount.reference(PARAMS)


# -- A store that fails under a running job ---------------------------------------------------


def test_a_store_that_fails_under_a_running_job_abandons_checkpoints_naming_why(
    faults: BackgroundCluster, fault_events: Events, tmp_path: Path, held_end: Path
) -> None:
    """The job's directory in the store is moved aside and a regular file put in its
    place: every checkpoint is now abandoned, its error naming the path that cannot be
    written, while the job runs on. The directory put back, checkpoints complete again
    (key groups whose parts were not written are written whole); a worker of the job is
    then SIGKILLed, the job recovers from such a checkpoint, and its output is exact."""
    co = faults.coordinator
    out = tmp_path / "out"
    policy = CheckpointPolicy(interval_s=0.2, timeout_s=60, retained=2)
    job, _, _ = start_job(faults, fault_events, counting_job(out, held_end), policy)
    directory = Path(co.config.checkpoint_store) / job.id
    aside = directory.with_name(f"{job.id}.aside")
    abandoned: list[CheckpointReport] = []

    def failed(job_id: str, what: CheckpointReport | int) -> None:
        if isinstance(what, CheckpointReport) and what.status == CheckpointStatus.ABANDONED:
            abandoned.append(what)

    fault_events.on_checkpoint = failed
    directory.rename(aside)
    directory.write_text("not a directory\n")
    mark = max(fault_events.ids(job.id))
    fault_events.wait("2 checkpoints abandoned", lambda: len(abandoned) >= 2)
    assert not fault_events.completed_after(job.id, mark)
    assert str(directory) in (abandoned[-1].error or ""), abandoned[-1].error
    assert job.status == "running" and not fault_events.recoveries
    directory.unlink()
    aside.rename(directory)
    mark = max(fault_events.ids(job.id))
    fault_events.wait("a complete checkpoint", lambda: fault_events.completed_after(job.id, mark))
    kill(co.workers[job.layout.placement["count-1"]].pid)
    fault_events.wait("a recovery", lambda: bool(fault_events.recoveries))
    report, _ = fault_events.recoveries[0]
    assert report.plan["checkpoint_id"] > mark, report.plan
    finish_job(faults, job, held_end)
    assert_exact(read_parts(out), reference())
