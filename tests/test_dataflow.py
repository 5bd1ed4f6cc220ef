"""The dataflow API: JobGraph.of refuses every invalid graph naming the operator; the
builder picks partitionings; load_job resolves references; graphs pickle."""

from __future__ import annotations

import functools
import pickle
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs_for_tests import (
    count,
    first,
    identity,
    is_long,
    make_closure,
    split_words,
)

from runtime.dataflow import (
    Dataflow,
    DataflowError,
    InputSpec,
    JobGraph,
    JobRefError,
    OperatorSpec,
    load_job,
    resolve_ref,
)
from runtime.params import ParamError
from runtime.sinks import Null
from runtime.sources import Generator

GEN = Generator(records=10, keys=2, seed=1)


def source(name: str = "src", parallelism: int = 1) -> OperatorSpec:
    return OperatorSpec(name, "source", GEN, parallelism)


def mapper(
    name: str = "m", *inputs: InputSpec, parallelism: int = 1, logic=identity
) -> OperatorSpec:
    return OperatorSpec(name, "map", logic, parallelism, inputs or (InputSpec("src"),))


def keyed(name: str = "count", parallelism: int = 1, **kw) -> OperatorSpec:
    inp = InputSpec("src", "key_groups", kw.pop("key", identity))
    return OperatorSpec(name, "keyed", count, parallelism, (inp,), **kw)


def refuse(operators: list[OperatorSpec], *fragments: str) -> str:
    with pytest.raises(DataflowError) as info:
        JobGraph.of("job", operators)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# ---------------------------------------------------------------- validation errors


def test_duplicate_operator_name() -> None:
    refuse([source(), mapper("m"), mapper("m")], "operator 'm' is defined twice")


@pytest.mark.parametrize("name", ["", "1st", "a-b", "a b", "_x", "ü", None, 7])
def test_bad_operator_name(name: object) -> None:
    refuse([source(), mapper(name)], f"operator name {name!r} is invalid")  # type: ignore[arg-type]


def test_operator_name_with_trailing_newline_is_refused() -> None:
    refuse([source(), mapper("m\n")], "is invalid")


def test_job_needs_a_name_and_operators() -> None:
    with pytest.raises(DataflowError, match="non-empty name"):
        JobGraph.of("", [source()])
    with pytest.raises(DataflowError, match="job 'job' has no operators"):
        JobGraph.of("job", [])


def test_unknown_kind() -> None:
    op = OperatorSpec("w", "window", identity, 1, (InputSpec("src"),))  # type: ignore[arg-type]
    refuse([source(), op], "operator 'w': unknown kind 'window'", "keyed")


@pytest.mark.parametrize("parallelism", [0, -1, True, False, 1.0, "2", None])
def test_bad_parallelism(parallelism: object) -> None:
    refuse(
        [source(), mapper("m", parallelism=parallelism)],  # type: ignore[arg-type]
        "operator 'm': parallelism must be an int >= 1",
        repr(parallelism),
    )


def test_bad_parallelism_of_a_source() -> None:
    refuse([source("src", 0)], "operator 'src': parallelism must be an int >= 1")


def test_keyed_parallelism_above_max_parallelism() -> None:
    refuse(
        [source(), keyed("count", parallelism=5, max_parallelism=4)],
        "operator 'count': parallelism 5 exceeds max_parallelism 4",
    )
    JobGraph.of("job", [source(), keyed("count", parallelism=4, max_parallelism=4)])


@pytest.mark.parametrize("max_parallelism", [0, -3, 2.5])
def test_keyed_bad_max_parallelism(max_parallelism: object) -> None:
    refuse(
        [source(), keyed("count", max_parallelism=max_parallelism)],
        "operator 'count': max_parallelism must be an int >= 1",
    )


def test_source_with_inputs() -> None:
    second = OperatorSpec("src2", "source", GEN, 1, (InputSpec("src"),))
    refuse([source(), second], "operator 'src2': a source has no inputs")


def test_operator_without_inputs() -> None:
    refuse([source(), OperatorSpec("m", "map", identity)], "operator 'm': has no inputs")
    refuse([source(), OperatorSpec("out", "sink", Null())], "operator 'out': has no inputs")


