"""The contract suites every connector runs: one for a partitioned source, one for a
two-phase sink. A connector's test module calls them with its own source or sink (over
its real broker) and what it knows was produced; the reference implementations
(``PartitionedGenerator``, ``Collect``) run them in ``tests/test_connector_contract.py``.

The source suite (:func:`check_partitioned_source`): ``partitions()`` names the
partitions; each partition, read from its start, gives its records in order; a reader
seeked to a position taken after ``k`` records, in a fresh reader, gives exactly the
rest; positions are msgpack-able; a task's :class:`PartitionSetReader` over any split of
the partitions gives every record once, also when a partition moves between two sets
halfway.

The sink suite (:func:`check_two_phase_sink`): records written and prepared are not
visible until the commit of their checkpoint (when the sink is read-committed), a
commit is idempotent, and a recovery (a new writer restored from a checkpoint's state
after the old one aborted) leaves every record visible exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from runtime.io import PartitionedSource, SinkWriter
from runtime.partitioned import PartitionSetReader

__all__ = ["check_partitioned_source", "check_two_phase_sink", "drain"]

FAR = 1e12  # a poll time at which every record of a throttled source is due


def drain(reader: Any, limit: int, poll: Callable[[Any], Any] | None = None) -> list:
    """Up to ``limit`` records of ``reader`` (all of a bounded one). ``poll`` overrides
    how a batch is asked for (a broker reader may need a few empty polls before data)."""
    out: list = []
    empty = 0
    while len(out) < limit:
        polled = poll(reader) if poll is not None else reader.poll(FAR, min(512, limit - len(out)))
        if polled is None:
            break
        if not polled[0]:
            empty += 1
            if empty > 200:  # an unbounded source with nothing more to give
                break
            continue
        empty = 0
        out += polled[0]
    return out


def check_partitioned_source(
    source: PartitionedSource,
    expected: Mapping[str, Sequence[Any]],
    poll: Callable[[Any], Any] | None = None,
) -> None:
    """Assert the source contract (module docstring) for ``source``, whose partitions
    hold exactly ``expected`` (partition -> its records, in order)."""
    assert sorted(source.partitions()) == sorted(expected), source.partitions()
    for partition, records in expected.items():
        reader = source.open_partition(partition, 0.0)
        try:
            got = drain(reader, len(records), poll)
            assert got == list(records), f"partition {partition}: read {got[:5]}..."
        finally:
            reader.close()
        # A position taken after k records resumes at record k in a fresh reader.
        k = len(records) // 3
        first = source.open_partition(partition, 0.0)
        try:
            head = drain(first, k, poll)
            position = first.position()
        finally:
            first.close()
        assert head == list(records[:k])
        assert msgpack.unpackb(msgpack.packb(position), strict_map_key=False) == position
        second = source.open_partition(partition, 0.0)
        try:
            second.seek(position)
            assert drain(second, len(records) - k, poll) == list(records[k:])
        finally:
            second.close()
    # Two task sets; one partition moves from the first to the second halfway.
    names = sorted(expected)
    total = sum(len(r) for r in expected.values())
    a = PartitionSetReader(source, names[::2], 0.0)
    b = PartitionSetReader(source, names[1::2], 0.0)
    try:
        got = drain(a, total // 4, poll)
        moving = names[0]
        b.take(moving, a.give(moving))
        got += drain(a, total, poll) + drain(b, total, poll)
    finally:
        a.close()
        b.close()
    want = [r for records in expected.values() for r in records]
    assert sorted(map(repr, got)) == sorted(map(repr, want)), "a record lost or read twice"


def check_two_phase_sink(
    open_writer: Callable[[], SinkWriter],
    read_back: Callable[[], list],
    read_committed: bool = True,
) -> None:
    """Assert the two-phase contract for a sink task: ``open_writer()`` opens a fresh
    writer of the same task (index), ``read_back()`` returns what a reader sees now."""
    w = open_writer()
    w.transactional()
    w.write(["a", "b"])
    state1 = w.prepare(1)
    if read_committed:
        assert read_back() == [], "prepared records are visible before their commit"
    w.commit(1)
    assert sorted(read_back()) == ["a", "b"]
    w.commit(1)  # again
    assert sorted(read_back()) == ["a", "b"]
    w.write(["c"])
    state2 = w.prepare(2)  # checkpoint 2 completes, but its commit is lost with the worker
    w.write(["d"])
    w.prepare(3)  # checkpoint 3 never completes
    w.write(["e"])
    w.abort()
    assert state1 is not None and state2 is not None
    r = open_writer()
    r.transactional()
    r.restore(state2)
    assert sorted(read_back()) == ["a", "b", "c"], "restore commits what its checkpoint prepared"
    r.write(["d", "e"])  # the replay after checkpoint 2
    r.close()
    assert sorted(read_back()) == ["a", "b", "c", "d", "e"], "not exactly once"
