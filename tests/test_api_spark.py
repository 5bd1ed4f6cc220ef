"""The StreamManager with ``backend="spark"``: workers started as Spark tasks show where
Spark put them, a job runs on them, and a Spark task that dies is, within seconds, a lost
worker with Spark's reason on the worker list and a failed job naming the worker."""

from __future__ import annotations

import signal

import psutil
import pytest
from api_support import ADMIN_TOKEN, Api, ServerThread, free_port, wait_until

from controlplane.config import Settings

pytestmark = pytest.mark.slow

LOSS_REPORTED_S = 10.0  # a lost Spark task reaches the worker list and the job within this


def test_workers_from_spark_through_rest(spark, tmp_path, no_leftover_processes: None) -> None:
    url = f"sqlite:///{tmp_path}/streampilot.db"
    settings = Settings(
        database_url=url,
        port=free_port(),
        local_workers=2,
        admin_token=ADMIN_TOKEN,
        log_level="WARNING",
        backend="spark",
        spark_master="local[2]",
    )
    server = ServerThread(settings)
    server.start()
    try:
        api = Api(server.base_url, url, "sqlite")
        with api.client() as http:
            workers = http.get("/api/v1/workers").json()
            assert [w["status"] for w in workers] == ["alive", "alive"]
            assert {w["executor_id"] for w in workers} == {"driver"}
            r = http.post(
                "/api/v1/jobs",
                json={"name": "wc", "job": "examples.wordcount:build", "params": {"records": 0}},
            )
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            document = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
            assert {(w["backend"], w["executor_id"]) for w in document["workers"]} == {
                ("spark", "driver")
            }
            # The worker's Spark task dies: kill the Python worker Spark runs it in.
            victim = workers[0]
            psutil.Process(victim["pid"]).parent().send_signal(signal.SIGKILL)

            def lost() -> dict | None:
                rows = {w["id"]: w for w in http.get("/api/v1/workers").json()}
                row = rows[victim["id"]]
                # The connection may break first ("connection reset"); Spark's own reason
                # replaces it once the backend sees the task end.
                spark_reason = "Spark task ended" in (row["error"] or "")
                return row if row["status"] == "lost" and spark_reason else None

            row = wait_until(lost, LOSS_REPORTED_S, "the worker reported lost with Spark's reason")
            assert "Spark task ended: Python worker exited unexpectedly" in row["error"]
            # The job fails at once naming the worker (its connection, or a peer's data
            # link to it, broke first); the worker list says what Spark saw.
            job = api.wait_job(http, job_id, {"failed"}, LOSS_REPORTED_S)
            assert f"worker {victim['id']}" in job["error"], job["error"]
    finally:
        server.stop()
