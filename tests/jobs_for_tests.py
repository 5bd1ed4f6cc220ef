"""Module-level logic for the unit tests: UDFs, jobs, parameter classes and state values.

Everything here must stay at module level: the dataflow validator pickles logic, keyed
state pickles values it does not know, and ``load_job`` imports jobs by reference
(``jobs_for_tests:build_counts``).
"""

from __future__ import annotations

import os
from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any

from runtime import Dataflow
from runtime.params import parse_params
from runtime.sinks import Null
from runtime.sources import Generator, PartitionedGenerator

# A lone surrogate and other awkward keys: every type key groups claim to support.
MIXED_KEYS: list[Any] = [
    "",
    "word",
    "naïve",
    "日本語",
    "\U0001f600",
    "\udc80",
    b"",
    b"word",
    b"\xff\x00",
    0,
    1,
    -1,
    -(2**63),
    2**64,
    10**40,
    -(10**40),
    0.0,
    1.5,
    -2.25,
    float("inf"),
    1e300,
    True,
    False,
    None,
    (),
    ("a", 1),
    ("a", (b"b", (None, 2.5, True))),
    (("nested",), ("tuple",), -7),
]


def identity(record: Any) -> Any:
    return record


def first(record: Any) -> Any:
    return record[0]


def split_words(line: str) -> list[str]:
    return line.split()


def is_long(word: str) -> bool:
    return len(word) > 3


def count(key: Any, value: Any, state: Any) -> tuple:
    n = state.get(0) + 1
    state.set(n)
    return ((key, n),)


def running_counts(name: str, source: Any, out: str, parallelism: int = 2) -> Any:
    """The graph ``source`` -> key by the record -> :func:`count` -> ``Collect(out)``,
    each at ``parallelism``: every (key, running count) once."""
    from runtime.sinks import Collect

    flow = Dataflow(name)
    src = flow.source("src", source, parallelism=parallelism)
    counts = src.key_by(identity).process("count", count, parallelism=parallelism)
    counts.sink("out", Collect(out), parallelism=parallelism)
    return flow.compile()


def counts_reference(readers: Any) -> list[tuple[Any, int]]:
    """What :func:`running_counts` writes, in no order, for the records of ``readers``
    (each read to its end in process)."""
    from collections import Counter

    seen: Counter = Counter()
    for reader in readers:
        while (polled := reader.poll(1e12, 4096)) is not None:
            seen.update(polled[0])
        reader.close()
    return sorted((k, n) for k, c in seen.items() for n in range(1, c + 1))


def make_closure() -> Any:
    """A nested function: callable, but neither importable nor picklable."""

    def nested(record: Any) -> Any:
        return record

    return nested


NOT_CALLABLE = 42


@dataclass(frozen=True)
class CountParams:
    records: int = 1000
    keys: int = 10
    parallelism: int = 2


def build_counts(params: dict[str, Any]) -> Dataflow:
    """Generator -> keyed count -> Null; parameters through :func:`parse_params`."""
    p = parse_params(CountParams, params)
    flow = Dataflow("counts")
    src = flow.source("keys", Generator(records=p.records, keys=p.keys, seed=1), parallelism=1)
    counts = src.key_by(identity).process("count", count, parallelism=p.parallelism)
    counts.sink("out", Null())
    return flow


def build_compiled(params: dict[str, Any]) -> Any:
    """Returns an already compiled JobGraph (also accepted by ``load_job``)."""
    return build_counts(params).compile()


def build_nothing(params: dict[str, Any]) -> int:
    return 7


def build_invalid(params: dict[str, Any]) -> Dataflow:
    """A job whose graph does not validate: its map logic is not callable."""
    flow = Dataflow("invalid")
    flow.source("keys", Generator(records=10, keys=2, seed=1)).map("oops", NOT_CALLABLE)
    return flow


