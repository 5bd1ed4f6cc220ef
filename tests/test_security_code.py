"""Attacks on the control plane through job and logic references and sink paths, against a
real server (one for the module, on SQLite, with 2 local workers).

- A job or logic reference to anything but registered code (an entry point of the
  ``streampilot.jobs`` group, a callable a registered module defines, an upload) is a 422
  that says how to register code, with ``operate`` and ``admin`` tokens alike, and runs
  nothing: a ``subprocess:run`` job whose params would touch a file leaves no file.
- Registered code works end to end: an entry point's name, ``module:callable`` and an
  upload build jobs that finish with exact output; a logic swap to a registered ref
  completes; and the server process never imports a job's module (only its workers do).
- A job submitted with ``operate`` writes only under ``<data_dir>/jobs/<id>/``; ``admin``
  may name any path.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_support import TEST_JOB_MODULES, Api, running_server

from examples import wordcount

MARKER_MODULE = "tests.import_noting_job"  # notes the pid of each process importing it
UNREGISTERED_JOBS = [
    "subprocess:run",
    "os:system",
    "builtins:eval",
    "examples.wordcount:os",  # a module it imports, not a callable it defines
    "code:999:build",
    "this:s",  # importing it prints: refused before any import
]
UNREGISTERED_LOGIC = [*UNREGISTERED_JOBS, "wordcount"]  # an entry point is no logic
HINTS = ("POST /api/v1/code", "streampilot.jobs", "STREAMPILOT_JOB_MODULES")
TOKENS = ("operate", "admin")
SMALL = {"records": 3000, "keys": 200}  # a word count that finishes within seconds

PASS_THROUGH = textwrap.dedent(
    '''
    """The word count, with a split of its own."""
    from examples import wordcount
    from runtime import Dataflow
    from runtime.params import parse_params
    from runtime.sinks import Collect


    def split(sentence):
        return sentence.split()


    def build(params):
        p = parse_params(wordcount.Params, params)
        flow = Dataflow("uploaded")
        sentences = flow.source("sentences", wordcount.source_of(p), parallelism=2)
        words = sentences.flat_map("split", split)
        counts = words.key_by(wordcount.word_key).process("count", wordcount.count_word)
        counts.sink("sink", Collect(p.output, mode="last", key=wordcount.result_key))
        return flow
    '''
)


@pytest.fixture(scope="module")
def notes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file :data:`MARKER_MODULE` appends importing pids to (the server's workers
    inherit the variable when they start)."""
    path = tmp_path_factory.mktemp("imports") / "pids"
    before = os.environ.get("STREAMPILOT_TEST_IMPORTS")
    os.environ["STREAMPILOT_TEST_IMPORTS"] = str(path)
    try:
        yield path
    finally:
        if before is None:
            del os.environ["STREAMPILOT_TEST_IMPORTS"]
        else:
            os.environ["STREAMPILOT_TEST_IMPORTS"] = before


@pytest.fixture(scope="module")
def server(notes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("security-code")
    modules = [*TEST_JOB_MODULES, MARKER_MODULE]
    with running_server("sqlite", str(root), job_modules=modules) as api:
        yield api


@pytest.fixture(scope="module")
def data_dir(server: Api) -> Path:
    return Path(server.database_url.removeprefix("sqlite:///")).parent / "data"


@pytest.fixture(scope="module")
def tokens(server: Api) -> dict[str, str | None]:
    with server.client() as admin:
        r = admin.post("/api/v1/tokens", json={"name": "operator", "scopes": ["operate"]})
        assert r.status_code == 201, r.text
        return {"operate": r.json()["token"], "admin": None}


def client(api: Api, tokens: dict[str, str | None], scope: str) -> httpx.Client:
    token = tokens[scope]
    return api.client(token) if token is not None else api.client()


@pytest.fixture(scope="module")
def running(server: Api) -> Iterator[int]:
    """A word count that runs until the module ends (the target of logic refs)."""
    body = {"name": "target", "job": "wordcount", "params": {"records": 0, "rate": 200}}
    with server.running_job(body) as job_id, server.client() as http:
        server.wait_job(http, job_id, {"running"})
        yield job_id


def refused(r: httpx.Response, code: str, *words: str) -> str:
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], error
    return error["message"]


