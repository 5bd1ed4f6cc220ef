"""The connector contract suites (tests/connector_contract.py) on the reference
implementations: the partitioned generator and the Collect sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.sinks import Collect, read_parts
from runtime.sources import PartitionedGenerator
from tests.connector_contract import check_partitioned_source, check_two_phase_sink, drain


def test_the_partitioned_generator_keeps_the_source_contract() -> None:
    source = PartitionedGenerator(records=5000, keys=40, seed=9, partitions_count=3)
    expected = {}
    for p in source.partitions():
        reader = source.open_partition(p, 0.0)
        expected[p] = drain(reader, 10_000)
        reader.close()
    assert sum(len(r) for r in expected.values()) == 5000
    check_partitioned_source(source, expected)


def test_a_partition_it_does_not_have_is_refused() -> None:
    source = PartitionedGenerator(records=10, partitions_count=2)
    with pytest.raises(ValueError, match=r"no partition 'p7'"):
        source.open_partition("p7", 0.0)


def test_collect_keeps_the_two_phase_contract(tmp_path: Path) -> None:
    sink = Collect(str(tmp_path))
    check_two_phase_sink(lambda: sink.open(0, 1), lambda: read_parts(tmp_path))