def test_source_logic_must_be_a_source() -> None:
    refuse([OperatorSpec("src", "source", identity)], "operator 'src': a source needs", "Source")


def test_sink_logic_must_be_a_sink() -> None:
    refuse(
        [source(), OperatorSpec("out", "sink", identity, 1, (InputSpec("src"),))],
        "operator 'out': a sink needs",
        "Sink",
    )


@pytest.mark.parametrize("kind", ["map", "flat_map", "filter"])
def test_logic_must_be_callable(kind: str) -> None:
    op = OperatorSpec("m", kind, 42, 1, (InputSpec("src"),))  # type: ignore[arg-type]
    refuse([source(), op], "operator 'm': logic 42 is not callable")


def test_keyed_logic_must_be_callable() -> None:
    op = OperatorSpec("count", "keyed", "count", 1, (InputSpec("src", "key_groups", identity),))
    refuse([source(), op], "operator 'count': logic 'count' is not callable")


def test_unknown_upstream() -> None:
    refuse([source(), mapper("m", InputSpec("nope"))], "operator 'm': unknown upstream 'nope'")


def test_unknown_partitioning() -> None:
    inp = InputSpec("src", "hash")  # type: ignore[arg-type]
    refuse([source(), mapper("m", inp)], "operator 'm': unknown partitioning 'hash'", "'src'")


def test_cycle() -> None:
    a = mapper("a", InputSpec("src"), InputSpec("b"))
    b = mapper("b", InputSpec("a"))
    refuse([source(), a, b], "operators 'a', 'b' form a cycle")


def test_self_loop() -> None:
    refuse([source(), mapper("a", InputSpec("src"), InputSpec("a"))], "operators 'a' form a cycle")


def test_cycle_message_names_only_the_cycle() -> None:
    a = mapper("a", InputSpec("src"), InputSpec("b"))
    b = mapper("b", InputSpec("a"))
    after = mapper("after", InputSpec("b"))
    message = refuse([source(), a, b, after], "'a'", "'b'", "form a cycle")
    assert "after" not in message


@pytest.mark.parametrize("partitioning", ["forward", "rebalance", "broadcast"])
def test_keyed_operator_without_key_by(partitioning: str) -> None:
    op = OperatorSpec("count", "keyed", count, 1, (InputSpec("src", partitioning),))  # type: ignore[arg-type]
    refuse(
        [source(), op],
        "operator 'count': a keyed operator needs its input 'src' partitioned by key",
        "key_by",
    )


def test_key_groups_into_a_non_keyed_operator() -> None:
    refuse(
        [source(), mapper("m", InputSpec("src", "key_groups", identity))],
        "operator 'm': input from 'src' is partitioned by key but the operator is not keyed",
    )


def test_key_groups_without_key_selector() -> None:
    refuse(
        [source(), keyed("count", key=None)],
        "operator 'count': input from 'src' has no key selector",
    )


def test_forward_with_unequal_parallelism() -> None:
    refuse(
        [source("src", 1), mapper("m", InputSpec("src", "forward"), parallelism=2)],
        "operator 'm': forward input from 'src' needs equal parallelism (1 vs 2)",
        "rebalance()",
    )


def test_lambda_logic_cannot_be_shipped() -> None:
    refuse(
        [source(), mapper("m", logic=lambda r: r)],
        "operator 'm': logic",
        "cannot be imported or pickled",
        "module level",
    )


def test_lambda_key_selector_cannot_be_shipped() -> None:
    refuse(
        [source(), keyed("count", key=lambda r: r)],
        "operator 'count': key selector",
        "cannot be imported or pickled",
        "module level",
    )


def test_nested_function_cannot_be_shipped() -> None:
    refuse(
        [source(), mapper("m", logic=make_closure())],
        "operator 'm': logic",
        "<locals>",
        "cannot be imported or pickled",
        "module level",
    )


