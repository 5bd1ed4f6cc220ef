"""The task-centric abstraction: model and JSON, from_graph, operations and plans as
JSON, diff. Validation errors are in test_abstraction_validation.py, the plan helpers in
test_abstraction_helpers.py, invariants over random plans in test_abstraction_plans.py;
they share the deployment helpers defined here."""

from __future__ import annotations

import json
import pickle

import pytest

from controlplane.abstraction import (
    NEW_WORKER,
    Abstraction,
    AbstractionError,
    AssignLogic,
    AssignResource,
    AssignWorkload,
    InvalidPlan,
    KeyGroupConflict,
    Logic,
    Plan,
    PlanError,
    SchemaError,
    UnknownOperator,
    UnknownTask,
    UnknownWorker,
    Worker,
    Workload,
    apply_plan,
    check_abstraction,
    diff,
    from_graph,
    migrate,
    op_from_dict,
    rebalance,
    scale,
)
from controlplane.coordinator import WorkerInfo
from examples import stock_exchange, wordcount
from runtime.dataflow import Dataflow, JobGraph, load_job
from runtime.layout import Layout
from runtime.sinks import Null
from runtime.sources import Generator


def workers(n: int, slots: int = 64) -> list[Worker]:
    return [Worker(f"w{i}", f"host{i}", 1.0, 1024, "local", "alive", slots) for i in range(n)]


def deploy(graph: JobGraph, n_workers: int = 2, slots: int = 64) -> Abstraction:
    ws = workers(n_workers, slots)
    return from_graph("job-1", graph, Layout.initial(graph, [w.id for w in ws]), ws)


def wordcount_abs(parallelism: int = 2, max_parallelism: int = 16, **kw: int) -> Abstraction:
    params = {"parallelism": parallelism, "max_parallelism": max_parallelism}
    return deploy(load_job("examples.wordcount:build", params), **kw)


def rebalanced_graph() -> JobGraph:
    """lines (1) -rebalance-> split (3) -key-> count (2, 8 groups) -forward-> out (2)."""
    flow = Dataflow("rebalanced")
    lines = flow.source("lines", Generator(records=10), parallelism=1)
    words = lines.rebalance().flat_map("split", wordcount.split_words, parallelism=3)
    counts = words.key_by(wordcount.word_key).process(
        "count", wordcount.count_word, parallelism=2, max_parallelism=8
    )
    counts.sink("out", Null())
    return flow.compile()


def plan(a: Abstraction, *ops: object, **kw: object) -> Plan:
    return Plan(a.version, tuple(ops), **kw)  # type: ignore[arg-type]


def refused(a: Abstraction, p: Plan, exc: type[PlanError], *fragments: str) -> PlanError:
    """Apply ``p``, expect ``exc`` with every fragment in its message, and ``a`` unchanged."""
    before = a.to_dict()
    with pytest.raises(exc) as info:
        apply_plan(a, p)
    assert type(info.value) is exc, info.value
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    assert a.to_dict() == before
    return info.value


# -- model and JSON ----------------------------------------------------------------------------


def test_from_graph_wordcount() -> None:
    a = wordcount_abs(parallelism=2, max_parallelism=16)
    check_abstraction(a)
    assert (a.job_id, a.name, a.version, a.status) == ("job-1", "wordcount", 1, "running")
    assert [op.name for op in a.operators] == ["sentences", "split", "count", "sink"]
    assert [op.design_kind for op in a.operators] == ["source", "map", "keyed", "sink"]
    assert [op.kind for op in a.operators] == ["source", "flat_map", "keyed", "sink"]
    count = a.operator("count")
    assert count.max_parallelism == 16 and a.operator("split").max_parallelism is None
    assert [(i.upstream, i.partitioning) for i in count.inputs] == [("split", "key_groups")]
    assert count.task_ids == ("count-0", "count-1")
    assert a.task("count-1").workload.key_groups == tuple(range(8, 16))
    assert a.task("split-0").workload.weight == 1.0
    assert a.task("split-0").logic == Logic("examples.wordcount:split_words", 1)
    assert a.task("count-0").logic.ref == "examples.wordcount:count_word"
    assert a.task("count-1").resources.worker == "w1"
    assert a.task("count-1").resources.host == "host1"
    assert a.owner_of("count") == {g: f"count-{g // 8}" for g in range(16)}
    assert {t.id for t in a.tasks_on("w0")} == {"sentences-0", "split-0", "count-0", "sink-0"}
    assert a.forward_group("count") == ("count", "sink")
    assert a.forward_group("split") == ("sentences", "split")
    assert a.operator_of("sink-1").name == "sink"


