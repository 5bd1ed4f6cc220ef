"""Controllers over REST against a real server: scripts and built-ins attached to running
jobs, run in their own processes, their plans checked (safety limits, validation) and
carried out; scripts that raise, hang, crash, return garbage or plan nonsense never touch
the job and end up ``failed``; bad uploads are 422 with the line and the reason."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import CONTROLLER_MAX_FAILURES, Api, wait_until

WORDCOUNT = {
    "name": "controlled",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}
FAST = '{"interval_s": 0.3}'

SCALER = textwrap.dedent(
    """
    import logging

    from controllers import Controller, scale

    class ScaleToThree(Controller):
        def decide(self, view):
            print("seen version", view.abstraction.version)
            if view.abstraction.operator("count").parallelism < 3:
                logging.getLogger("scaler").info("count below 3 tasks: scaling it")
                return scale(view.abstraction, "count", 3)
            return None

        def on_result(self, outcome):
            print("outcome", outcome.status)
    """
)


def script(body: str) -> str:
    """A controller whose decide runs ``body`` (indented into the method)."""
    return "import os, time\nfrom controllers import Controller, AssignResource, Plan\n\n" + (
        "class Misbehaves(Controller):\n    def decide(self, view):\n"
        + textwrap.indent(textwrap.dedent(body), "        ")
    )


def attach(http: httpx.Client, job: int, source: str | None = None, **form: Any) -> httpx.Response:
    data = {"name": form.pop("name", "c"), "job_id": str(job), "config": FAST, **form}
    files = {"file": ("ctl.py", source.encode(), "text/x-python")} if source else None
    return http.post("/api/v1/controllers", data=data, files=files)


def controller(http: httpx.Client, cid: int) -> dict[str, Any]:
    r = http.get(f"/api/v1/controllers/{cid}")
    assert r.status_code == 200, r.text
    return r.json()


def logs(http: httpx.Client, cid: int) -> list[str]:
    items = http.get(f"/api/v1/controllers/{cid}/logs?limit=500").json()["items"]
    return [f"{i['source']}: {i['message']}" for i in reversed(items)]


def decisions(http: httpx.Client, cid: int) -> list[dict[str, Any]]:
    return http.get(f"/api/v1/controllers/{cid}/decisions").json()["items"]


def version(http: httpx.Client, job: int) -> int:
    return http.get(f"/api/v1/jobs/{job}").json()["version"]


@pytest.fixture
def job(api: Api) -> Iterator[int]:
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def test_uploaded_controller_scales_the_job_and_records_everything(api: Api, job: int) -> None:
    with api.client() as http:
        r = attach(http, job, SCALER, name="scaler")
        assert r.status_code == 201, r.text
        c = r.json()
        assert (c["status"], c["class_name"], c["interval_s"]) == ("running", "ScaleToThree", 0.3)
        done = wait_until(
            lambda: [d for d in decisions(http, c["id"]) if d["status"] == "completed"],
            30,
            "the controller's plan to complete",
        )
        d = done[0]
        assert d["applied"] and d["reconfiguration_id"] is not None
        assert d["moves"] > 0
        assert d["view"]["version"] == 1
        rec = http.get(f"/api/v1/jobs/{job}/reconfigurations/{d['reconfiguration_id']}").json()
        assert rec["status"] == "completed"
        assert rec["origin"] == f"controller {c['id']}"
        count = next(
            o
            for o in http.get(f"/api/v1/jobs/{job}/abstraction").json()["operators"]
            if o["name"] == "count"
        )
        assert len(count["tasks"]) == 3
        # It goes on deciding (nothing more to do), and its output is its log.
        wait_until(
            lambda: controller(http, c["id"])["decisions_without_plan"] >= 2,
            15,
            "decisions without a plan",
        )
        lines = wait_until(
            lambda: (ls := logs(http, c["id"])) and "script: outcome completed" in ls and ls,
            10,
            "the controller's output in its log",
        )
        assert "script: seen version 1" in lines
        assert "script: scaler: count below 3 tasks: scaling it" in lines
        assert any(line.startswith("host: plan applied as reconfiguration") for line in lines)
        assert len(decisions(http, c["id"])) == 1
        # Stop, then start again.
        r = http.post(f"/api/v1/controllers/{c['id']}/stop")
        assert r.status_code == 200 and r.json()["status"] == "stopped"
        r = http.post(f"/api/v1/controllers/{c['id']}/start")
        assert r.status_code == 200 and r.json()["status"] == "running"
        listed = http.get(f"/api/v1/controllers?job_id={job}").json()
        assert [i["id"] for i in listed["items"]] == [c["id"]]


def test_builtin_logic_updater_swaps_logic(api: Api, job: int) -> None:
    config = '{"interval_s": 0.3, "logic": {"count": "examples.wordcount:count_word_v2"}}'
    with api.client() as http:
        r = attach(http, job, builtin="logic_updater", config=config)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert r.json()["builtin"] == "logic_updater"
        wait_until(
            lambda: any(d["status"] == "completed" for d in decisions(http, cid)),
            30,
            "the logic swap to complete",
        )
        count = next(
            o
            for o in http.get(f"/api/v1/jobs/{job}/abstraction").json()["operators"]
            if o["name"] == "count"
        )
        assert {t["logic"]["ref"] for t in count["tasks"]} == {"examples.wordcount:count_word_v2"}


def test_dry_run_and_safety_limits_never_touch_the_job(api: Api, job: int) -> None:
    with api.client() as http:
        dry = attach(http, job, SCALER, dry_run="true").json()
        wait_until(lambda: decisions(http, dry["id"]), 15, "a dry-run decision")
        http.post(f"/api/v1/controllers/{dry['id']}/stop")
        d = decisions(http, dry["id"])[0]
        assert (d["status"], d["applied"], d["reconfiguration_id"]) == ("dry_run", False, None)
        limited = attach(http, job, SCALER, safety='{"max_parallelism": {"count": 2}}').json()
        refused = wait_until(lambda: decisions(http, limited["id"]), 15, "a refused decision")
        http.post(f"/api/v1/controllers/{limited['id']}/stop")
        assert refused[0]["status"] == "refused"
        assert "count" in refused[0]["error"] and "2" in refused[0]["error"]
        assert controller(http, limited["id"])["failures"] == 0, "a safety refusal is no fault"
        # A scale-out ships some of the count tasks' state: more than 1 byte a step.
        small = attach(http, job, SCALER, safety='{"max_state_bytes_per_step": 1}').json()
        refused = wait_until(lambda: decisions(http, small["id"]), 15, "a refused decision")
        http.post(f"/api/v1/controllers/{small['id']}/stop")
        assert refused[0]["status"] == "refused", refused[0]
        assert refused[0]["error"].startswith("max state per step: the plan would ship about ")
        assert refused[0]["error"].endswith(
            "; the limit is 1 B (make it fluid with fewer key groups per step)"
        )
        assert version(http, job) == 1


def test_safety_limits_are_recorded_as_read(api: Api, job: int) -> None:
    """The safety JSON is kept as the host reads it, every limit shown: a scale-out
    cooldown given, or null (the same as ``cooldown_s``) when not."""
    with api.client() as http:
        safety = '{"cooldown_s": 30, "scale_out_cooldown_s": 3}'
        r = attach(http, job, builtin="load_balancer", dry_run="true", safety=safety)
        assert r.status_code == 201, r.text
        c = r.json()
        http.post(f"/api/v1/controllers/{c['id']}/stop")
        assert c["safety"] == {
            "cooldown_s": 30.0,
            "scale_out_cooldown_s": 3.0,
            "min_parallelism": {},
            "max_parallelism": {},
            "max_moves_per_hour": None,
            "max_state_bytes_per_step": None,
            "dry_run": True,
        }
        assert controller(http, c["id"])["safety"] == c["safety"]
        r = attach(http, job, builtin="load_balancer", dry_run="true", name="defaults")
        assert r.status_code == 201, r.text
        http.post(f"/api/v1/controllers/{r.json()['id']}/stop")
        assert r.json()["safety"]["cooldown_s"] == 60.0
        assert r.json()["safety"]["scale_out_cooldown_s"] is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "raise ValueError('bad threshold')",
            "ctl.py, line 6: decide(view) raised ValueError: bad threshold",
        ),
        ("time.sleep(60)", "decide(view) did not return within 2s"),
        ("os._exit(3)", "exited with 3"),
        ("return 42", "decide returned int, expected a Plan or None"),
        (
            "return Plan(view.abstraction.version, (AssignResource('count', 'count-0', 'nowhere'),))",
            "plan refused by validation",
        ),
        ("x = bytearray(4 << 30)", "MemoryError"),
    ],
    ids=["raises", "hangs", "crashes", "garbage", "invalid-plan", "memory"],
)
def test_misbehaving_controllers_fail_without_touching_the_job(
    api: Api, job: int, body: str, reason: str
) -> None:
    with api.client() as http:
        r = attach(http, job, script(body))
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        c = wait_until(
            lambda: (c := controller(http, cid))["status"] == "failed" and c,
            30,
            "the controller to be marked failed",
        )
        assert c["failures"] == CONTROLLER_MAX_FAILURES
        assert reason in c["error"], c["error"]
        wait_until(
            lambda: any(reason in line for line in logs(http, cid)), 5, "the failure in the log"
        )
        assert version(http, job) == 1
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


@pytest.mark.parametrize(
    ("source", "form", "words"),
    [
        ("class X(:\n  pass\n", {}, ["ctl.py, line 1"]),
        ("x = 1\n", {}, ["exactly one subclass of controllers.Controller", "found 0"]),
        (
            "from controllers import Controller\nclass A(Controller): pass\nclass B(Controller): pass\n",
            {},
            ["found 2: A, B"],
        ),
        ("import nope_not_a_module\n", {}, ["line 1", "ModuleNotFoundError"]),
        (None, {"builtin": "no_such"}, ["no built-in controller 'no_such'", "load_balancer"]),
        (None, {"builtin": "load_balancer", "config": '{"threshold": -1}'}, ["threshold"]),
        (None, {"builtin": "load_balancer", "config": "[1"}, ["config: not JSON"]),
        (SCALER, {"builtin": "load_balancer"}, ["either a .py file or the name of a built-in"]),
        (None, {"builtin": "load_balancer", "safety": '{"cooldown_s": -5}'}, ["cooldown_s"]),
        (
            None,
            {"builtin": "load_balancer", "safety": '{"cooldown_s": 5, "scale_out_cooldown_s": 6}'},
            ["safety: config.scale_out_cooldown_s: must be in [0, cooldown_s (5)] seconds"],
        ),
    ],
)
def test_bad_controllers_are_refused_with_the_reason(
    api: Api, job: int, source: str | None, form: dict[str, str], words: list[str]
) -> None:
    with api.client() as http:
        r = attach(http, job, source, **form)
        assert r.status_code == 422, r.text
        message = r.json()["error"]["message"]
        for word in words:
            assert word in message, message


def test_unknown_or_ended_jobs_and_scopes(api: Api) -> None:
    with api.client() as http:
        r = attach(http, 987654, SCALER)
        assert r.status_code == 404, r.text
        r = http.post("/api/v1/jobs", json={**WORDCOUNT, "params": {"records": 100}})
        ended = r.json()["id"]
        api.wait_job(http, ended, {"finished"})
        r = attach(http, ended, SCALER)
        assert r.status_code == 409, r.text
        assert "finished" in r.json()["error"]["message"]
        assert http.get("/api/v1/controllers/987654").status_code == 404
        token = http.post("/api/v1/tokens", json={"name": "op", "scopes": ["operate"]}).json()
    with api.client(token["token"]) as http:
        assert attach(http, ended, SCALER).status_code == 403


def test_a_plan_in_flight_when_stopped_is_settled_when_started_again(
    api: Api, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    params = {"records": 10**6, "rate": 2000, "hold": str(hold), "output": str(tmp_path / "o")}
    body = {"name": "held", "job": "tests.e2e_jobs:held_job", "params": params}
    with api.running_job(body) as job, api.client() as http:
        c = attach(http, job, SCALER).json()
        pending = wait_until(
            lambda: [d for d in decisions(http, c["id"]) if d["status"] == "pending"],
            15,
            "a plan held in its sync",
        )[0]
        assert http.post(f"/api/v1/controllers/{c['id']}/stop").status_code == 200
        hold.unlink()  # the sync goes through now
        api.wait_reconfiguration(http, job, pending["reconfiguration_id"])
        assert http.post(f"/api/v1/controllers/{c['id']}/start").status_code == 200
        settled = wait_until(
            lambda: (d := decisions(http, c["id"])[-1])["status"] != "pending" and d,
            10,
            "the decision settled",
        )
        assert settled["id"] == pending["id"] and settled["status"] == "completed"
        assert settled["ended_at"] is not None


def test_controller_scripts_never_see_the_control_planes_secrets(
    api: Api, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Controller scripts run without the control plane's ``STREAMPILOT_*`` variables
    (admin token, cluster secret, database URL). (Uploaded code is another matter: an
    admin's code, it runs in the control plane and on the workers, like any job's.)"""
    monkeypatch.setenv("STREAMPILOT_CLUSTER_SECRET", "do-not-leak-0123456789")
    monkeypatch.setenv("STREAMPILOT_ADMIN_TOKEN", "sp_do-not-leak-0123456789")
    snoop = script(
        """
        seen = sorted(k for k in os.environ if k.startswith("STREAMPILOT"))
        print("secrets seen:", seen)
        return None
        """
    )
    with api.client() as http:
        r = attach(http, job, snoop)
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        lines = wait_until(
            lambda: [line for line in logs(http, cid) if "secrets seen" in line],
            15,
            f"the script's report ({logs(http, cid)}, {controller(http, cid)})",
        )
        http.post(f"/api/v1/controllers/{cid}/stop")
        assert lines[0] == "script: secrets seen: []"
