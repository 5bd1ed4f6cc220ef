"""Jobs used by the end-to-end tests (module level, so workers can import them)."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.dataflow import JobGraph
from runtime.io import PartitionedSource, Source, SourceReader
from runtime.sinks import Collect, Null
from runtime.sources import Generator


def counting_reference(records: int) -> dict[str, int]:
    """What ``counting_job`` counts for ``records`` records, computed in this process."""
    reader = Generator(records=records, keys=100, zipf=1.0, seed=3).open(0, 1, 0.0)
    counts: dict[str, int] = {}
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        for key in polled[0]:
            counts[key] = counts.get(key, 0) + 1
    return counts


def final_counts(path: Any) -> dict[str, int]:
    """The latest count per key in a ``Collect`` output (the highest wins)."""
    from runtime.sinks import read_parts

    out: dict[str, int] = {}
    for key, n, *_ in read_parts(path):
        out[key] = max(n, out.get(key, 0))
    return out


def key_of(record: str) -> str:
    return record


def fail_on_poison(key: str, value: str, state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    if n == 50 and key == "k00007":
        raise ValueError(f"poisoned count for {key}")
    return ((key, n),)


def count(key: str, value: Any, state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    return ((key, n),)


def first(record: Any) -> Any:
    return record[0]


def failing_job(params: dict[str, Any]) -> Dataflow:
    """Fails when key k00007 reaches its 50th record."""
    flow = Dataflow("failing")
    src = flow.source("keys", Generator(records=20_000, keys=10, seed=1), parallelism=2)
    src.key_by(key_of).process("count", fail_on_poison).sink("out", Null())
    return flow


def counting_job(params: dict[str, Any]) -> Dataflow:
    """Counts keys; unbounded unless params["records"]; rate params["rate"] (0 = fast)."""
    records = int(params.get("records", 0)) or None
    flow = Dataflow("counting")
    src = flow.source(
        "keys",
        Generator(records=records, rate=float(params.get("rate", 0)), keys=100, zipf=1.0, seed=3),
        parallelism=int(params.get("sources", 2)),
    )
    counts = src.key_by(key_of).process(
        "count", count, parallelism=int(params.get("parallelism", 2))
    )
    output = params.get("output")
    counts.sink("out", Collect(output, mode="last", key=first) if output else Null())
    return flow


@dataclass(frozen=True)
class SlowStart(Generator):
    """A generator whose records are ints (exercises non-string keys)."""

    def make_records(self, rng, keys, start_index):
        return [start_index + i for i in range(len(keys))]


@dataclass(frozen=True)
class BrokenSink(Null):
    """A sink that cannot open (a full disk, say)."""

    def open(self, index: int, parallelism: int):
        raise OSError("disk full")


@dataclass(frozen=True)
class PlainSink(Null):
    """A sink that does not commit with checkpoints (at-least-once through failures)."""

    exactly_once = False


def two_sinks_job(params: dict[str, Any]) -> Dataflow:
    """One source to two sinks: one that commits with checkpoints, one that does not."""
    flow = Dataflow("two_sinks")
    keys = flow.source("keys", Generator(records=100, seed=1))
    keys.sink("committed", Null())
    keys.sink("plain", PlainSink())
    return flow


def broken_sink_job(params: dict[str, Any]) -> Dataflow:
    flow = Dataflow("broken")
    flow.source("keys", Generator(records=100, seed=1)).sink("out", BrokenSink())
    return flow


@dataclass(frozen=True)
class HoldWhile:
    """A map that passes records through, 5 ms each while ``path`` exists (a busy task).

    Slow per record rather than stuck, so the worker still answers between batches.
    """

    path: str

    def __call__(self, record: Any) -> Any:
        import os
        import time

        if os.path.exists(self.path):
            time.sleep(0.005)
        return record


def reference_keys(flow: Dataflow, params: dict[str, Any], parallelism: int) -> Any:
    """The "keys" source whose counts :func:`counting_reference` computes: params["records"]
    keys at params["rate"] per second."""
    source = Generator(
        records=int(params["records"]), rate=float(params["rate"]), keys=100, zipf=1.0, seed=3
    )
    return flow.source("keys", source, parallelism=parallelism)


def held_job(params: dict[str, Any]) -> Dataflow:
    """keys -> hold (map, stalls while params["hold"] exists; params["hold_tasks"], default
    2) -> count -> out."""
    flow = Dataflow("held")
    src = reference_keys(flow, params, parallelism=2)
    tasks = int(params.get("hold_tasks", 2))
    hold = HoldWhile(params["hold"])
    held = (
        src.map("hold", hold)
        if tasks == 2
        else src.rebalance().map("hold", hold, parallelism=tasks)
    )
    counts = held.key_by(key_of).process("count", count, parallelism=2)
    counts.sink("out", Collect(params["output"], mode="last", key=first))
    return flow


def tag(record: str) -> str:
    return record


def enriched_job(params: dict[str, Any]) -> Dataflow:
    """keys -(rebalance)-> enrich (stateless, 2 tasks) -(key_by)-> count -> out."""
    flow = Dataflow("enriched")
    src = flow.source(
        "keys",
        Generator(
            records=int(params["records"]), rate=float(params["rate"]), keys=100, zipf=1.0, seed=3
        ),
        parallelism=1,
    )
    enriched = src.rebalance().map("enrich", tag, parallelism=2)
    counts = enriched.key_by(key_of).process("count", count, parallelism=2)
    counts.sink("out", Collect(params["output"], mode="last", key=first))
    return flow


def count_tagged(key: str, value: Any, state: Any) -> tuple:
    """``count`` that marks its outputs, to see which tasks run it after a logic swap."""
    n = state.get(0) + 1
    state.set(n)
    return ((key, n, "v2"),)


_numbers = iter(range(1 << 62))  # per worker process: the one "number" task is monotonic


def number(record: str) -> tuple[str, int]:
    return record, next(_numbers)


@dataclass(frozen=True)
class CountInOrder:
    """Counts keys, failing on a record numbered lower than one already counted for its key
    (a record processed out of order); each key also keeps ``pad`` bytes of state, so that
    moving a key group takes a while."""

    pad: int = 0

    def __call__(self, key: str, value: tuple[str, int], state: Any) -> tuple:
        n, last, pad = state.get((0, -1, None))
        if value[1] <= last:
            raise ValueError(f"record {value[1]} of {key!r} came after record {last}")
        state.set((n + 1, value[1], pad if pad is not None else bytes(self.pad)))
        return ((key, n + 1),)


def ordered_job(params: dict[str, Any]) -> Dataflow:
    """keys (one source) -> number (one task) -> count (2 tasks, :class:`CountInOrder`) ->
    out: fails if any key's records reach the count out of their order."""
    flow = Dataflow("ordered")
    src = reference_keys(flow, params, parallelism=1)
    numbered = src.map("number", number, parallelism=1)
    counts = numbered.key_by(first).process(
        "count", CountInOrder(int(params.get("pad", 0))), parallelism=2
    )
    counts.sink("out", Collect(params["output"], mode="last", key=first))
    return flow