def test_unpicklable_callable_gets_the_generic_hint() -> None:
    logic = functools.partial(identity, threading.Lock())
    refuse(
        [source(), mapper("m", logic=logic)],
        "operator 'm': logic",
        "cannot be imported or pickled",
        "make it importable or picklable",
    )


def test_builder_reports_lambdas_at_compile() -> None:
    flow = Dataflow("job")
    flow.source("src", GEN).map("m", lambda r: r).sink("out", Null())
    with pytest.raises(DataflowError, match=r"operator 'm'.*module level"):
        flow.compile()


# ---------------------------------------------------------------- topological order


def assert_topological(graph: JobGraph) -> None:
    position = {op.name: i for i, op in enumerate(graph.operators)}
    for op in graph.operators:
        for inp in op.inputs:
            assert position[inp.upstream] < position[op.name]


def test_operators_come_in_topological_order() -> None:
    ops = [
        mapper("c", InputSpec("b"), InputSpec("a")),
        OperatorSpec("out", "sink", Null(), 1, (InputSpec("c"),)),
        mapper("b", InputSpec("a")),
        mapper("a", InputSpec("src")),
        source(),
    ]
    graph = JobGraph.of("job", ops)
    assert [op.name for op in graph.operators] == ["src", "a", "b", "c", "out"]


@st.composite
def dags(draw: st.DrawFn) -> list[OperatorSpec]:
    """A random DAG: sources first, then maps reading from earlier operators, shuffled."""
    n_sources = draw(st.integers(1, 3))
    n_maps = draw(st.integers(0, 12))
    names = [f"s{i}" for i in range(n_sources)] + [f"m{i}" for i in range(n_maps)]
    ops = [source(n) for n in names[:n_sources]]
    for i in range(n_sources, len(names)):
        ups = draw(st.lists(st.sampled_from(names[:i]), min_size=1, max_size=3, unique=True))
        ops.append(mapper(names[i], *(InputSpec(u) for u in ups)))
    return draw(st.permutations(ops))


@settings(max_examples=60, deadline=None)
@given(dags())
def test_any_dag_is_ordered_topologically(ops: list[OperatorSpec]) -> None:
    graph = JobGraph.of("job", ops)
    assert sorted(op.name for op in graph.operators) == sorted(op.name for op in ops)
    assert_topological(graph)
    assert {op.name for op in graph.sources()} == {op.name for op in ops if op.kind == "source"}


# ---------------------------------------------------------------- builder


def test_builder_picks_forward_for_equal_parallelism_else_rebalance() -> None:
    flow = Dataflow("job")
    lines = flow.source("lines", GEN, parallelism=2)
    words = lines.flat_map("split", split_words)
    long = words.filter("long", is_long, parallelism=3)
    long.sink("out", Null(), parallelism=3)
    graph = flow.compile()
    split, lng, out = (graph.operator(n) for n in ("split", "long", "out"))
    assert (split.kind, split.parallelism, split.inputs) == ("flat_map", 2, (InputSpec("lines"),))
    assert lng.inputs == (InputSpec("split", "rebalance"),)
    assert (lng.kind, lng.parallelism) == ("filter", 3)
    assert out.inputs == (InputSpec("long", "forward"),)


def test_builder_explicit_rebalance_and_broadcast() -> None:
    flow = Dataflow("job")
    src = flow.source("src", GEN, parallelism=2)
    src.rebalance().map("spread", identity)
    src.broadcast().map("everywhere", identity, parallelism=4)
    graph = flow.compile()
    assert graph.operator("spread").inputs == (InputSpec("src", "rebalance"),)
    assert graph.operator("spread").parallelism == 2
    assert graph.operator("everywhere").inputs == (InputSpec("src", "broadcast"),)
    assert [op.name for op, _ in graph.downstream("src")] == ["spread", "everywhere"]


