"""Hot keys in the metrics: a running word count with Zipf 2.0 word frequencies reports its
top word as the hottest key of the count task that owns it, with that word's true share of
the task's input, over REST (a real server and workers); the controllers' metrics window
reads it and writes it back unchanged; Prometheus has each keyed task's heaviest share
while the job runs. A server with ``hot_keys`` off reports none, and still each key
group's records. The window's summary sums each task's reports per key, and a document
without hot keys still reads."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import Api, running_server, wait_until
from prometheus_client.parser import text_string_to_metric_families

from controllers.metrics import HotKey, MetricsWindow, TaskSample
from controlplane.engine_views import MetricsView
from controlplane.metrics.service import summarize
from examples.wordcount import reference
from runtime.keygroups import key_group

MAX_PARALLELISM = 128
PARAMS = {"records": 8000, "rate": 2000, "zipf": 2.0, "keys": 1000, "seed": 5}
WORDCOUNT = {"name": "wordcount-hot-keys", "job": "examples.wordcount:build", "params": PARAMS}
WINDOW_S = 120.0  # the whole run (about 4 s)


@pytest.mark.parametrize("api", ["sqlite"], indirect=True)  # no database read: one will do
def test_the_top_word_is_its_tasks_hottest_key_with_its_true_share(api: Api) -> None:
    """Over a window holding the whole (bounded) run, the top word's share of its task's
    input is the one the generator's reference gives."""
    truth = reference(PARAMS)
    top, _ = max(truth.items(), key=lambda kv: kv[1])
    group = key_group(top, MAX_PARALLELISM)
    with api.running_job(WORDCOUNT) as job_id, api.client() as http:
        api.wait_job(http, job_id, {"finished"}, timeout=60.0)
        r = http.get(f"/api/v1/jobs/{job_id}/metrics", params={"window_s": WINDOW_S})
        assert r.status_code == 200, r.text
        body = r.json()

    counting = [t for t in body["tasks"] if t["operator"] == "count"]
    owner = next(t for t in counting if str(group) in t["key_groups"])
    hottest = owner["hot_keys"][0]
    assert hottest["key"] == top and hottest["group"] == group and not hottest["key_repr"]
    owned = {int(g) for g in owner["key_groups"]}
    true_share = truth[top] / sum(n for w, n in truth.items() if key_group(w) in owned)
    # Batches under 16 records are counted whole (the share is then within ~0.005); a task
    # flooded with batches of 512 counts 8 of each: ~860 samples here, sd 0.015.
    assert hottest["share"] == pytest.approx(true_share, abs=0.05)
    assert hottest["per_s"] == pytest.approx(hottest["share"] * owner["in_per_s"], rel=1e-6)
    assert 0 <= hottest["error_per_s"] <= hottest["per_s"]
    for t in counting:  # every hot key of a task is a word of the groups it counted
        rates = [h["per_s"] for h in t["hot_keys"]]
        assert rates == sorted(rates, reverse=True)
        assert all(str(h["group"]) in t["key_groups"] for h in t["hot_keys"])
        assert all(h["group"] == key_group(h["key"]) for h in t["hot_keys"])
    assert all(t["hot_keys"] == [] for t in body["tasks"] if t["operator"] != "count")

    window = MetricsWindow.from_dict(body)
    heaviest = window.hot_keys("count")[0]
    assert heaviest == HotKey(
        key=top,
        group=group,
        task=owner["task"],
        per_s=hottest["per_s"],
        error_per_s=hottest["error_per_s"],
        share=hottest["share"],
    )
    assert MetricsWindow.from_dict(window.to_dict()) == window
    for t in body["tasks"]:
        assert window.task(t["task"]).to_dict()["hot_keys"] == t["hot_keys"]


def hot_key_gauges(text: str, job_id: int) -> dict[str, dict[str, float]]:
    """task -> {metric name: value} of the hot-key gauges of job ``job_id``."""
    gauges: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("streampilot_hot_key_") and s.labels["job"] == str(job_id):
                assert s.labels["operator"] == "count", s
                gauges.setdefault(s.labels["task"], {})[s.name] = s.value
    return gauges


