"""The controller SDK: views and metrics through JSON, configs, the base class, plan
building, the queueing model and the registry of built-ins."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from controllers_support import JOB, task, view_of, window, wordcount

from controllers import (
    BUILTINS,
    AssignResource,
    ConfigError,
    Controller,
    DecisionError,
    MetricsWindow,
    Outcome,
    Plan,
    PlanBuilder,
    View,
    ViewError,
    decision_of,
    parse_config,
    preview,
    scale,
)
from controllers.queueing import erlang_c, sojourn_s
from controlplane.abstraction import NEW_WORKER, KeyGroupConflict, apply_plan


def recorded() -> View:
    a = wordcount()
    metrics = window(
        [
            task("count-0", busy=0.5, groups={0: 30.0, 3: 10.0}, queued=7, state_bytes=8000),
            task("count-1", busy=0.25, groups={9: 20.0}, worker="w1", state_bytes=2000),
            task("split-0", in_per_s=10.0, busy=0.1),
        ],
        traffic={("split-0", "count-0"): 400.0, ("split-0", "count-1"): 200.0},
        p99_ms=120.0,
    )
    history = [
        Outcome(900.0, scale(a, "count", 3), "completed", None, 5, 11),
        Outcome(950.0, scale(a, "count", 1), "refused", "cooldown: ...", 0, None),
    ]
    return view_of(a, metrics, now=1000.0, history=history)


def test_view_round_trips_through_json() -> None:
    v = recorded()
    doc = json.loads(json.dumps(v.to_dict()))
    assert View.from_dict(doc) == v
    assert doc["metrics"]["tasks"][0]["key_groups"] == {"0": 300, "3": 100}  # JSON keys
    assert v.job_id == JOB and v.now == 1000.0 and v.workers == v.abstraction.workers
    assert [o.status for o in v.history] == ["completed", "refused"]
    assert v.history[0].plan == scale(v.abstraction, "count", 3)
    assert v.history[0].applied and not v.history[1].applied
    empty = view_of(wordcount())  # metrics null: nothing reported yet
    assert empty.metrics.samples == 0 and empty.metrics.key_group_loads("count") == {}
    assert View.from_dict(empty.to_dict()) == empty


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.pop("now"), "view: missing field 'now'"),
        (lambda d: d.update(job_id="2"), "view of job '2' holds the abstraction of job '1'"),
        (lambda d: d["metrics"].update(job_id=3), "holds the metrics of job 3"),
        (lambda d: d["metrics"]["tasks"][1].update(busy="x"), "view.metrics.tasks[1].busy"),
        (lambda d: d["metrics"]["tasks"][0]["key_groups"].update(a=1), "key 'a' is not"),
        (lambda d: d["history"][0].update(status="done"), "view.history[0].status"),
        (lambda d: d["history"][0]["plan"].pop("ops"), "view.history[0].plan: plan: missing"),
        (lambda d: d["abstraction"]["job"].pop("name"), "view.abstraction: job: missing"),
        (lambda d: d["workers"][0].pop("host"), "view.workers[0]: worker: missing"),
    ],
)
def test_bad_view_documents_name_the_field(mutate: object, fragment: str) -> None:
    doc = recorded().to_dict()
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(ViewError, match=None) as info:
        View.from_dict(doc)
    assert fragment in str(info.value), str(info.value)


def test_metrics_accessors() -> None:
    m = recorded().metrics
    assert m.key_group_loads("count") == {0: 30.0, 3: 10.0, 9: 20.0}
    assert m.input_rate("count") == 60.0 and m.queue_length("count") == 7
    assert m.task_loads("count") == {"count-0": 40.0, "count-1": 20.0}
    assert m.processing_speeds("count") == {"count-0": 80.0, "count-1": 80.0}
    assert m.service_rate("count") == pytest.approx(80.0)
    assert m.service_rate("sink") is None and m.task("sink-0") is None
    assert m.processing_speeds("split") == {"split-0": 100.0}
    order = ["split-0", "count-0", "count-1"]
    assert np.array_equal(
        m.traffic_matrix(order), np.array([[0, 400.0, 200.0], [0, 0, 0], [0, 0, 0]])
    )
    assert m.traffic_matrix(metric="records_per_s")[2, 0] == 40.0  # sorted: split-0 last
    assert m.channel_rates()[("split-0", "count-1")] == 200.0
    assert m.latency.p99_ms == 120.0 and m.latency.count == 1000
    assert m.state_bytes("count") == {"count-0": 8000, "count-1": 2000}
    assert m.task("count-0").state_keys == 8  # type: ignore[union-attr]
    assert m.operator("count").state_bytes == 10_000  # type: ignore[union-attr]
    assert m.state_bytes("split") == {} and m.operator("split").state_bytes is None  # type: ignore[union-attr]
    assert MetricsWindow.from_dict(m.to_dict()) == m
    # A document from before state sizes were reported reads with none.
    doc = m.to_dict()
    for t in doc["tasks"]:
        del t["state_keys"], t["state_bytes"]
    for o in doc["operators"]:
        del o["state_bytes"]
    assert MetricsWindow.from_dict(doc).state_bytes("count") == {}


def test_a_partitioned_source_s_lag_and_stalls_are_read_per_partition() -> None:
    doc = recorded().metrics.to_dict()
    doc["tasks"][0] = {
        **doc["tasks"][0],
        "task": "src-0",
        "operator": "src",
        "partitions": {
            "orders-0": {"lag": 120, "stalled": None},
            "orders-2": {"lag": None, "stalled": "cannot reach 127.0.0.1:9092 (retrying)"},
        },
    }
    m = MetricsWindow.from_dict(doc)
    assert m.source_lag("src") == {"orders-0": 120}
    assert m.stalled("src") == {"orders-2": "cannot reach 127.0.0.1:9092 (retrying)"}
    assert MetricsWindow.from_dict(m.to_dict()) == m
    doc["tasks"][0]["partitions"]["orders-0"]["lag"] = "many"
    with pytest.raises(ViewError, match=r"partitions\['orders-0'\].lag"):
        MetricsWindow.from_dict(doc)


@dataclass(frozen=True)
class _Config:
    threshold: float = 0.2
    names: tuple[str, ...] = ()
    limits: dict[str, int] | None = None
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.threshold > 1:
            raise ValueError("threshold must be <= 1")


class _Typed(Controller):
    config_class = _Config

    def decide(self, view: View) -> Plan | None:
        return None


def test_configs_are_parsed_and_checked() -> None:
    c = parse_config(_Config, {"threshold": 1, "names": ["a", "b"], "limits": {"a": 2}})
    assert c == _Config(1.0, ("a", "b"), c.limits) and dict(c.limits or {}) == {"a": 2}
    assert isinstance(c.threshold, float)
    for bad, fragment in [
        ({"treshold": 0.1}, "config.treshold: unknown field; _Config has threshold, names"),
        ({"threshold": "high"}, "config.threshold: expected a number"),
        ({"names": "a"}, "config.names: expected an array"),
        ({"names": [1]}, "config.names[0]: expected a string"),
        ({"limits": {"a": 1.5}}, "config.limits.a: expected an integer"),
        ({"threshold": 2}, "config: threshold must be <= 1"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_config(_Config, bad)
        assert fragment in str(info.value)
    assert _Typed({"interval_s": 2}).interval_s == 2.0 and _Typed().interval_s == 5.0
    with pytest.raises(ConfigError, match=r"config.interval_s: expected a number > 0"):
        _Typed({"interval_s": 0})


def test_controller_base_and_decisions() -> None:
    v = recorded()
    plain = Controller({"interval_s": 3, "x": [1]})
    assert plain.interval_s == 3.0 and plain.config["x"] == [1]
    assert Controller().interval_s == Controller.interval_s == 10.0
    with pytest.raises(NotImplementedError, match="must define decide"):
        plain.decide(v)
    with pytest.raises(ConfigError, match="expected an object"):
        Controller([1, 2])  # type: ignore[arg-type]
    assert decision_of(None, v) is None
    assert decision_of(scale(v.abstraction, "count", 2), v) is None  # empty plan: no change
    p = scale(v.abstraction, "count", 3)
    assert decision_of(p, v) is p
    with pytest.raises(DecisionError, match="returned dict, expected a Plan or None"):
        decision_of(p.to_dict(), v)
    stale = Plan(v.abstraction.version + 1, p.ops)
    with pytest.raises(DecisionError, match="against version 2, but the view holds version 1"):
        decision_of(stale, v)


def test_plan_builder_composes_steps() -> None:
    a = wordcount(parallelism=2, n_workers=3, slots=4)  # w0, w1 hold 4 tasks each, w2 none
    b = PlanBuilder(a)
    b.scale("count", 3)  # count-2 and sink-2 go to the idle w2
    b.scale("count", 4)  # count-3 and sink-3: w2 has 2 slots left, so there again
    b.add(AssignResource("count", "count-0", "w0"))  # already there: left out
    b.update_logic("count", "code:9:count_v2")  # uploaded code: not resolved here
    plan = b.build()
    assert plan is not None and plan.base_version == a.version
    result = preview(a, plan)
    assert result == b.current.replace(version=result.version)
    assert [t.worker for t in result.operator("count").tasks] == ["w0", "w1", "w2", "w2"]
    assert {t.logic.ref for t in result.operator("count").tasks} == {"code:9:count_v2"}
    assert len(b) == len(plan.ops) and AssignResource("count", "count-0", "w0") not in plan.ops
    undo = PlanBuilder(a).migrate("count-0", "w2").migrate("count-0", "w0")
    assert undo.build() is None and PlanBuilder(a).build() is None
    with pytest.raises(KeyGroupConflict):
        PlanBuilder(a).rebalance("count", {99: 1.0})
    fresh = PlanBuilder(a).scale("count", 3, workers=[NEW_WORKER]).build()
    assert fresh is not None
    assert apply_plan(a, fresh).task("count-2").worker == "new-1"


def test_mm_k_model() -> None:
    assert sojourn_s(1.0, 2.0, 1) == pytest.approx(1.0)  # M/M/1: 1 / (mu - lam)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert sojourn_s(1.0, 1.0, 2) == pytest.approx(4 / 3)
    assert sojourn_s(2.0, 1.0, 2) == math.inf and erlang_c(2, 2.0) == 1.0
    assert sojourn_s(0.0, 4.0, 3) == 0.25
    many = [sojourn_s(90.0, 1.0, k) for k in range(91, 200)]
    assert all(x >= y for x, y in itertools.pairwise(many))  # more tasks, less wait
    assert many[0] > many[1] > many[2] > 1.0
    assert many[-1] == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError, match="k >= 1"):
        erlang_c(0, 1.0)


def test_builtins_registry() -> None:
    assert set(BUILTINS) == {
        "load_balancer",
        "latency_autoscaler",
        "ds2_autoscaler",
        "flink_autoscaler",
        "dsc_placement",
        "logic_updater",
    }
    for name, cls in BUILTINS.items():
        c = cls()
        assert isinstance(c, Controller) and c.interval_s > 0, name
        assert c.decide(view_of(wordcount())) is None, name  # no metrics: nothing to do
        with pytest.raises(ConfigError, match="unknown field"):
            cls({"no_such_field": 1})


def test_view_of_builds_replay_views() -> None:
    a = wordcount()
    v = View.of(a, now=5.0)
    assert v == view_of(a, now=5.0) and v.metrics.samples == 0
    recorded_metrics = recorded().metrics
    assert View.of(a, recorded_metrics, now=5.0).metrics.input_rate("count") == 60.0


def test_controllers_import_only_the_abstraction() -> None:
    """docs/design.md, section 9: controllers import only themselves, stdlib/numpy and the
    abstraction (which brings the runtime's pure dataflow module); not the server, the
    database or pydantic."""
    code = (
        "import sys, controllers; print(' '.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('controlplane', 'pydantic', 'fastapi', 'sqlalchemy'))))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    modules = out.stdout.split()
    assert modules and all(
        m == "controlplane" or m.startswith("controlplane.abstraction") for m in modules
    )
