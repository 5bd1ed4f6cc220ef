"""The CLI's REST commands (Typer's CliRunner) against a real StreamManager: jobs, the
abstraction, live reconfigurations with their progress and timings, history, workers,
tokens, uploaded code, and the error paths (401, 403, 404, 409, 422 naming the culprit,
a plan file that cannot be read, a server that does not answer)."""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN_TOKEN, Api, free_port
from click.testing import Result
from typer.testing import CliRunner

from controlplane.cli import app

runner = CliRunner()

LIVE = ["examples.wordcount:build", "-p", "records=0", "-p", "rate=500"]


def cli(api: Api | None, *args: object, token: str | None = ADMIN_TOKEN) -> Result:
    """``streampilot ARGS`` with the server and token in the environment (as a user would
    set them); ``api=None`` leaves the server unset."""
    env = {"STREAMPILOT_SERVER": api.base_url if api else None, "STREAMPILOT_TOKEN": token}
    return runner.invoke(app, [str(a) for a in args], env=env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def ok_json(result: Result) -> Any:
    return json.loads(ok(result))


def error_line(result: Result, exit_code: int, *words: str) -> str:
    """The one ``error: ...`` line a failed command prints (last on stderr, after any
    progress), checked to name ``words``."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1, result.stderr
    lines = lines[-1:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def abstraction(api: Api, job: int, *version: object) -> dict[str, Any]:
    return ok_json(cli(api, "abstraction", "show", job, "--json", *version))


def count_tasks(a: dict[str, Any], operator: str = "count") -> dict[str, dict[str, Any]]:
    op = next(o for o in a["operators"] if o["name"] == operator)
    return {t["id"]: t for t in op["tasks"]}


@pytest.fixture(scope="module")
def job(api: Api) -> Iterator[int]:
    """A running, unbounded word count submitted through the CLI (per server)."""
    submitted = ok_json(cli(api, "job", "submit", *LIVE, "--name", "cli-live", "--json"))
    assert submitted["status"] == "running", submitted
    try:
        yield submitted["id"]
    finally:
        ok(cli(api, "job", "stop", submitted["id"]))


def test_job_submit_list_show_stop(api: Api) -> None:
    out = ok(cli(api, "job", "submit", *LIVE, "--name", "cli-jobs"))
    assert "cli-jobs" in out and "running" in out and "examples.wordcount:build" in out
    listed = ok_json(cli(api, "job", "list", "--status", "running", "--json"))
    mine = next(j for j in listed["items"] if j["name"] == "cli-jobs")
    assert mine["params"] == {"records": "0", "rate": "500"}
    job_id = mine["id"]

    table = ok(cli(api, "job", "list", "--limit", 1, "--status", "running"))
    assert "cli-jobs" in table and f"1 of {listed['total']} jobs" in table
    assert "next: --offset 1" in table or listed["total"] == 1
    assert "running" in ok(cli(api, "job", "show", job_id))

    stopped = ok_json(cli(api, "job", "stop", job_id, "--json"))
    assert stopped["id"] == job_id and stopped["status"] == "stopped"
    assert ok_json(cli(api, "job", "show", job_id, "--json"))["status"] == "stopped"


def test_job_errors(api: Api) -> None:
    error_line(cli(api, "job", "show", 999999), 1, "job 999999 does not exist", "404")
    error_line(
        cli(api, "job", "submit", *LIVE, "-p", "colour=blue"), 1, "unknown param(s) colour", "422"
    )
    error_line(cli(api, "job", "submit", "examples.wordcount"), 1, "module:callable", "422")
    result = cli(api, "job", "submit", "examples.wordcount:build", "-p", "records")
    assert result.exit_code == 2 and "NAME=VALUE" in result.output


def test_scale_shows_progress_and_timings_then_history(api: Api, job: int) -> None:
    before = abstraction(api, job)
    version = before["job"]["version"]
    n = len(count_tasks(before))

    result = cli(api, "reconfigure", "scale", job, "count", n + 1)
    out = ok(result)
    assert f"of job {job} (scale): affects" in result.stderr
    assert "completed" in result.stderr  # the progress, phase by phase, on stderr
    assert f"scale, completed (version {version} -> {version + 1}" in out
    assert "timings: prepare" in out and "sync" in out and "update" in out and "total" in out
    assert "per task" in out and "update" in out and "count-0" in out

    page = ok_json(cli(api, "reconfig", "list", job, "--json"))
    rec = page["items"][0]
    assert (rec["origin"], rec["status"], rec["result_version"]) == (
        "scale",
        "completed",
        version + 1,
    )
    assert "scale" in ok(cli(api, "reconfig", "list", job))
    shown = ok_json(cli(api, "reconfig", "show", job, rec["id"], "--json"))
    assert shown == rec
    assert all(shown["timings_ms"][p] >= 0 for p in ("prepare", "sync", "update", "total"))
    assert "timings: prepare" in ok(cli(api, "reconfig", "show", job, rec["id"]))
    error_line(cli(api, "reconfig", "show", job, 999999), 1, "no reconfiguration 999999")

    after = abstraction(api, job)
    assert after["job"]["version"] == version + 1
    assert f"count-{n}" in count_tasks(after)
    assert len(count_tasks(abstraction(api, job, "--version", version))) == n
    table = ok(cli(api, "abstraction", "show", job))
    assert f"version {version + 1}" in table and f"count-{n}" in table and "groups" in table

    diff = ok_json(cli(api, "abstraction", "diff", job, "--json"))
    assert (diff["old_version"], diff["new_version"]) == (version, version + 1)
    text = ok(cli(api, "abstraction", "diff", job, "--from", version, "--to", version + 1))
    assert f"version {version} -> {version + 1}" in text
    assert "new task" in text and f"count-{n}" in text and "key groups" in text


def test_migrate_logic_and_rebalance(api: Api, job: int) -> None:
    a = abstraction(api, job)
    count0 = count_tasks(a)["count-0"]["resources"]["worker"]
    target = next(w["id"] for w in a["workers"] if w["id"] != count0 and w["status"] == "alive")
    out = ok(cli(api, "reconfigure", "migrate", job, "count-0", target, "--with-forward"))
    assert "migrate, completed" in out and "timings: prepare" in out
    after = abstraction(api, job)
    assert count_tasks(after)["count-0"]["resources"]["worker"] == target
    assert count_tasks(after, "sink")["sink-0"]["resources"]["worker"] == target  # its partner

    v2 = "examples.wordcount:count_word_v2"
    out = ok(cli(api, "reconfigure", "logic", job, "count", v2, "--task", "count-1"))
    assert "logic, completed" in out and v2 in out
    tasks = count_tasks(abstraction(api, job))
    assert tasks["count-1"]["logic"]["ref"] == v2
    assert tasks["count-0"]["logic"]["ref"] != v2

    # --no-wait answers at once with the accepted record.
    accepted = ok_json(
        cli(
            api,
            "reconfigure",
            "logic",
            job,
            "count",
            v2,
            "--task",
            "count-0",
            "--no-wait",
            "--json",
        )
    )
    assert accepted["origin"] == "logic" and accepted["affected_tasks"] == ["count-0"]
    with api.client() as http:
        assert api.wait_reconfiguration(http, job, accepted["id"])["status"] == "completed"

    error_line(
        cli(api, "reconfigure", "rebalance", job, "count", "--threshold", 1000),
        1,
        "already balanced",
        "no_change",
    )
    error_line(cli(api, "reconfigure", "migrate", job, "count-77", target), 1, "'count-77'", "422")


def test_plan_file(api: Api, job: int, tmp_path: Path) -> None:
    groups = {t: v["workload"]["key_groups"] for t, v in count_tasks(abstraction(api, job)).items()}
    moved = groups["count-0"][:2]
    plan = {  # no base_version: the command takes the current one
        "ops": [
            {
                "op": "assignWorkload",
                "operator": "count",
                "workload": {
                    "count-0": groups["count-0"][2:],
                    "count-1": groups["count-1"] + moved,
                },
            }
        ]
    }
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(plan))
    out = ok(cli(api, "reconfigure", "plan", job, file))
    assert "plan, completed" in out and "assignWorkload count" in out
    assert set(moved) <= set(
        count_tasks(abstraction(api, job))["count-1"]["workload"]["key_groups"]
    )

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ops": [{**plan["ops"][0], "workload": {"count-9": [0]}}]}))
    error_line(cli(api, "reconfigure", "plan", job, bad), 1, "count-9", "422")
    worker = {
        **plan,
        "ops": [{"op": "assignResource", "operator": "count", "task": "count-0", "worker": "w99"}],
    }
    bad.write_text(json.dumps(worker))
    error_line(cli(api, "reconfigure", "plan", job, bad), 1, "'w99'", "unknown_worker")
    bad.write_text(json.dumps({**plan, "base_version": 1}))
    error_line(cli(api, "reconfigure", "plan", job, bad), 1, "409", "stale_version")
    bad.write_text("{not json")
    error_line(cli(api, "reconfigure", "plan", job, bad), 2, str(bad), "not JSON")
    error_line(
        cli(api, "reconfigure", "plan", job, tmp_path / "none.json"), 2, "cannot read plan file"
    )
    bad.write_text("[]")
    error_line(cli(api, "reconfigure", "plan", job, bad), 2, "JSON object")


def test_workers_list_add_drain(api: Api, job: int) -> None:
    workers = ok_json(cli(api, "workers", "list", "--json"))
    alive = [w for w in workers if w["status"] == "alive"]
    assert len(alive) >= 2
    assert "alive" in ok(cli(api, "workers", "list"))
    busy = next(w for w in alive if any(t.startswith(f"{job}/") for t in w["tasks"]))
    error_line(cli(api, "workers", "drain", busy["id"]), 1, busy["id"], "worker_busy")

    (new,) = ok_json(cli(api, "workers", "add", "1", "--json"))
    assert new["status"] == "alive" and new["id"] not in {w["id"] for w in workers}
    drained = ok_json(cli(api, "workers", "drain", new["id"], "--json"))
    assert drained["id"] == new["id"]
    error_line(cli(api, "workers", "add", "1", token=_token(api, "read")), 1, "403")


def _token(api: Api, scope: str) -> str:
    return ok(cli(api, "token", "create", "--scope", scope, "--name", f"cli {scope}")).strip()


def test_token_create_over_rest_and_scopes(api: Api, job: int) -> None:
    created = ok_json(
        cli(api, "token", "create", "--scope", "operate", "--name", "cli-op", "--json")
    )
    assert created["scopes"] == ["operate"] and created["name"] == "cli-op"
    assert created["token"].startswith("sp_")
    read = _token(api, "read")
    assert read.startswith("sp_") and read != created["token"]
    ok(cli(api, "job", "show", job, token=read))
    error_line(cli(api, "reconfigure", "scale", job, "count", 9, token=read), 1, "403", "operate")
    error_line(cli(api, "token", "create", token=created["token"]), 1, "403", "admin")


def test_server_and_token_from_options_override_the_environment(api: Api, job: int) -> None:
    env = {"STREAMPILOT_SERVER": f"http://127.0.0.1:{free_port()}", "STREAMPILOT_TOKEN": "sp_nope"}
    result = runner.invoke(
        app,
        ["job", "show", str(job), "--json", "--server", api.base_url, "--token", ADMIN_TOKEN],
        env=env,
    )
    assert json.loads(ok(result))["id"] == job


def test_unauthenticated_unreachable_and_bad_address(api: Api) -> None:
    error_line(cli(api, "job", "list", token=None), 1, "401")
    error_line(cli(api, "job", "list", token="sp_not-a-token"), 1, "401")
    # Without a token, --server means the REST side of token create: refused with 401.
    result = runner.invoke(
        app, ["token", "create", "--server", api.base_url], env={"STREAMPILOT_TOKEN": None}
    )
    error_line(result, 1, "401")

    nobody = f"http://127.0.0.1:{free_port()}"
    error_line(cli(None, "job", "list", "--server", nobody), 2, f"cannot connect to {nobody}")
    error_line(cli(None, "workers", "list", "--server", "ftp://host"), 2, "server", "http://")


SLOW_IMPORT_S = 1.5
LOGIC = '''"""A count that is a new piece of logic."""


def count_word(word, _value, state):
    n = state.get(0) + 1
    state.set(n)
    return ((word, n),)
'''


def test_code_upload_list_show_and_use_as_logic(api: Api, job: int, tmp_path: Path) -> None:
    module = tmp_path / "recount.py"
    module.write_text(LOGIC)
    uploaded = ok_json(cli(api, "code", "upload", module, "--name", "recount", "--json"))
    assert uploaded["name"] == "recount" and uploaded["callables"] == ["count_word"]
    assert len(uploaded["sha256"]) == 64
    ref = f"code:{uploaded['id']}:count_word"
    again = ok(cli(api, "code", "upload", module))  # a new id; the table shows its references
    assert re.search(rf"refs +code:{uploaded['id'] + 1}:count_word", again), again
    assert uploaded["id"] in [c["id"] for c in ok_json(cli(api, "code", "list", "--json"))["items"]]
    assert "state.set(n)" in ok(cli(api, "code", "show", uploaded["id"]))

    out = ok(cli(api, "reconfigure", "logic", job, "count", ref, "--task", "count-0"))
    assert "logic, completed" in out
    assert count_tasks(abstraction(api, job))["count-0"]["logic"]["ref"] == ref

    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    error_line(cli(api, "code", "upload", broken), 1, "broken.py", "line 1", "422")
    error_line(cli(api, "code", "upload", module, token=_token(api, "operate")), 1, "403")
    result = cli(api, "code", "upload", tmp_path / "missing.py")
    assert result.exit_code == 2 and "does not exist" in result.output


def uploaded_logic(api: Api, module: Path, source: str) -> str:
    """Upload ``source`` as ``module`` through the CLI; the reference of its count_word."""
    module.write_text(source)
    return f"code:{ok_json(cli(api, 'code', 'upload', module, '--json'))['id']}:count_word"


SLOW_IMPORT = f"""import time

time.sleep({SLOW_IMPORT_S})  # a logic swap to this module prepares this long (under test)
{LOGIC}"""


def test_reconfigure_gives_up_following_after_its_timeout(
    api: Api, job: int, tmp_path: Path
) -> None:
    ref = uploaded_logic(api, tmp_path / "slow.py", SLOW_IMPORT)
    result = cli(api, "reconfigure", "logic", job, "count", ref, "--timeout", 0.3)
    # It stopped following while the change prepared: it says the change "is still" on.
    line = error_line(result, 1, "is still", "after 0.3s", f"streampilot reconfig show {job} ")
    rid = int(line.rsplit(" ", 1)[1])
    with api.client() as http:
        assert api.wait_reconfiguration(http, job, rid)["status"] == "completed"
    assert ok_json(cli(api, "reconfig", "show", job, rid, "--json"))["origin"] == "logic"


def test_cancel_stops_a_reconfiguration_under_way(api: Api, job: int, tmp_path: Path) -> None:
    """A logic swap still preparing (its module imports slowly) is cancelled: the record
    says so, the version is unchanged; cancelling it again is refused with the reason."""
    ref = uploaded_logic(api, tmp_path / "slow_too.py", f"{SLOW_IMPORT}\n# never swapped in\n")
    version = abstraction(api, job)["job"]["version"]
    rid = ok_json(cli(api, "reconfigure", "logic", job, "count", ref, "--no-wait", "--json"))["id"]
    out = ok(cli(api, "reconfig", "cancel", job, rid))
    assert f"reconfiguration {rid} of job {job}: logic, cancelled (version {version}," in out
    assert "error: cancelled on request" in out
    assert abstraction(api, job)["job"]["version"] == version
    error_line(
        cli(api, "reconfig", "cancel", job, rid),
        1,
        f"reconfiguration {rid} of job {job} has ended: it cancelled",
    )


REFUSED_ON_WORKERS = f"""import sys

if getattr(sys.modules["__main__"].__spec__, "name", None) == "runtime.worker":
    raise RuntimeError("this module refuses to load on a worker")
{LOGIC}"""


def test_a_failed_reconfiguration_exits_1_with_its_reason(
    api: Api, job: int, tmp_path: Path
) -> None:
    ref = uploaded_logic(api, tmp_path / "picky.py", REFUSED_ON_WORKERS)
    version = abstraction(api, job)["job"]["version"]
    result = cli(api, "reconfigure", "logic", job, "count", ref)
    error_line(result, 1, "refuses to load on a worker")
    assert "logic, " in result.stdout and "error: " in result.stdout  # the record, with why
    assert abstraction(api, job)["job"]["version"] == version


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_answer_that_is_not_the_apis_json_is_still_one_line(tmp_path: Path) -> None:
    """Another HTTP server at the address: its status and first line are reported."""
    handler = functools.partial(QuietFiles, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        try:
            address = f"http://127.0.0.1:{other.server_address[1]}"
            result = runner.invoke(app, ["job", "list", "--server", address, "--token", "sp_x"])
        finally:
            other.shutdown()
            thread.join(5)
    error_line(result, 1, "HTTP 404 http_error")


def test_fluid_scale_runs_in_steps(api: Api, job: int) -> None:
    before = abstraction(api, job)
    version, n = before["job"]["version"], len(count_tasks(before))
    out = ok(cli(api, "reconfigure", "scale", job, "count", n + 1, "--fluid", 4))
    assert "fluid mode" in out, out
    rec = ok_json(cli(api, "reconfig", "list", job, "--json"))["items"][0]
    assert (rec["mode"], rec["status"]) == ("fluid", "completed")
    assert rec["result_version"] > version + 2  # setup + several batches of 4 key groups
    groups = [
        g for t in count_tasks(abstraction(api, job)).values() for g in t["workload"]["key_groups"]
    ]
    assert sorted(groups) == list(range(128))
    # --fluid 0: every key group in one step (fluid: the count tasks do not pause).
    version = abstraction(api, job)["job"]["version"]
    ok(cli(api, "reconfigure", "scale", job, "count", n, "--fluid", 0))
    rec = ok_json(cli(api, "reconfig", "list", job, "--json"))["items"][0]
    assert (rec["mode"], rec["status"]) == ("fluid", "completed"), rec
    assert rec["result_version"] <= version + 3  # one move step (and setup / removals)
    kept = [f"count-{i}" for i in range(n)]
    assert all(rec["pause_ms"][t] == 0.0 for t in kept), rec["pause_ms"]
    bad = cli(api, "reconfigure", "scale", job, "count", n, "--fluid", -1)
    assert bad.exit_code == 2 and "--fluid" in bad.stderr, bad.output
    # --fluid SIZE: about that much state per step, in key groups from the measured sizes.
    ok(cli(api, "reconfigure", "scale", job, "count", n + 1, "--fluid", "1MB"))
    rec = ok_json(cli(api, "reconfig", "list", job, "--json"))["items"][0]
    assert (rec["mode"], rec["status"]) == ("fluid", "completed"), rec
    assert isinstance(rec["batch_size"], int) and rec["batch_size"] >= 1, rec
    ok(cli(api, "reconfigure", "scale", job, "count", n, "--fluid", 0))
    bad = cli(api, "reconfigure", "scale", job, "count", n, "--fluid", "8XB")
    assert bad.exit_code == 2 and "e.g. 8MB" in bad.stderr, bad.output


def test_dry_run_says_what_a_change_would_do_and_changes_nothing(
    api: Api, job: int, tmp_path: Path
) -> None:
    before = abstraction(api, job)
    version, n = before["job"]["version"], len(count_tasks(before))
    args = ("reconfigure", "scale", job, "count", n + 1, "--fluid", 8, "--dry-run")
    out = ok(cli(api, *args))
    assert f"scale would take version {version} to " in out, out
    assert "(fluid mode, 8 key groups per step: " in out and "nothing was changed" in out, out
    assert f"count: new tasks: count-{n}" in out, out
    assert re.search(r"key groups changing task: \d+; keyed state shipped between workers: ", out)
    seen = ok_json(cli(api, *args, "--json"))
    assert seen["steps"] > 1 and seen["result_version"] == version + seen["steps"], seen
    here = count_tasks(before)["count-0"]["resources"]["worker"]
    other = next(w["id"] for w in before["workers"] if w["id"] != here and w["status"] == "alive")
    plan = tmp_path / "plan.json"
    move = {"op": "assignResource", "operator": "count", "task": "count-0", "worker": other}
    plan.write_text(json.dumps({"ops": [move]}))
    out = ok(cli(api, "reconfigure", "plan", job, plan, "--dry-run"))
    assert f"plan would take version {version} to {version + 1} (pause mode)" in out, out
    error_line(
        cli(api, "reconfigure", "migrate", job, "count-0", "nowhere", "--dry-run"), 1, "nowhere"
    )
    assert abstraction(api, job)["job"]["version"] == version