@dataclass(frozen=True)
class AllTypes:
    """Parameters of every supported type, with defaults so that any subset parses."""

    count: int = 1
    ratio: float = 0.5
    verbose: bool = False
    name: str = "job"
    limit: int | None = None
    label: str | None = "x"


@dataclass(frozen=True)
class Required:
    rate: int


@dataclass(frozen=True)
class Positive:
    workers: int = 1

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


@dataclass(frozen=True)
class Point:
    x: float
    y: float


@dataclass
class Account:
    owner: str
    balance: int = 0
    history: list[int] = field(default_factory=list)


Trade = namedtuple("Trade", "symbol price")


@dataclass(frozen=True, kw_only=True)
class GrowingSource(PartitionedGenerator):
    """A partitioned generator whose partitions exist once the file ``listing`` counts
    them (``p0``...``p<n-1>``; at most ``partitions_count``): a test adds partitions to
    a running job by writing a larger count."""

    listing: str = ""
    discovery_interval_s: float | None = 0.1

    def partitions(self) -> list[str]:
        with open(self.listing, encoding="utf-8") as f:
            count = int(f.read())
        return [f"p{i}" for i in range(min(count, self.partitions_count))]


def build_growing(params: dict[str, Any]) -> Dataflow:
    """A :class:`GrowingSource` (params ``listing``, ``partitions``) -> keyed count ->
    Null, unbounded: for tests that add a partition while the job runs."""
    source = GrowingSource(
        records=None, rate=500, keys=50, seed=4, listing=str(params["listing"]),
        partitions_count=int(params.get("partitions", 4)),
    )  # fmt: skip
    flow = Dataflow("growing")
    src = flow.source("src", source, parallelism=2)
    src.key_by(identity).process("count", count, parallelism=2).sink("out", Null())
    return flow


def build_from_redis(params: dict[str, Any]) -> Dataflow:
    """Redis streams (param ``url``) -> Null: for tests of a source's broker at submit."""
    from connectors.redis import RedisStreamSource

    flow = Dataflow("from_redis")
    flow.source("src", RedisStreamSource(url=str(params["url"]), streams=("in",))).sink(
        "out", Null()
    )
    return flow


@dataclass(frozen=True, kw_only=True)
class GatedSource(PartitionedGenerator):
    """A partitioned generator whose partition ``p1`` cannot be read while the file
    ``gate`` exists: its reader says it is stalled and returns nothing, as a reader whose
    broker is gone does."""

    gate: str = ""
    stall_timeout_s: float | None = None

    def open_partition(self, partition: str, start_time: float) -> Any:
        reader = super().open_partition(partition, start_time)
        return _Gated(reader, self.gate) if partition == "p1" else reader


class _Gated:
    def __init__(self, reader: Any, gate: str) -> None:
        self._reader, self._gate = reader, gate
        self.stalled: str | None = None

    def poll(self, now: float, max_records: int) -> Any:
        if os.path.exists(self._gate):
            self.stalled = f"cannot reach the broker while {self._gate} exists (retrying)"
            return [], []
        self.stalled = None
        return self._reader.poll(now, max_records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def build_gated(params: dict[str, Any]) -> Dataflow:
    """A :class:`GatedSource` (param ``gate``) -> keyed count -> Null, unbounded."""
    source = GatedSource(records=None, rate=500, keys=20, seed=2, partitions_count=2,
                         gate=str(params["gate"]))  # fmt: skip
    flow = Dataflow("gated")
    src = flow.source("src", source, parallelism=2)
    src.key_by(identity).process("count", count, parallelism=2).sink("out", Null())
    return flow


def growing_submission(listing: Any, count: int, partitions: int) -> dict[str, Any]:
    """The REST body of a :func:`build_growing` job whose source lists ``count`` of its
    ``partitions`` partitions now (written to ``listing``); no checkpoints."""
    listing.write_text(str(count))
    return {
        "name": "growing",
        "job": "tests.jobs_for_tests:build_growing",
        "params": {"listing": str(listing), "partitions": partitions},
        "checkpoints": {"interval_s": None},
    }