def jobs_total(http: httpx.Client) -> int:
    return http.get("/api/v1/jobs", params={"limit": 1}).json()["total"]


@pytest.mark.parametrize("scope", TOKENS)
@pytest.mark.parametrize("ref", UNREGISTERED_JOBS)
def test_unregistered_job_refs_are_refused_and_run_nothing(
    server: Api, tokens: dict, scope: str, ref: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    params = {"touch": 0, str(marker): 0}  # subprocess.run(params) would run `touch marker`
    imported = set(sys.modules)
    with client(server, tokens, scope) as http:
        before = jobs_total(http)
        r = http.post("/api/v1/jobs", json={"name": "attack", "job": ref, "params": params})
        refused(r, "bad_job_ref", repr(ref), "not registered", *HINTS)
        assert jobs_total(http) == before
    assert not marker.exists()
    assert "this" in imported or "this" not in sys.modules


@pytest.mark.parametrize("ref", UNREGISTERED_LOGIC)
def test_unregistered_logic_refs_are_refused_in_plans_and_previews(
    server: Api, tokens: dict, running: int, ref: str
) -> None:
    job = f"/api/v1/jobs/{running}"
    imported = set(sys.modules)
    for scope in TOKENS:
        with client(server, tokens, scope) as http:
            version = http.get(f"{job}/abstraction").json()["job"]["version"]
            plan = {"ops": [{"op": "assignLogic", "operator": "count", "ref": ref}]}
            logic = {"operator": "count", "logic": ref}
            attempts = [
                ("/logic", logic),
                ("/reconfigurations", {"base_version": version, **plan}),
                ("/reconfigurations/preview", {"origin": "logic", **logic}),
                ("/reconfigurations/preview", {"origin": "plan", "base_version": version, **plan}),
            ]
            for path, body in attempts:
                refused(http.post(job + path, json=body), "bad_logic", repr(ref), *HINTS)
            assert http.get(f"{job}/abstraction").json()["job"]["version"] == version
            assert http.get(f"{job}/reconfigurations").json()["total"] == 0
    assert "this" in imported or "this" not in sys.modules


def test_an_entry_point_job_runs_with_operate_and_writes_under_its_directory(
    server: Api, tokens: dict, data_dir: Path
) -> None:
    params = {**SMALL, "output": "counts"}
    with client(server, tokens, "operate") as http:
        r = http.post("/api/v1/jobs", json={"name": "ep", "job": "wordcount", "params": params})
        assert r.status_code == 201, r.text
        job = server.wait_job(http, r.json()["id"], {"finished", "failed"}, timeout=60)
    assert job["status"] == "finished", job
    assert job["job"] == "wordcount"
    output = data_dir / "jobs" / str(job["id"]) / "counts"
    assert wordcount.read_results(str(output)) == wordcount.reference(params)


def test_a_module_callable_job_runs_with_admin_writing_anywhere(
    server: Api, tmp_path: Path
) -> None:
    params = {**SMALL, "output": str(tmp_path / "anywhere")}
    body = {"name": "mc", "job": "examples.wordcount:build", "params": params}
    with server.client() as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job = server.wait_job(http, r.json()["id"], {"finished", "failed"}, timeout=60)
    assert job["status"] == "finished", job
    assert wordcount.read_results(params["output"]) == wordcount.reference(params)


def test_an_uploaded_job_runs_with_operate(server: Api, tokens: dict, data_dir: Path) -> None:
    with server.client() as admin:
        files = {"file": ("pass_through.py", PASS_THROUGH.encode(), "text/x-python")}
        r = admin.post("/api/v1/code", files=files)
        assert r.status_code == 201, r.text
        ref = f"code:{r.json()['id']}:build"
    params = {**SMALL, "output": "counts"}
    with client(server, tokens, "operate") as http:
        r = http.post("/api/v1/jobs", json={"name": "up", "job": ref, "params": params})
        assert r.status_code == 201, r.text
        job = server.wait_job(http, r.json()["id"], {"finished", "failed"}, timeout=60)
        assert job["status"] == "finished", job
        refused(
            http.post(
                "/api/v1/jobs", json={"name": "x", "job": ref.replace(":build", ":wordcount")}
            ),
            "bad_job_ref",
            "'wordcount' is not a function or class defined",
        )
    output = data_dir / "jobs" / str(job["id"]) / "counts"
    assert wordcount.read_results(str(output)) == wordcount.reference(params)


def test_a_logic_swap_to_registered_code_completes(server: Api, tokens: dict) -> None:
    params = {"records": 40_000, "rate": 10_000, "keys": 300, "output": "counts"}
    ref = "examples.wordcount:count_word_v2"
    with client(server, tokens, "operate") as http:
        r = http.post("/api/v1/jobs", json={"name": "swap", "job": "wordcount", "params": params})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        server.wait_job(http, job_id, {"running"})
        r = http.post(f"/api/v1/jobs/{job_id}/logic", json={"operator": "count", "logic": ref})
        assert r.status_code == 202, r.text
        rec = server.wait_reconfiguration(http, job_id, r.json()["id"])
        assert rec["status"] == "completed", rec
        job = server.wait_job(http, job_id, {"finished", "failed"}, timeout=60)
        assert job["status"] == "finished", job
        operators = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()["operators"]
    count = next(o for o in operators if o["name"] == "count")
    assert {t["logic"]["ref"] for t in count["tasks"]} == {ref}


def test_the_server_never_imports_a_jobs_module(server: Api, tokens: dict, notes: Path) -> None:
    body = {"name": "noting", "job": f"{MARKER_MODULE}:build", "params": {"rate": 200}}
    with client(server, tokens, "operate") as http:
        r = http.post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        try:
            server.wait_job(http, job_id, {"running"})
            logic = {"operator": "count", "logic": f"{MARKER_MODULE}:count"}
            r = http.post(f"/api/v1/jobs/{job_id}/logic", json=logic)
            assert r.status_code == 202, r.text
            rec = server.wait_reconfiguration(http, job_id, r.json()["id"])
            assert rec["status"] == "completed", rec
        finally:
            http.delete(f"/api/v1/jobs/{job_id}")
    pids = {int(line) for line in notes.read_text().split()}
    assert pids, "the workers ran the job: they imported its module"
    assert os.getpid() not in pids


@pytest.mark.parametrize("output", ["/tmp/streampilot-attack", "../escape", "a/../../escape"])
def test_operate_sink_paths_outside_the_jobs_directory_are_refused(
    server: Api, tokens: dict, output: str
) -> None:
    params = {**SMALL, "output": output}
    with client(server, tokens, "operate") as http:
        before = jobs_total(http)
        r = http.post("/api/v1/jobs", json={"name": "out", "job": "wordcount", "params": params})
        refused(r, "sink_path_refused", repr(output), "operate", "admin token may name any path")
        assert jobs_total(http) == before
    assert not Path(output).is_absolute() or not Path(output).exists()


def test_operate_sink_paths_through_a_symlink_out_are_refused(
    server: Api, tokens: dict, data_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    with client(server, tokens, "operate") as http:
        newest = http.get("/api/v1/jobs", params={"limit": 1}).json()["items"]
        next_id = (newest[0]["id"] if newest else 0) + 1  # SQLite: the next job's id
        directory = data_dir / "jobs" / str(next_id)
        directory.mkdir(parents=True)
        (directory / "link").symlink_to(outside)
        params = {**SMALL, "output": "link/counts"}
        r = http.post("/api/v1/jobs", json={"name": "out", "job": "wordcount", "params": params})
        refused(r, "sink_path_refused", "'link/counts'", str(directory.resolve()))
    assert list(outside.iterdir()) == []