def test_builder_union_reads_all_streams() -> None:
    flow = Dataflow("job")
    a = flow.source("a", GEN, parallelism=1)
    b = flow.source("b", GEN, parallelism=3)
    merged = flow.union(a, b).map("merged", identity)
    merged.key_by(first).process("count", count, max_parallelism=16)
    graph = flow.compile()
    m = graph.operator("merged")
    assert m.parallelism == 3  # the largest upstream parallelism
    assert m.inputs == (InputSpec("a", "rebalance"), InputSpec("b", "forward"))
    c = graph.operator("count")
    assert c.kind == "keyed" and c.keyed
    assert (c.parallelism, c.max_parallelism) == (3, 16)
    assert c.inputs == (InputSpec("merged", "key_groups", first),)
    assert graph.task_ids() == [
        "a-0",
        "b-0",
        "b-1",
        "b-2",
        "merged-0",
        "merged-1",
        "merged-2",
        "count-0",
        "count-1",
        "count-2",
    ]


def test_key_by_overrides_rebalance() -> None:
    flow = Dataflow("job")
    flow.source("src", GEN).rebalance().key_by(identity).process("count", count, parallelism=2)
    assert flow.compile().operator("count").inputs == (InputSpec("src", "key_groups", identity),)


def test_unknown_operator_lookup_names_job_and_operator() -> None:
    flow = Dataflow("job")
    flow.source("src", GEN)
    with pytest.raises(KeyError, match="job 'job' has no operator 'nope'"):
        flow.compile().operator("nope")


# ---------------------------------------------------------------- load_job


def test_load_job_builds_and_compiles_with_string_params() -> None:
    graph = load_job("jobs_for_tests:build_counts", {"records": "1_000", "parallelism": "3"})
    assert graph.name == "counts"
    assert [op.name for op in graph.operators] == ["keys", "count", "out"]
    assert graph.operator("count").parallelism == 3
    assert graph.operator("keys").logic == Generator(records=1000, keys=10, seed=1)


def test_load_job_accepts_a_compiled_graph() -> None:
    assert load_job("jobs_for_tests:build_compiled") == load_job("jobs_for_tests:build_counts")


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("jobs_for_tests.build_counts", "must look like package.module:callable"),
        ("jobs_for_tests:build:counts", "must look like package.module:callable"),
        (42, "must look like package.module:callable"),
        ("no_such_module_sp:build", "cannot import module 'no_such_module_sp'"),
        ("jobs_for_tests:missing", "module 'jobs_for_tests' has no 'missing'"),
        ("jobs_for_tests:CountParams.missing", "has no 'CountParams.missing'"),
        ("jobs_for_tests:NOT_CALLABLE", "is not callable"),
        ("jobs_for_tests:build_nothing", "returned int, expected a Dataflow"),
    ],
)
def test_load_job_errors(ref: object, fragment: str) -> None:
    with pytest.raises(JobRefError) as info:
        load_job(ref)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert repr(ref) in str(info.value)


@pytest.mark.parametrize("ref", [":build_counts", ".jobs_for_tests:build_counts"])
def test_load_job_malformed_module_is_a_job_ref_error(ref: str) -> None:
    with pytest.raises(JobRefError):
        resolve_ref(ref)


def test_load_job_passes_graph_and_param_errors_through() -> None:
    with pytest.raises(DataflowError, match="operator 'oops': logic 42 is not callable"):
        load_job("jobs_for_tests:build_invalid")
    with pytest.raises(ParamError, match="unknown param"):
        load_job("jobs_for_tests:build_counts", {"nope": 1})


def test_resolve_ref_follows_attribute_paths() -> None:
    from jobs_for_tests import CountParams

    assert resolve_ref("jobs_for_tests:CountParams") is CountParams
    assert resolve_ref("jobs_for_tests:Trade._make")(["X", 1.5]) == ("X", 1.5)


# ---------------------------------------------------------------- pickling


def test_job_graph_pickles_equal_in_structure() -> None:
    graph = load_job("jobs_for_tests:build_counts", {"parallelism": 2})
    copy = pickle.loads(pickle.dumps(graph))
    assert copy == graph
    assert copy is not graph
    assert [op.name for op in copy.operators] == ["keys", "count", "out"]
    assert copy.operator("count") == graph.operator("count")
    assert copy.operator("count").inputs[0].key is identity
    assert copy.downstream("keys") == graph.downstream("keys")
    assert copy.task_ids() == graph.task_ids()