HELD_END_RECHECK_S = 0.05  # how often a held-back end looks at its file again


@dataclass(frozen=True)
class EndsWhenReleased(Source):
    """``source``'s records, as it emits them, with its end held back while the file
    ``held`` exists: a bounded job that stays running whatever the machine's speed, until
    the test removes the file; its output is then that of ``source`` alone.

    ``hurry``: once the file is gone, the rest of ``source`` comes as fast as the job takes
    it (polled as at the end of time), not at its pace: what a test does while records
    flow happens before it releases the end, and the records after are the same. Only for
    sources whose record times do not come from the clock (a :class:`Generator`'s come
    from its rate curve)."""

    source: Source
    held: str
    hurry: bool = False

    def open(self, index: int, parallelism: int, start_time: float) -> SourceReader:
        reader = self.source.open(index, parallelism, start_time)
        return _EndsWhenReleasedReader(reader, self.held, self.hurry)


class _EndsWhenReleasedReader(SourceReader):
    def __init__(self, reader: SourceReader, held: str, hurry: bool = False) -> None:
        self._reader = reader
        self._held = held
        self._spent = False  # the inner reader is exhausted; only the file keeps it open
        self._hurry = hurry
        self._released = False  # with hurry: the file was gone at a poll (it stays gone)

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._hurry and not self._released:
            self._released = not os.path.exists(self._held)
        polled = self._reader.poll(math.inf if self._released else now, max_records)
        self._spent = polled is None
        if polled is None and os.path.exists(self._held):
            return [], []
        return polled

    def next_due(self, now: float) -> float:
        if self._spent:
            return now + HELD_END_RECHECK_S
        if self._released:
            return now
        return self._reader.next_due(now)

    def position(self) -> Any:
        return self._reader.position()

    def seek(self, position: Any) -> None:
        self._reader.seek(position)
        self._spent = False

    def close(self) -> None:
        self._reader.close()


@dataclass(frozen=True)
class PartitionsEndWhenReleased(PartitionedSource):
    """:class:`EndsWhenReleased` for a partitioned ``source``: each of its partitions holds
    back its end while the file ``held`` exists."""

    source: PartitionedSource
    held: str

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.source.bounded

    def partitions(self) -> list[str]:
        return self.source.partitions()

    def open_partition(self, partition: str, start_time: float) -> SourceReader:
        reader = self.source.open_partition(partition, start_time)
        return _EndsWhenReleasedReader(reader, self.held)


def held_until_released(graph: JobGraph, held: Any, hurry: bool = False) -> JobGraph:
    """``graph`` with each source's end held back while the file ``held`` exists (see
    :class:`EndsWhenReleased`, :class:`PartitionsEndWhenReleased`); ``hurry``: its
    unpartitioned sources unpaced once released (see :class:`EndsWhenReleased`)."""

    def hold(source: Source) -> Source:
        if isinstance(source, PartitionedSource):
            return PartitionsEndWhenReleased(source, str(held))
        return EndsWhenReleased(source, str(held), hurry)

    return JobGraph.of(
        graph.name,
        [
            dataclasses.replace(op, logic=hold(op.logic)) if op.kind == "source" else op
            for op in graph.operators
        ],
    )


def held_wordcount(params: dict[str, Any]) -> JobGraph:
    """``examples.wordcount:build`` with the other params, its end held back while the file
    params["held"] exists (see :class:`EndsWhenReleased`)."""
    from examples import wordcount

    rest = {k: v for k, v in params.items() if k != "held"}
    return held_until_released(wordcount.build(rest).compile(), params["held"])