def test_from_graph_stock_exchange_and_worker_info() -> None:
    graph = stock_exchange.build({"parallelism": 3, "max_parallelism": 32}).compile()
    infos = [WorkerInfo(f"w{i}", "h", 7, 2.0, 512, "h", 9000 + i, f"w{i}") for i in range(2)]
    a = from_graph("se", graph, Layout.initial(graph, ["w0", "w1"]), infos)
    check_abstraction(a)
    assert a.workers[0].to_dict() == {
        "id": "w0",
        "host": "h",
        "cpus": 2.0,
        "memory_mb": 512,
        "backend": "local",
        "status": "alive",
        "slots": 64,
    }
    assert [op.name for op in a.operators if op.keyed] == ["match", "stats"]
    assert a.task("match-2").logic.ref == "examples.stock_exchange:Match(...)"
    assert set(a.forward_group("stats")) == {"stats", "alerts", "stats_sink", "alerts_sink"}
    assert sorted(a.owner_of("stats")) == list(range(32))


def test_json_round_trip_is_exact() -> None:
    a = wordcount_abs()
    b = apply_plan(a, scale(a, "count", 3, workers=[NEW_WORKER]))
    for x in (a, b):
        text = json.dumps(x.to_dict())
        assert Abstraction.from_dict(json.loads(text)) == x
        assert Abstraction.from_dict(json.loads(text)).to_dict() == x.to_dict()
    doc = b.to_dict()
    assert doc["job"] == {"id": "job-1", "name": "wordcount", "version": 2, "status": "running"}
    count = doc["operators"][2]
    assert (count["kind"], count["transform"]) == ("keyed", "keyed")
    assert doc["operators"][1]["kind"] == "map" and doc["operators"][1]["transform"] == "flat_map"
    assert count["tasks"][2]["workload"] == {"key_groups": [6, 7, 13, 14, 15]}
    assert doc["workers"][-1]["id"] == "new-1" and doc["workers"][-1]["status"] == "pending"
    assert pickle.loads(pickle.dumps(b)) == b


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.pop("workers"), "missing field(s) 'workers'"),
        (lambda d: d["job"].update(version="2"), "job.version: expected an integer"),
        (lambda d: d["operators"][2]["tasks"][0].update(extra=1), "unexpected field(s) 'extra'"),
        (
            lambda d: d["operators"][2]["tasks"][0]["workload"].update(weight=1.0),
            "operators[2].tasks[0].workload: expected exactly one",
        ),
        (lambda d: d["operators"][0].update(kind="keyed"), "does not match transform"),
        (
            lambda d: d["operators"][0]["inputs"].append({"upstream": "x", "partitioning": "hash"}),
            "'hash' is not one of",
        ),
        (lambda d: d["operators"][2]["tasks"][0].update(id="count-01"), "is not 'count-<index>'"),
        (lambda d: d["operators"][2]["tasks"][1].update(id="count-0"), "appears twice"),
        (lambda d: d["workers"].append(d["workers"][0]), "a worker id appears twice"),
        (lambda d: d["workers"][0].update(cpus=True), "workers[0].cpus: expected a finite number"),
    ],
)
def test_from_dict_names_the_bad_field(mutate: object, fragment: str) -> None:
    doc = wordcount_abs().to_dict()
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(SchemaError) as info:
        Abstraction.from_dict(doc)
    assert fragment in str(info.value)


def test_lookups_name_what_is_missing() -> None:
    a = wordcount_abs()
    with pytest.raises(UnknownOperator, match=r"no operator 'nope'.*sentences, split, count, sink"):
        a.operator("nope")
    with pytest.raises(UnknownTask, match="no task 'count-7'"):
        a.task("count-7")
    with pytest.raises(UnknownWorker, match=r"no worker 'w9'.*w0, w1"):
        a.worker("w9")
    with pytest.raises(SchemaError, match="exactly one"):
        Workload()
    assert Workload(key_groups=(3, 1, 2)).key_groups == (1, 2, 3)


# -- operations and plans as JSON --------------------------------------------------------------


def test_ops_and_plans_round_trip() -> None:
    ops = (
        AssignResource("count", "count-2", NEW_WORKER),
        AssignResource("count", "count-1", None),
        AssignWorkload("count", {"count-0": [3, 1, 2], "count-1": []}),
        AssignWorkload("split", {"split-0": 2, "split-1": 0.5}),
        AssignLogic("count", ("count-0",), "examples.wordcount:count_word"),
        AssignLogic("split", "all", "examples.wordcount:split_words"),
    )
    p = Plan(4, ops, mode="fluid", batch_size=8)
    doc = json.loads(json.dumps(p.to_dict()))
    assert Plan.from_dict(doc) == p and hash(Plan.from_dict(doc)) == hash(p)
    assert doc["ops"][2] == {
        "op": "assignWorkload",
        "operator": "count",
        "workload": {"count-0": [1, 2, 3], "count-1": []},
    }
    assert doc["ops"][3]["workload"] == {"split-0": 2.0, "split-1": 0.5}
    assert doc["ops"][1] == {
        "op": "assignResource",
        "operator": "count",
        "task": "count-1",
        "worker": None,
    }
    assert doc["ops"][5] == {
        "op": "assignLogic",
        "operator": "split",
        "tasks": "all",
        "ref": "examples.wordcount:split_words",
    }
    assert Plan.from_dict({"base_version": 1, "ops": []}) == Plan(1, ())
    assert p.operators == ("count", "split") and len(p) == 6 and not Plan(1, ())


