"""The built-in DS2 autoscaler attached over REST to a real job (real server, real
workers): a step of the order rate overloads match, and one decision scales it out."""

from __future__ import annotations

import json

import httpx
import pytest
from api_support import Api, wait_until

WORK_US = 1000.0  # match busy-waits 1 ms an order: one task matches about 1,000 orders/s
BASE, HIGH = 200.0, 2000.0  # orders/s before and after the step
STEP_S = 4.0  # the step, seconds after the source starts
STOCK_EXCHANGE = {
    "name": "ds2",
    "job": "examples.stock_exchange:build",
    "params": {
        "records": 0,
        "rate": BASE,
        "schedule": f"{STEP_S}:{BASE}, {STEP_S}:{HIGH}",
        "sources": 1,
        "parallelism": 1,
        "keys": 50,
        "work_us": WORK_US,
    },
}
CONFIG = {"interval_s": 1.0, "max_latency_ms": 200.0, "max_tasks": 3}
DECISION_TIMEOUT_S = 90.0  # the step comes within seconds; a loaded 2-core box is slow
LOG_TIMEOUT_S = 30.0  # the host writes a controller's output to the database every second


def log(http: httpx.Client, cid: int) -> list[dict]:
    return http.get(f"/api/v1/controllers/{cid}/logs?limit=500").json()["items"]


def decisions(http: httpx.Client, cid: int) -> list[dict]:
    r = http.get(f"/api/v1/controllers/{cid}/decisions")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def parallelism(http: httpx.Client, job: int, operator: str) -> int:
    ops = http.get(f"/api/v1/jobs/{job}/abstraction").json()["operators"]
    return len(next(o for o in ops if o["name"] == operator)["tasks"])


# One database (11-14 s each): the decision comes from the job's metrics; controllers'
# decisions are stored on both databases by test_api_controllers.py.
@pytest.mark.parametrize("api", ["postgresql"], indirect=True, ids=["postgresql"])
def test_ds2_autoscaler_scales_out_a_rate_step(api: Api) -> None:
    with api.running_job(STOCK_EXCHANGE) as job, api.client() as http:
        form = {
            "name": "ds2",
            "job_id": str(job),
            "builtin": "ds2_autoscaler",
            "config": json.dumps(CONFIG),
        }
        r = http.post("/api/v1/controllers", data=form)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert (r.json()["builtin"], r.json()["interval_s"]) == ("ds2_autoscaler", 1.0)
        first = wait_until(
            lambda: [d for d in decisions(http, cid) if d["status"] != "pending"],
            DECISION_TIMEOUT_S,
            "the autoscaler's first decision to end",
            every=0.2,
        )[-1]
        assert first["status"] == "completed", first
        assert first["view"]["version"] == 1  # the job as submitted: nothing before it
        rec = api.wait_reconfiguration(http, job, first["reconfiguration_id"])
        assert (rec["status"], rec["origin"]) == ("completed", f"controller {cid}")
        # One decision took match from 1 task to its DS2 size (2 or more, at most 3).
        assert 2 <= parallelism(http, job, "match") <= CONFIG["max_tasks"]
        assert parallelism(http, job, "trades_sink") == parallelism(http, job, "match")
        assert parallelism(http, job, "orders") == 1  # sources are never scaled
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"
        # Its log says why it decided: the symptoms it saw and the sizes it chose.
        why = wait_until(
            lambda: [item for item in log(http, cid) if "overload (" in item["message"]],
            LOG_TIMEOUT_S,
            "the reason of the decision in the controller's log",
        )
        assert why[0]["source"] == "script"
        assert why[0]["message"].startswith("controllers.builtin.ds2_autoscaler: overload (")
        assert "match" in why[0]["message"] and "from 1 to" in why[0]["message"]
        http.post(f"/api/v1/controllers/{cid}/stop")
