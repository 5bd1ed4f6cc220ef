"""Whether a savepoint fits a job's graph, and whether a manifest is one
(controlplane.coordinator.from_savepoint): pure functions over real graphs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest

from controlplane.coordinator.from_savepoint import incompatibility, parse_manifest
from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.sinks import Collect
from runtime.sources import Generator, PartitionedGenerator
from tests.e2e_jobs import count, key_of


def graph(
    sources: int = 2, counts: int = 2, keys: int = 128, sinks: int = 2, name: str = "count"
) -> Any:
    flow = Dataflow("fit")
    src = flow.source("keys", Generator(records=10, keys=5, seed=1), parallelism=sources)
    out = src.key_by(key_of).process(name, count, parallelism=counts, max_parallelism=keys)
    out.sink("out", Collect("/tmp/never-written"), parallelism=sinks)
    return flow.compile()


def manifest(sink_state: bool = True, **operators: tuple[str, int, int]) -> dict[str, Any]:
    ops = operators or {
        "keys": ("source", 2, 128),
        "count": ("keyed", 2, 128),
        "out": ("sink", 2, 128),
    }
    tasks: dict[str, Any] = {}
    for name, (kind, parallelism, _) in ops.items():
        for i in range(parallelism):
            sink = {"bytes": 10} if kind == "sink" and sink_state else None
            tasks[f"{name}-{i}"] = {"groups": {}, "position": None, "sink": sink}
    return {
        "job_id": "1",
        "checkpoint_id": 4,
        "tasks": tasks,
        "operators": {
            n: {"kind": k, "parallelism": p, "max_parallelism": m} for n, (k, p, m) in ops.items()
        },
    }


def test_the_same_graph_and_a_keyed_operator_at_another_parallelism_fit() -> None:
    assert incompatibility(manifest(), graph()) is None
    assert incompatibility(manifest(), graph(counts=5)) is None


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        (
            {"keys": 64},
            "keyed operator 'count' has 128 key groups (max_parallelism) in the savepoint and "
            "64 in the job: set max_parallelism=128",
        ),
        (
            {"sources": 1},
            "source 'keys' ran 2 task(s) at the savepoint and would run 1 in the job",
        ),
        ({"sinks": 3}, "sink 'out' ran 2 task(s) at the savepoint and would run 3"),
        ({"name": "tally"}, "keyed operator 'count' of the savepoint is not in the job"),
    ],
)
def test_what_does_not_fit_is_named(changed: dict[str, Any], said: str) -> None:
    why = incompatibility(manifest(), graph(**changed))
    assert why is not None and said in why


def test_a_sink_without_state_may_change_its_parallelism() -> None:
    assert incompatibility(manifest(sink_state=False), graph(sinks=3)) is None


def test_an_operator_the_savepoint_lacks_is_named() -> None:
    saved = manifest(keys=("source", 2, 128), out=("sink", 2, 128))
    why = incompatibility(saved, graph())
    assert why is not None and "keyed operator 'count' of the job is not in the savepoint" in why


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"job_id": "1", "checkpoint_id": 3, "tasks": {}}), "'operators'"),
        (
            msgpack.packb(
                {"job_id": "1", "checkpoint_id": 3, "operators": {}, "tasks": {"a-0": {}}}
            ),
            "task 'a-0' has no key groups map",
        ),
        (
            msgpack.packb(
                {
                    "job_id": "1",
                    "checkpoint_id": 3,
                    "operators": {},
                    "tasks": {"a-0": {"groups": {1: [["p", 0, 1]]}}},
                }
            ),
            "key group 1 is not a chain",
        ),
    ],
)
def test_a_manifest_that_is_not_one_says_what_is_wrong(data: bytes, said: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_manifest(data)
    assert said in str(info.value)


def test_a_real_manifest_parses() -> None:
    data = msgpack.packb(manifest(), use_bin_type=True)
    assert parse_manifest(data)["checkpoint_id"] == 4


def partitioned_graph(sources: int, partitions: int) -> Any:
    flow = Dataflow("fit")
    source = PartitionedGenerator(records=10, keys=5, seed=1, partitions_count=partitions)
    src = flow.source("keys", source, parallelism=sources)
    out = src.key_by(key_of).process("count", count, parallelism=2, max_parallelism=128)
    out.sink("out", Collect("/tmp/never-written"), parallelism=2)
    graph = flow.compile()
    listed = source.partitions()  # as a worker lists them when the job is submitted
    ops = [
        replace(op, partitions=tuple(listed)) if op.partitions == () else op
        for op in graph.operators
    ]
    return JobGraph(graph.name, tuple(ops))


def test_a_partitioned_source_may_change_parallelism_but_not_lose_a_partition() -> None:
    saved = manifest()
    saved["tasks"]["keys-0"]["position"] = {"p0": 1024, "p2": 0}
    saved["tasks"]["keys-1"]["position"] = {"p1": 2048, "p3": 0}
    assert incompatibility(saved, partitioned_graph(sources=3, partitions=4)) is None
    assert incompatibility(saved, partitioned_graph(sources=1, partitions=5)) is None
    said = incompatibility(saved, partitioned_graph(sources=2, partitions=3))
    assert said is not None and "read partition(s) p3 at the savepoint" in said


def test_a_partitioned_source_not_listed_yet_is_not_refused_before_it_is() -> None:
    saved = manifest()
    saved["tasks"]["keys-0"]["position"] = {"p0": 1024, "p9": 0}
    flow = Dataflow("fit")
    source = PartitionedGenerator(records=10, keys=5, seed=1, partitions_count=2)
    flow.source("keys", source, parallelism=2).key_by(key_of).process(
        "count", count, parallelism=2, max_parallelism=128
    ).sink("out", Collect("/tmp/never-written"), parallelism=2)
    assert incompatibility(saved, flow.compile()) is None  # () until submitted
