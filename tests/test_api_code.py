"""Uploaded code over REST against a real server: a module uploaded with ``POST /code``
builds a job (``code:<id>:build``) whose workers run its functions, and becomes new logic
of a running job (``assignLogic`` to ``code:<id>:...``) with exactly-once results; bad
uploads are 422 naming the file and line; scopes are enforced."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import Api, wait_until

from examples import wordcount

UPPER_WORDCOUNT = textwrap.dedent(
    '''
    """Word count of upper-cased words, and a count that is a new piece of logic."""
    from examples import wordcount
    from runtime import Dataflow
    from runtime.params import parse_params
    from runtime.sinks import Collect


    def split_upper(sentence):
        return sentence.upper().split()


    def count_again(word, value, state):
        return wordcount.count_word_v2(word, value, state)


    def build(params):
        p = parse_params(wordcount.Params, params)
        flow = Dataflow("upper")
        sentences = flow.source("sentences", wordcount.source_of(p), parallelism=2)
        words = sentences.flat_map("split", split_upper)
        counts = words.key_by(wordcount.word_key).process("count", wordcount.count_word)
        counts.sink("sink", Collect(p.output, mode="last", key=wordcount.result_key))
        return flow
    '''
)


def upload(http: httpx.Client, filename: str, source: str | bytes, **form: str) -> httpx.Response:
    data = source.encode() if isinstance(source, str) else source
    return http.post("/api/v1/code", files={"file": (filename, data, "text/x-python")}, data=form)


@pytest.fixture(scope="module")
def code(api: Api) -> dict[str, Any]:
    with api.client() as http:
        r = upload(http, "upper.py", UPPER_WORDCOUNT, name="upper wordcount")
        assert r.status_code == 201, r.text
        return r.json()


def test_upload_lists_callables_and_refs(api: Api, code: dict[str, Any]) -> None:
    assert code["name"] == "upper wordcount"
    assert code["filename"] == "upper.py"
    assert code["callables"] == ["build", "count_again", "split_upper"]
    assert code["refs"] == [f"code:{code['id']}:{c}" for c in code["callables"]]
    assert len(code["sha256"]) == 64
    with api.client() as http:
        listed = http.get("/api/v1/code").json()
        assert code["id"] in [c["id"] for c in listed["items"]]
        one = http.get(f"/api/v1/code/{code['id']}").json()
        assert one["source"] == UPPER_WORDCOUNT
        r = http.get("/api/v1/code/999999")
        assert r.status_code == 404
        assert "code 999999 does not exist" in r.json()["error"]["message"]


def test_job_built_from_uploaded_code_runs_it_on_the_workers(
    api: Api, code: dict[str, Any], tmp_path: Path
) -> None:
    params = {"records": 3000, "keys": 200, "output": str(tmp_path / "out")}
    with api.client() as http:
        r = http.post(
            "/api/v1/jobs",
            json={"name": "upper", "job": f"code:{code['id']}:build", "params": params},
        )
        assert r.status_code == 201, r.text
        job = api.wait_job(http, r.json()["id"], {"finished", "failed"}, timeout=60)
        assert job["status"] == "finished", job
        abstraction = http.get(f"/api/v1/jobs/{job['id']}/abstraction").json()
    split = next(o for o in abstraction["operators"] if o["name"] == "split")
    assert {t["logic"]["ref"] for t in split["tasks"]} == {f"code:{code['id']}:split_upper"}
    expected = {w.upper(): n for w, n in wordcount.reference(params).items()}
    assert wordcount.read_results(params["output"]) == expected


def sink_flows(http: httpx.Client, job_id: int) -> bool:
    """True once the job's sink reports records (workers report once a second)."""
    r = http.get(f"/api/v1/jobs/{job_id}/metrics", params={"window_s": 5.0})
    assert r.status_code == 200, r.text
    return any(o["kind"] == "sink" and o["in_per_s"] > 0 for o in r.json()["operators"])


def test_logic_swap_to_uploaded_code_is_exactly_once(
    api: Api, code: dict[str, Any], tmp_path: Path, held_end: Path
) -> None:
    params = {"records": 30_000, "rate": 8000, "keys": 300, "output": str(tmp_path / "out")}
    ref = f"code:{code['id']}:count_again"
    with api.client() as http:
        # The word count, running until the test lets its end come (see e2e_jobs).
        held = {**params, "held": str(held_end)}
        r = http.post(
            "/api/v1/jobs",
            json={"name": "swap", "job": "tests.e2e_jobs:held_wordcount", "params": held},
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        api.wait_job(http, job_id, {"running"})
        wait_until(lambda: sink_flows(http, job_id), 60.0, "records at the sink")
        r = http.post(f"/api/v1/jobs/{job_id}/logic", json={"operator": "count", "logic": ref})
        assert r.status_code == 202, r.text
        rec = api.wait_reconfiguration(http, job_id, r.json()["id"])
        assert rec["status"] == "completed", rec
        held_end.unlink()
        job = api.wait_job(http, job_id, {"finished", "failed"}, timeout=60)
        assert job["status"] == "finished", job
        count = next(
            o
            for o in http.get(f"/api/v1/jobs/{job_id}/abstraction").json()["operators"]
            if o["name"] == "count"
        )
    assert {t["logic"]["ref"] for t in count["tasks"]} == {ref}
    assert wordcount.read_results(params["output"]) == wordcount.reference(params)


@pytest.mark.parametrize(
    ("name", "source", "words"),
    [
        ("broken.py", "def f(:\n    pass\n", ["broken.py, line 1", "does not compile"]),
        (
            "raises.py",
            "x = 1\nraise RuntimeError('no config')\n",
            ["raises.py, line 2", "no config"],
        ),
        ("exits.py", "import os\nos._exit(3)\n", ["exits.py", "exited with code 3"]),
        ("notes.txt", "hello", ["not a Python module", ".py"]),
        ("latin1.py", b"x = '\xe9'\n", ["not UTF-8"]),
        ("big.py", "#" * (1 << 20) + "\n", ["limit is 1048576"]),
    ],
)
def test_bad_uploads_say_what_to_fix(
    api: Api, name: str, source: str | bytes, words: list[str]
) -> None:
    with api.client() as http:
        before = http.get("/api/v1/code").json()["total"]
        r = upload(http, name, source)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "bad_code"
        for word in words:
            assert word in error["message"]
        assert http.get("/api/v1/code").json()["total"] == before


def test_unknown_code_refs_are_refused(api: Api) -> None:
    with api.client() as http:
        r = http.post("/api/v1/jobs", json={"name": "x", "job": "code:987654:build", "params": {}})
        assert r.status_code == 422, r.text
        assert "no uploaded code with id 987654" in r.json()["error"]["message"]


def test_upload_needs_admin_scope(api: Api) -> None:
    with api.client() as admin:
        r = admin.post("/api/v1/tokens", json={"name": "reader", "scopes": ["read", "operate"]})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
    with api.client(token) as http:
        r = upload(http, "ok.py", "def f():\n    return 1\n")
        assert r.status_code == 403, r.text
        assert http.get("/api/v1/code").status_code == 200
    with api.client(None) as anonymous:
        assert upload(anonymous, "ok.py", "x = 1\n").status_code == 401