@pytest.mark.parametrize("api", ["sqlite"], indirect=True)
def test_prometheus_has_each_keyed_task_s_heaviest_share_while_the_job_runs(api: Api) -> None:
    """An endless Zipf 2.0 word count: the task owning the top word exposes that word's
    share of its input (the generator's, within the sampling's noise) and a rate; the
    key is not a label."""
    truth = reference(PARAMS)  # the same seeded generator, bounded: its frequencies
    top, _ = max(truth.items(), key=lambda kv: kv[1])
    body = {**WORDCOUNT, "name": "wordcount-hot-keys-live", "params": {**PARAMS, "records": 0}}
    with api.running_job(body) as job_id, api.client() as http:
        a = http.get(f"/api/v1/jobs/{job_id}/abstraction").json()
        count = next(o for o in a["operators"] if o["name"] == "count")
        owner = next(
            t
            for t in count["tasks"]
            if key_group(top, MAX_PARALLELISM) in t["workload"]["key_groups"]
        )
        owned = set(owner["workload"]["key_groups"])
        true_share = truth[top] / sum(n for w, n in truth.items() if key_group(w) in owned)

        def owner_reported() -> dict[str, float] | None:
            with api.client(token=None) as anonymous:
                gauges = hot_key_gauges(anonymous.get("/metrics").text, job_id)
            return gauges.get(owner["id"])

        got = wait_until(owner_reported, 60.0, "the top word's task in /metrics", every=0.5)
    assert got["streampilot_hot_key_share"] == pytest.approx(true_share, abs=0.1)
    assert got["streampilot_hot_key_records_per_second"] > 0


def test_a_server_with_hot_keys_off_reports_none_and_still_each_key_groups_records(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``hot_keys=False`` (``STREAMPILOT_HOT_KEYS=false``) reaches the workers with the
    deploy: their keyed tasks send no hot keys, and their key-group counts add up to the
    words counted, as with the sketch on."""
    tmp = str(tmp_path_factory.mktemp("no-hot-keys"))
    with (
        running_server("sqlite", tmp, hot_keys=False) as api,
        api.running_job(WORDCOUNT) as job_id,
        api.client() as http,
    ):
        api.wait_job(http, job_id, {"finished"}, timeout=60.0)
        r = http.get(f"/api/v1/jobs/{job_id}/metrics", params={"window_s": WINDOW_S})
        assert r.status_code == 200, r.text
        body = r.json()
    counting = [t for t in body["tasks"] if t["operator"] == "count"]
    assert len(counting) == 2 and all(t["hot_keys"] == [] for t in body["tasks"])
    assert all(t["key_groups"] for t in counting)
    words = sum(reference(PARAMS).values())
    assert sum(n for t in counting for n in t["key_groups"].values()) == words


def _view(*snapshots: dict[str, Any]) -> MetricsView:
    return MetricsView(
        now=100.0 + len(snapshots),
        window_s=2.0,
        samples=tuple((100.0 + i, "count-0", s) for i, s in enumerate(snapshots)),
        operator_of={"count-0": "count"},
        kinds={"count": "keyed"},
        placement={"count-0": "w1"},
        workers={},
    )


def report(records: int, *hot_keys: dict[str, Any]) -> dict[str, Any]:
    """One second of a keyed task (fully busy) with these hot keys."""
    return {"records_in": records, "busy_s": 1.0, "hot_keys": hot_keys}


def test_the_summary_sums_each_keys_reports_over_the_window() -> None:
    view = _view(
        report(
            1000,
            {"key": ("a", 1), "group": 3, "count": 600, "error": 10},
            {"key": "b'x'", "group": 5, "count": 100, "error": 0, "repr": True},
        ),
        report(
            1000,
            {"key": ["a", 1], "group": 3, "count": 500, "error": 20},  # as JSON gives it
            {"key": "b'x'", "group": 7, "count": 300, "error": 0},  # a str, not a repr
        ),
    )
    task = summarize(1, view).tasks[0]
    assert [h.model_dump() for h in task.hot_keys] == [
        {"key": ["a", 1], "key_repr": False, "group": 3, "per_s": 550.0, "error_per_s": 15.0,
         "share": 0.55},
        {"key": "b'x'", "key_repr": False, "group": 7, "per_s": 150.0, "error_per_s": 0.0,
         "share": 0.15},
        {"key": "b'x'", "key_repr": True, "group": 5, "per_s": 50.0, "error_per_s": 0.0,
         "share": 0.05},
    ]  # fmt: skip
    sample = TaskSample.from_dict(task.model_dump(mode="json"), "task")
    assert sample.hot_keys[0] == HotKey(("a", 1), 3, "count-0", 550.0, 15.0, 0.55)
    assert sample.hot_keys[2].key_repr


def test_a_window_without_hot_keys_still_reads() -> None:
    doc = summarize(1, _view(report(500))).model_dump(mode="json")
    assert doc["tasks"][0]["hot_keys"] == []
    del doc["tasks"][0]["hot_keys"]  # a control plane from before the field
    window = MetricsWindow.from_dict(doc)
    assert window.tasks[0].hot_keys == () and window.hot_keys("count") == []