def wl(workload: object) -> dict:
    return {"op": "assignWorkload", "operator": "c", "workload": workload}


def res(**fields: object) -> dict:
    return {"op": "assignResource", "operator": "c", "task": "c-0", **fields}


def lg(tasks: object, **extra: object) -> dict:
    return {"op": "assignLogic", "operator": "c", "tasks": tasks, "ref": "m:f", **extra}


def doc(*ops: dict, **top: object) -> dict:
    return {"base_version": 1, "ops": list(ops), **top}


@pytest.mark.parametrize(
    ("document", "exc", "fragment"),
    [
        ({"ops": []}, SchemaError, "plan: missing field(s) 'base_version'"),
        ({"base_version": 1, "ops": {}}, SchemaError, "ops: expected an array, got an object"),
        (doc({"op": "scale"}), SchemaError, "ops[0].op: 'scale' is not one of assignWorkload"),
        (doc({"operator": "x"}), SchemaError, "ops[0]: missing field(s) 'op'"),
        (doc(res()), SchemaError, "ops[0]: missing field(s) 'worker'"),
        (doc(res(worker=3)), SchemaError, "ops[0].worker: expected a non-empty string, got the"),
        (doc(wl({"c-0": ["1", 2]})), SchemaError, "ops[0].workload['c-0'][0]: expected an integer"),
        (doc(wl({"c-0": "1"})), SchemaError, "ops[0].workload['c-0']: expected a finite number"),
        (doc(lg("some")), SchemaError, "ops[0].tasks: expected an array"),
        (doc(lg([], x=1)), SchemaError, "unexpected field(s) 'x'"),
        (doc(mode="fast"), InvalidPlan, "mode must be one of pause, fluid"),
        (doc(batch_size=4), InvalidPlan, "batch_size applies to mode 'fluid' only"),
        ({"base_version": 0, "ops": []}, InvalidPlan, "base_version must be an int >= 1"),
        (doc(wl({"c-0": -1})), InvalidPlan, "weight must be a finite number >= 0, got -1"),
        (doc(wl({"c-0": [1], "c-1": 1})), InvalidPlan, "mixes key groups and weights"),
        (doc(wl({})), InvalidPlan, "workload must be a non-empty"),
        (doc(wl({"c-0": [1, 1]})), KeyGroupConflict, "key group 1 is listed twice"),
        (doc(wl({"c-0": [1], "c-1": [1]})), KeyGroupConflict, "listed for tasks 'c-0' and 'c-1'"),
        (doc(lg(["c-0", "c-0"])), InvalidPlan, "a task is listed twice"),
    ],
)
def test_bad_plan_documents(document: dict, exc: type[Exception], fragment: str) -> None:
    with pytest.raises(exc) as info:
        Plan.from_dict(document)
    assert type(info.value) is exc
    assert fragment in str(info.value)


def test_op_from_dict_rejects_non_objects() -> None:
    with pytest.raises(SchemaError, match=r"op: expected an object, got an array"):
        op_from_dict([1])


# -- diff -----------------------------------------------------------------------------------------


def test_diff_of_a_migration_and_a_rebalance() -> None:
    a = deploy(rebalanced_graph(), n_workers=3)
    b = apply_plan(a, migrate(a, "split-1", "w2"))
    d = diff(a, b)
    assert d.operator("split").moved_tasks == (("split-1", "w1", "w2"),)
    assert d.upstream_routing_changes == {"lines-0"}
    assert d.downstream_channel_changes == {"count-0", "count-1"}
    assert d.affected == {"split-1", "lines-0", "count-0", "count-1"}
    c = apply_plan(b, rebalance(b, "count", {0: 10.0, 1: 10.0, 2: 5.0, 5: 1.0}))
    d = diff(b, c)
    assert d.operator("count").key_group_moves == ((0, "count-0", "count-1"),)
    assert d.upstream_routing_changes == {"split-0", "split-1", "split-2"}
    assert d.affected == {"count-0", "count-1", "split-0", "split-1", "split-2"}
    assert json.loads(json.dumps(d.to_dict()))["affected"] == sorted(d.affected)
    with pytest.raises(AbstractionError, match="not two versions of the same job"):
        diff(a, wordcount_abs())
