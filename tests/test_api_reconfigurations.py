"""Reconfigurations over REST against a real server: helpers and raw plans carried out
live, their records (status, timings, pauses), version history and diff, and refusals
(stale version 409, bad plans 422 naming the culprit, one at a time 409)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import Api, wait_until

from tests.test_cli_rest import cli, ok

WORDCOUNT = {
    "name": "wordcount-live",
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 1000},
}
PHASES = ("prepare", "sync", "update", "total")


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    """A running, unbounded word count for the tests of this module (per server)."""
    with api.running_job(WORDCOUNT) as job_id:
        yield job_id


def current(http: httpx.Client, job_id: int) -> dict[str, Any]:
    r = http.get(f"/api/v1/jobs/{job_id}/abstraction")
    assert r.status_code == 200, r.text
    return r.json()


def tasks_of(abstraction: dict[str, Any], operator: str) -> dict[str, dict[str, Any]]:
    op = next(o for o in abstraction["operators"] if o["name"] == operator)
    return {t["id"]: t for t in op["tasks"]}


def elsewhere(abstraction: dict[str, Any], operator: str, task: str) -> str:
    """A worker other than the one ``task`` (of ``operator``) runs on."""
    here = tasks_of(abstraction, operator)[task]["resources"]["worker"]
    return next(w["id"] for w in abstraction["workers"] if w["id"] != here)


def key_groups(abstraction: dict[str, Any]) -> dict[str, list[int]]:
    return {t: v["workload"]["key_groups"] for t, v in tasks_of(abstraction, "count").items()}


def assert_completed(rec: dict[str, Any], version: int) -> None:
    assert rec["status"] == "completed", rec
    assert rec["error"] is None
    assert rec["result_version"] == version
    timings = rec["timings_ms"]
    assert set(timings) == {*PHASES, "precopy"}
    assert all(isinstance(timings[p], float) and timings[p] >= 0 for p in PHASES)
    assert timings["precopy"] is None or 0 <= timings["precopy"] <= timings["prepare"]
    assert timings["total"] >= max(timings["prepare"], timings["sync"], timings["update"])
    assert rec["pause_ms"], "affected tasks that existed before pause"
    assert set(rec["pause_ms"]) <= set(rec["affected_tasks"])
    assert all(v >= 0 for v in rec["pause_ms"].values())
    assert rec["ended_at"] is not None


def test_scale_then_raw_plan_history_and_diff(api: Api, job: int) -> None:
    with api.client() as http:
        base = current(http, job)
        v = base["job"]["version"]
        assert len(tasks_of(base, "count")) == 2

        # Scale out through the helper.
        r = http.post(f"/api/v1/jobs/{job}/scale", json={"operator": "count", "parallelism": 3})
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["status"] in ("pending", "preparing", "syncing", "updating", "completed")
        assert (accepted["origin"], accepted["base_version"]) == ("scale", v)
        assert {"count-2", "sink-2"} <= set(accepted["affected_tasks"])
        assert any(op["op"] == "assignResource" for op in accepted["ops"])
        scaled = api.wait_reconfiguration(http, job, accepted["id"])
        assert_completed(scaled, v + 1)

        after = current(http, job)
        assert after["job"]["version"] == v + 1
        groups = key_groups(after)
        assert sorted(groups) == ["count-0", "count-1", "count-2"]
        assert sorted(g for gs in groups.values() for g in gs) == list(range(128))
        assert http.get(f"/api/v1/jobs/{job}").json()["version"] == v + 1

        # A stale base version is refused with 409 and changes nothing.
        stale = {
            "base_version": v,
            "ops": [{"op": "assignWorkload", "operator": "count", "workload": groups}],
        }
        r = http.post(f"/api/v1/jobs/{job}/reconfigurations", json=stale)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "stale_version"
        assert f"version {v + 1}" in r.json()["error"]["message"]

        # Move two key groups from count-0 to count-1 with a raw assignWorkload plan.
        moved = groups["count-0"][:2]
        plan = {
            "base_version": v + 1,
            "ops": [
                {
                    "op": "assignWorkload",
                    "operator": "count",
                    "workload": {
                        "count-0": groups["count-0"][2:],
                        "count-1": groups["count-1"] + moved,
                    },
                }
            ],
        }
        r = http.post(f"/api/v1/jobs/{job}/reconfigurations", json=plan)
        assert r.status_code == 202, r.text
        assert r.json()["origin"] == "plan"
        raw = api.wait_reconfiguration(http, job, r.json()["id"])
        assert_completed(raw, v + 2)
        assert {"count-0", "count-1"} <= set(raw["affected_tasks"])
        assert sorted(key_groups(current(http, job))["count-1"]) == sorted(
            groups["count-1"] + moved
        )

        # History: every version kept, each linked to the reconfiguration that made it.
        versions = http.get(f"/api/v1/jobs/{job}/abstraction/versions").json()
        assert [x["version"] for x in versions["items"]][:3] == [v + 2, v + 1, v]
        assert [x["reconfiguration_id"] for x in versions["items"][:2]] == [raw["id"], scaled["id"]]
        old = http.get(f"/api/v1/jobs/{job}/abstraction", params={"version": v}).json()
        assert old == base

        d = http.get(
            f"/api/v1/jobs/{job}/abstraction/diff", params={"from": v + 1, "to": v + 2}
        ).json()
        assert (d["old_version"], d["new_version"]) == (v + 1, v + 2)
        (count,) = d["operators"]
        assert count["operator"] == "count"
        assert sorted(count["key_group_moves"]) == [
            [g, "count-0", "count-1"] for g in sorted(moved)
        ]
        assert {"count-0", "count-1"} <= set(d["affected"])
        assert http.get(f"/api/v1/jobs/{job}/abstraction/diff").json() == d  # defaults

        d = http.get(f"/api/v1/jobs/{job}/abstraction/diff", params={"from": v, "to": v + 1}).json()
        count_diff = next(o for o in d["operators"] if o["operator"] == "count")
        assert count_diff["new_tasks"] == ["count-2"]

        listed = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()
        assert [x["id"] for x in listed["items"]][:2] == [raw["id"], scaled["id"]]

        r = http.get(f"/api/v1/jobs/{job}/abstraction", params={"version": v + 50})
        assert r.status_code == 404
        assert f"version {v + 50}" in r.json()["error"]["message"]


def _assign(workload: dict[str, Any], operator: str = "count") -> list[dict[str, Any]]:
    return [{"op": "assignWorkload", "operator": operator, "workload": workload}]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "words"),
    [
        # Raw plans ({version} is filled with the current version).
        (
            "reconfigurations",
            {"ops": _assign({"count-0": [0]})},
            422,
            "key_group_conflict",
            ["key group", "'count'"],
        ),
        (
            "reconfigurations",
            {"ops": _assign({"count-0": [5], "count-1": [5]})},
            422,
            "key_group_conflict",
            ["key group 5", "count-0", "count-1"],
        ),
        (
            "reconfigurations",
            {"ops": _assign({"count-0": [300]})},
            422,
            "key_group_conflict",
            ["300"],
        ),
        (
            "reconfigurations",
            {"ops": _assign({"count-0": [1]}, "nope")},
            422,
            "unknown_operator",
            ["'nope'"],
        ),
        (
            "reconfigurations",
            {
                "ops": [
                    {
                        "op": "assignResource",
                        "operator": "count",
                        "task": "count-0",
                        "worker": "w99",
                    }
                ]
            },
            422,
            "unknown_worker",
            ["'w99'"],
        ),
        (
            "reconfigurations",
            {"ops": [{"op": "assignEverything", "operator": "count"}]},
            422,
            "invalid_request",
            ["body.ops.0"],
        ),
        ("reconfigurations", {"ops": []}, 422, "invalid_request", ["body.ops"]),
        # Helpers.
        ("scale", {"operator": "sentences", "parallelism": 3}, 422, "invalid_plan", ["source"]),
        (
            "scale",
            {"operator": "count", "parallelism": 0},
            422,
            "invalid_request",
            ["body.parallelism"],
        ),
        ("migrate", {"task": "count-77", "worker": "w1"}, 422, "unknown_task", ["'count-77'"]),
        (
            "logic",
            {"operator": "count", "logic": "examples.wordcount:nope"},
            422,
            "bad_logic",
            ["examples.wordcount:nope"],
        ),
        (
            "rebalance",
            {"operator": "count", "loads": {"1000": 1.0}},
            422,
            "key_group_conflict",
            ["1000"],
        ),
    ],
)
def test_bad_plans_are_refused_naming_the_culprit(
    api: Api, job: int, path: str, body: dict[str, Any], status: int, code: str, words: list[str]
) -> None:
    with api.client() as http:
        version = current(http, job)["job"]["version"]
        before = http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["total"]
        if path == "reconfigurations":
            body = {"base_version": version, **body}
        r = http.post(f"/api/v1/jobs/{job}/{path}", json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == code
        for word in words:
            assert word in error["message"]
        assert current(http, job)["job"]["version"] == version
        assert http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["total"] == before


def test_nothing_to_do_is_refused(api: Api, job: int) -> None:
    with api.client() as http:
        n = len(tasks_of(current(http, job), "count"))
        r = http.post(f"/api/v1/jobs/{job}/scale", json={"operator": "count", "parallelism": n})
        assert r.status_code == 422
        assert r.json()["error"]["code"] == "no_change"
        assert f"already has {n} tasks" in r.json()["error"]["message"]


def test_one_reconfiguration_at_a_time(api: Api, job: int) -> None:
    with api.client() as http:
        v = current(http, job)["job"]["version"]
        # Asking for a fresh worker keeps the first one busy while the backend starts it.
        r = http.post(f"/api/v1/jobs/{job}/migrate", json={"task": "count-0", "worker": "new"})
        assert r.status_code == 202, r.text
        first = r.json()
        r = http.post(f"/api/v1/jobs/{job}/rebalance", json={"operator": "count"})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "reconfiguration_in_progress"
        assert f"reconfiguration {first['id']}" in r.json()["error"]["message"]

        done = api.wait_reconfiguration(http, job, first["id"], timeout=45)
        assert_completed(done, v + 1)
        a = current(http, job)
        worker = tasks_of(a, "count")["count-0"]["resources"]["worker"]
        assert worker not in {w for w in ("w1", "w2")}
        assert next(w for w in a["workers"] if w["id"] == worker)["status"] == "alive"
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


def test_fluid_scale_moves_key_groups_in_small_steps(api: Api) -> None:
    """A fluid scale-out is one reconfiguration made of several short live steps, each its
    own version; scaling back in with ``fluid`` too leaves every key group owned once."""
    with api.running_job(WORDCOUNT) as job, api.client() as http:
        v = current(http, job)["job"]["version"]
        r = http.post(
            f"/api/v1/jobs/{job}/scale",
            json={"operator": "count", "parallelism": 4, "mode": "fluid", "batch_size": 16},
        )
        assert r.status_code == 202, r.text
        assert (r.json()["mode"], r.json()["batch_size"]) == ("fluid", 16)
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed", rec
        # setup (new tasks) + 64 key groups: each old task gives 32, 16 per step, both at
        # once; the two batches are stages of the setup's live run, each timed
        assert rec["result_version"] == v + 1 + 2
        assert rec["runs"] == 1 and len(rec["stage_ms"]) == 2, rec
        assert all(ms > 0.0 for ms in rec["stage_ms"]), rec
        # The count tasks that give key groups never pause; each step's update time is
        # kept (for them: until the groups they gave had left).
        assert rec["pause_ms"]["count-0"] == rec["pause_ms"]["count-1"] == 0.0, rec
        assert set(rec["update_ms"]) <= set(rec["affected_tasks"])
        assert rec["update_ms"]["count-0"] > 0.0 and rec["update_ms"]["count-2"] > 0.0, rec
        made = [
            x
            for x in http.get(f"/api/v1/jobs/{job}/abstraction/versions").json()["items"]
            if x["version"] > v
        ]
        assert sorted(x["version"] for x in made) == list(range(v + 1, v + 4))
        assert {x["reconfiguration_id"] for x in made} == {rec["id"]}
        step = http.get(f"/api/v1/jobs/{job}/abstraction/diff?from={v + 1}&to={v + 2}").json()
        moves = [m for o in step["operators"] for m in o["key_group_moves"]]
        assert len(moves) == 32
        assert max(Counter(src for _, src, _ in moves).values()) == 16
        groups = key_groups(current(http, job))
        assert sorted(len(g) for g in groups.values()) == [32, 32, 32, 32]
        r = http.post(
            f"/api/v1/jobs/{job}/scale",
            json={"operator": "count", "parallelism": 2, "mode": "fluid", "batch_size": 32},
        )
        back = api.wait_reconfiguration(http, job, r.json()["id"])
        assert back["status"] == "completed", back
        groups = key_groups(current(http, job))
        assert sorted(g for gs in groups.values() for g in gs) == list(range(128))
        # A fluid migration: through a stand-in on the target worker, 16 groups a step.
        other = elsewhere(current(http, job), "count", "count-0")
        r = http.post(
            f"/api/v1/jobs/{job}/migrate",
            json={"task": "count-0", "worker": other, "mode": "fluid", "batch_size": 16},
        )
        assert r.status_code == 202, r.text
        moved = api.wait_reconfiguration(http, job, r.json()["id"])
        assert moved["status"] == "completed", moved
        assert moved["result_version"] - moved["base_version"] > 3
        after = current(http, job)
        assert tasks_of(after, "count")["count-0"]["resources"]["worker"] == other
        assert sorted(tasks_of(after, "count")) == ["count-0", "count-1"]  # stand-in gone
        r = http.post(
            f"/api/v1/jobs/{job}/rebalance",
            json={"operator": "count", "batch_size": 4},
        )
        assert r.status_code == 422, r.text
        assert "fluid" in r.json()["error"]["message"]


# 300 words of ~20 kB of state each. At 2,000 sentences/s every word (Zipf: the rarest
# is 1 in ~1,900) is seen within ~4 s (~13 s at 500/s); the state is the same either way.
PADDED = {
    "job": "examples.wordcount:build",
    "params": {"records": 0, "rate": 2000, "keys": 300, "state_bytes": 20_000},
}


def counted_state(http: httpx.Client, job: int) -> dict[str, dict[str, Any]] | None:
    """The count tasks' metrics by task, once every one reports its state with all 300
    words seen (state sizes are levels: the latest report); None before."""
    body = http.get(f"/api/v1/jobs/{job}/metrics", params={"window_s": 10}).json()
    counted = {t["task"]: t for t in body["tasks"] if t["operator"] == "count"}
    if len(counted) < 2 or sum(t["state_keys"] or 0 for t in counted.values()) < 300:
        return None
    return counted


# One database: the step size comes from the workers' state reports, not from storage;
# the records it stores are of the kinds the other tests here store on both (~14 s each).
@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_fluid_steps_sized_in_bytes_of_state(api: Api) -> None:
    """``batch_bytes`` paces a fluid change by the measured state: as many key groups per
    step as make about that many bytes at the largest state per key group of a task; bad
    combinations are refused naming what to fix."""
    with api.running_job({"name": "wordcount-padded", **PADDED}) as job, api.client() as http:

        def per_group() -> float | None:
            """The largest state per key group of a count task."""
            counted = counted_state(http, job)
            if counted is None:
                return None
            owned = {t: len(g) for t, g in key_groups(current(http, job)).items()}
            return max(t["state_bytes"] / owned[t["task"]] for t in counted.values())

        largest = wait_until(per_group, 20.0, "the count tasks' state sizes", every=0.5)
        # 300 words of ~20 kB over 128 key groups: about 47 kB a group on average
        assert 20_000 < largest < 200_000
        r = http.post(
            f"/api/v1/jobs/{job}/scale",
            json={"operator": "count", "parallelism": 3, "mode": "fluid", "batch_bytes": 500_000},
        )
        assert r.status_code == 202, r.text
        size = r.json()["batch_size"]
        # Measured again by the server a moment later: the same state, give or take the
        # estimate's refresh (8 key groups a report).
        assert size == pytest.approx(500_000 / largest, rel=0.25), (size, largest)
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed" and rec["batch_size"] == size, rec
        # Nothing keyed moves (a sink task to the other worker): one step.
        other = elsewhere(current(http, job), "sink", "sink-0")
        r = http.post(
            f"/api/v1/jobs/{job}/migrate",
            json={"task": "sink-0", "worker": other, "mode": "fluid", "batch_bytes": 1000},
        )
        assert r.status_code == 202 and r.json()["batch_size"] is None, r.text
        assert api.wait_reconfiguration(http, job, r.json()["id"])["status"] == "completed"

        for body, fragment in (
            ({"batch_size": 4, "batch_bytes": 1000, "mode": "fluid"}, "not both"),
            ({"batch_bytes": 1000}, 'set mode to \\"fluid\\"'),
            ({"batch_bytes": 0, "mode": "fluid"}, "greater than or equal to 1"),
        ):
            r = http.post(
                f"/api/v1/jobs/{job}/scale", json={"operator": "count", "parallelism": 2, **body}
            )
            assert r.status_code == 422 and fragment in r.text, r.text


# One database (~14 s each): what was copied ahead comes from the workers; a record's
# stored fields go through both databases in the other tests here (this one on PostgreSQL).
@pytest.mark.parametrize("api", ["postgresql"], indirect=True, ids=["postgresql"])
def test_a_record_says_what_each_worker_copied_ahead(api: Api) -> None:
    """A migration of a task holding more than the 32 MB from which leaving key groups are
    copied ahead: its record (REST and ``reconfig show``) says what the giving worker
    copied and where that time went; a change that copies nothing says nothing."""
    # 300 words of 250 kB: about 37 MB per count task once every word is seen.
    padded = {**PADDED, "params": {**PADDED["params"], "state_bytes": 250_000}}
    with api.running_job({"name": "wordcount-copied", **padded}) as job, api.client() as http:
        wait_until(lambda: counted_state(http, job), 20.0, "every word counted", every=0.5)
        a = current(http, job)
        giver = tasks_of(a, "count")["count-0"]["resources"]["worker"]
        r = http.post(
            f"/api/v1/jobs/{job}/migrate",
            json={"task": "count-0", "worker": elsewhere(a, "count", "count-0")},
        )
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed", rec
        assert list(rec["precopied"]) == [giver], rec["precopied"]
        copied = rec["precopied"][giver]
        assert copied["bytes"] > 32_000_000 and 0 < copied["groups"] <= 64, copied
        assert copied["left_bytes"] == 0, copied  # no pause budget: everything went ahead
        assert (
            copied["ms"] <= rec["timings_ms"]["precopy"] + 1.0 <= rec["timings_ms"]["prepare"] + 1.0
        )
        parts = copied["waited_ms"] + copied["room_ms"] + copied["sending_ms"]
        assert 0 < parts <= copied["ms"] + 1.0, copied
        shown = ok(cli(api, "reconfig", "show", job, rec["id"]))
        assert "copied ahead in the prepare" in shown and giver in shown, shown
        # A logic swap ships no state.
        r = http.post(
            f"/api/v1/jobs/{job}/logic",
            json={"operator": "count", "logic": "examples.wordcount:count_word_v2"},
        )
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed" and rec["precopied"] == {}, rec
        assert "copied ahead" not in ok(cli(api, "reconfig", "show", job, rec["id"]))


def test_cancel_a_reconfiguration_under_way(api: Api, tmp_path: Path) -> None:
    """``POST .../reconfigurations/{id}/cancel``: a migration whose sync is held up (the
    tasks before count are slow) ends ``cancelled`` at once with nothing changed, as does a
    migration still waiting for its new worker; ended or unknown ones are refused."""
    hold = tmp_path / "hold"
    hold.touch()
    # At 1,000 records/s little queues before the held tasks and the sync could end before
    # the cancel came (it did in 1 of 4 CI runs); at 20,000/s full batches queue for seconds.
    params = {"records": 10**6, "rate": 20_000, "hold": str(hold), "output": str(tmp_path / "o")}
    held = {"name": "held", "job": "tests.e2e_jobs:held_job", "params": params}
    with api.running_job(held) as job, api.client() as http:
        before = current(http, job)
        other = elsewhere(before, "count", "count-0")
        r = http.post(f"/api/v1/jobs/{job}/migrate", json={"task": "count-0", "worker": other})
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        wait_until(
            lambda: (
                http.get(f"/api/v1/jobs/{job}/reconfigurations/{rid}").json()["status"] == "syncing"
            ),
            10,
            "the migration to wait in its sync",
        )
        r = http.post(f"/api/v1/jobs/{job}/reconfigurations/{rid}/cancel")
        assert r.status_code == 202, r.text
        assert r.json()["id"] == rid
        rec = api.wait_reconfiguration(http, job, rid, timeout=8)  # the sync timeout is 10 s
        assert rec["status"] == "cancelled", rec
        assert rec["error"] == "cancelled on request"
        assert rec["result_version"] is None
        assert current(http, job)["job"]["version"] == before["job"]["version"]
        assert http.get(f"/api/v1/jobs/{job}").json()["status"] == "running"
        events = http.get("/api/v1/events", params={"kind": "reconfiguration.cancelled"}).json()
        assert any(e["data"]["reconfiguration"] == rid for e in events["items"]), events

        r = http.post(f"/api/v1/jobs/{job}/reconfigurations/{rid}/cancel")
        assert r.status_code == 409, r.text
        assert r.json()["error"] == {
            "code": "not_cancellable",
            "message": f"reconfiguration {rid} of job {job} has ended: it cancelled",
        }
        r = http.post(f"/api/v1/jobs/{job}/reconfigurations/99999/cancel")
        assert r.status_code == 404, r.text

        # Waiting for a fresh worker: cancelled before anything was sent to the workers,
        # and a worker started for it is stopped again.
        hold.unlink()
        alive = {w["id"] for w in http.get("/api/v1/workers").json() if w["status"] == "alive"}
        r = http.post(f"/api/v1/jobs/{job}/migrate", json={"task": "count-0", "worker": "new"})
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        r = http.post(f"/api/v1/jobs/{job}/reconfigurations/{rid}/cancel")
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job, rid, timeout=45)
        assert rec["status"] == "cancelled", rec
        assert rec["error"].startswith("cancelled on request"), rec
        assert rec["result_version"] is None
        after = current(http, job)
        assert after["job"]["version"] == before["job"]["version"]
        assert tasks_of(after, "count") == tasks_of(before, "count")
        wait_until(
            lambda: (
                {w["id"] for w in http.get("/api/v1/workers").json() if w["status"] == "alive"}
                == alive
            ),
            10,
            "the worker started for the cancelled migration to stop",
        )


# One database (~14 s each): a preview is computed from the live job and stores nothing;
# the recorded scale at its end is of a kind the other tests store on both.
@pytest.mark.parametrize("api", ["sqlite"], indirect=True, ids=["sqlite"])
def test_preview_says_what_a_reconfiguration_would_do_without_doing_it(api: Api) -> None:
    """``POST .../reconfigurations/preview``: the plan, its diff, the versions it would go
    through (as many as carrying it out then makes) and the state it would ship (a
    migration ships about its task's measured state); nothing is recorded or changed;
    refused as a post would be."""
    with api.running_job({"name": "wordcount-preview", **PADDED}) as job, api.client() as http:

        def count_0_bytes() -> int | None:
            counted = counted_state(http, job)
            return None if counted is None else counted["count-0"]["state_bytes"]

        size = wait_until(count_0_bytes, 20.0, "count-0's state size", every=0.5)
        a = current(http, job)
        v = a["job"]["version"]
        other = elsewhere(a, "count", "count-0")
        url = f"/api/v1/jobs/{job}/reconfigurations/preview"

        r = http.post(url, json={"origin": "migrate", "task": "count-0", "worker": other})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert (seen["origin"], seen["base_version"], seen["result_version"]) == (
            "migrate",
            v,
            v + 1,
        )
        assert (seen["mode"], seen["steps"], seen["key_group_moves"]) == ("pause", 1, 0)
        assert seen["ops"] == [
            {"op": "assignResource", "operator": "count", "task": "count-0", "worker": other}
        ]
        moved = seen["diff"]["operators"][0]
        assert moved["operator"] == "count" and moved["moved_tasks"][0][0] == "count-0", seen
        assert "count-0" in seen["affected_tasks"]
        # All of count-0's state ships: its measured size (a report apart at most).
        assert seen["state_bytes_shipped"] == pytest.approx(size, rel=0.1), (seen, size)
        assert seen["largest_step_bytes"] == seen["state_bytes_shipped"]  # one step

        # Part of a task's key groups: what their reported shares add up to.
        count_0 = counted_state(http, job)["count-0"]
        shares = count_0["state_key_groups"]
        assert sum(shares.values()) == count_0["state_bytes"]
        big = sorted(shares, key=lambda g: -shares[g])[:8]
        groups = key_groups(a)
        moved = {
            "count-0": [g for g in groups["count-0"] if str(g) not in big],
            "count-1": sorted(groups["count-1"] + [int(g) for g in big]),
        }
        ops = [{"op": "assignWorkload", "operator": "count", "workload": moved}]
        r = http.post(url, json={"origin": "plan", "base_version": v, "ops": ops})
        assert r.status_code == 200, r.text
        expected = sum(shares[g] for g in big)
        assert r.json()["state_bytes_shipped"] == pytest.approx(expected, rel=0.1), expected

        # A fluid scale-out in steps of 8: the versions previewed are the versions made.
        body = {"operator": "count", "parallelism": 3, "mode": "fluid", "batch_size": 8}
        r = http.post(url, json={"origin": "scale", **body})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert seen["steps"] > 2 and seen["result_version"] == v + seen["steps"], seen
        assert 0 < seen["largest_step_bytes"] < seen["state_bytes_shipped"], seen
        assert seen["key_group_moves"] == 128 - 2 * 43, seen  # 43, 43, 42 key groups after
        assert seen["diff"]["operators"][0]["new_tasks"] == ["count-2"], seen
        assert current(http, job)["job"]["version"] == v  # nothing changed
        assert http.get(f"/api/v1/jobs/{job}/reconfigurations").json()["total"] == 0
        r = http.post(f"/api/v1/jobs/{job}/scale", json=body)
        rec = api.wait_reconfiguration(http, job, r.json()["id"])
        assert rec["status"] == "completed" and rec["result_version"] == v + seen["steps"], rec

        for bad, status, fragment in (
            ({"origin": "scale", "operator": "nope", "parallelism": 2}, 422, "nope"),
            ({"origin": "teleport", "task": "count-0"}, 422, "origin"),
            ({"origin": "scale", "operator": "count", "parallelism": 3}, 422, "already has 3"),
            (
                {
                    "origin": "plan",
                    "base_version": v,
                    "ops": [{"op": "assignLogic", "operator": "count", "ref": "x:y"}],
                },
                409,
                "stale",
            ),
        ):
            r = http.post(url, json=bad)
            assert r.status_code == status and fragment in r.text, (bad, r.text)


def test_the_version_a_job_shows_always_has_its_abstraction(api: Api) -> None:
    """While a fluid change makes version after version, the job's ``version`` is always
    one whose abstraction can be read (the console reads it as soon as it changes)."""
    with api.running_job(WORDCOUNT) as job, api.client() as http:
        r = http.post(
            f"/api/v1/jobs/{job}/scale",
            json={"operator": "count", "parallelism": 3, "mode": "fluid", "batch_size": 1},
        )
        assert r.status_code == 202, r.text
        rid, seen = r.json()["id"], set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rec = http.get(f"/api/v1/jobs/{job}/reconfigurations/{rid}").json()
            version = http.get(f"/api/v1/jobs/{job}").json()["version"]
            a = http.get(f"/api/v1/jobs/{job}/abstraction", params={"version": version})
            assert a.status_code == 200, (version, a.text)
            seen.add(version)
            if rec["status"] in ("completed", "failed", "aborted", "cancelled"):
                break
        assert rec["status"] == "completed", rec
        assert http.get(f"/api/v1/jobs/{job}").json()["version"] == rec["result_version"]
        assert len(seen) >= 2, seen  # it was read before and after the change
