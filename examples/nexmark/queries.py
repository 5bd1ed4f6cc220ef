"""The Nexmark queries as streampilot jobs: ``examples.nexmark.queries:q0`` (q1, q2).

Each job is ``events`` (a :class:`~examples.nexmark.source.Nexmark` source) -> the
query (one ``flat_map``) -> a sink. Parameters (all optional; ``streampilot run
examples.nexmark.queries:q1 --param events=100000``):

- ``events`` (int, 100000): events to generate; 0 = unbounded.
- ``rate`` (float, 0): events per second over all partitions; 0 = as fast as possible.
- ``seed`` (int, 42): the stream's seed.
- ``partitions`` (int, 4): partitions of the source (what a plan moves between tasks).
- ``parallelism`` (int, 2): tasks per operator.
- ``out_of_order_group_size`` (int, 1): the standard's out-of-order groups (1: in order).
- ``shuffle`` (bool, false): rebalance the events between the source and the query
  (records cross workers; the query can then be scaled live without the source).
- ``output`` (str, ""): directory for the rows (``part-N.jsonl``); empty = discard.

The rows are those of :mod:`examples.nexmark.reference` for the same events: ``sorted(
tuple(r) for r in read_parts(output)) == reference(params)``, whatever the parallelism, the
partitioning or the moves. The windowed queries (q5, q7, q8, q11) and the joins (q3,
q4, q8) need event time, watermarks and windows in the runtime; :data:`JOBS` is the
table benchmarks and tests read, to which they will be added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.io import Sink
from runtime.params import parse_params
from runtime.sinks import Collect, Null

from . import reference as ref
from .generator import OUT_OF_ORDER_STRIDE
from .model import Bid, Event
from .source import Nexmark

__all__ = ["JOBS", "Params", "build", "q0", "q1", "q2", "reference", "source_of"]


@dataclass(frozen=True)
class Params:
    events: int = 100_000
    rate: float = 0.0
    seed: int = 42
    partitions: int = 4
    parallelism: int = 2
    out_of_order_group_size: int = 1
    shuffle: bool = False
    output: str = ""

    def __post_init__(self) -> None:
        if self.events < 0:
            raise ValueError(f"param 'events' must be >= 0 (0 = unbounded), got {self.events}")
        if self.rate < 0:
            raise ValueError(
                f"param 'rate' must be >= 0 (events/s; 0 = as fast as possible), got {self.rate}"
            )
        for name in ("partitions", "parallelism", "out_of_order_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"param {name!r} must be >= 1, got {getattr(self, name)}")
        if self.out_of_order_group_size % OUT_OF_ORDER_STRIDE == 0:
            raise ValueError(
                f"param 'out_of_order_group_size' must not be a multiple of "
                f"{OUT_OF_ORDER_STRIDE}, got {self.out_of_order_group_size}"
            )
        if not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"param 'seed' must be a 64-bit int, got {self.seed}")


def source_of(p: Params) -> Nexmark:
    return Nexmark(
        events=p.events or None,
        rate=p.rate or None,
        seed=p.seed,
        partitions_count=p.partitions,
        out_of_order_group_size=p.out_of_order_group_size,
    )


# -- the queries' logic: one record in, its rows out ---------------------------------------


def pass_through(event: Event) -> tuple:
    if type(event) is not Bid:
        return ()
    return ((event.auction, event.bidder, event.price, event.date_time, event.extra),)


def currency_conversion(event: Event) -> tuple:
    if type(event) is not Bid:
        return ()
    euros = event.price * ref.DOLLARS_TO_EUROS
    return ((event.auction, event.bidder, euros, event.date_time, event.extra),)


def selection(event: Event) -> tuple:
    if type(event) is not Bid or event.auction % ref.Q2_MODULUS:
        return ()
    return ((event.auction, event.price),)


LOGIC: dict[str, Callable[[Event], tuple]] = {
    "q0": pass_through,
    "q1": currency_conversion,
    "q2": selection,
}


def build(query: str, source: Nexmark, parallelism: int, sink: Sink, shuffle: bool = False):
    """The job of ``query`` (a key of :data:`LOGIC`) over ``source``: operators
    ``events`` -> ``query`` -> ``sink``, each with ``parallelism`` tasks."""
    if query not in LOGIC:
        raise ValueError(f"no streampilot job for query {query!r}; have {sorted(LOGIC)}")
    flow = Dataflow(f"nexmark-{query}")
    events = flow.source("events", source, parallelism=parallelism)
    if shuffle:
        events = events.rebalance()
    rows = events.flat_map(query, LOGIC[query], parallelism=parallelism)
    rows.sink("sink", sink, parallelism=parallelism)
    return flow


def _job(query: str, params: dict[str, Any] | None) -> Dataflow:
    p = parse_params(Params, params)
    sink = Collect(p.output) if p.output else Null()
    return build(query, source_of(p), p.parallelism, sink, p.shuffle)


def q0(params: dict[str, Any] | None = None) -> Dataflow:
    """Pass-through: every bid's ``(auction, bidder, price, date_time, extra)``."""
    return _job("q0", params)


def q1(params: dict[str, Any] | None = None) -> Dataflow:
    """Currency conversion: q0 with prices in euros."""
    return _job("q1", params)


def q2(params: dict[str, Any] | None = None) -> Dataflow:
    """Selection: ``(auction, price)`` of the bids on every 123rd auction."""
    return _job("q2", params)


JOBS: dict[str, Callable[[dict[str, Any] | None], Dataflow]] = {"q0": q0, "q1": q1, "q2": q2}
"""The queries that run as streampilot jobs, by name (benchmarks and tests read it)."""


def reference(query: str, params: dict[str, Any] | None = None) -> list[tuple]:
    """``query``'s rows computed in this process for the events of ``params`` (bounded)."""
    p = parse_params(Params, params)
    if not p.events:
        raise ValueError("reference() needs a bounded run (events > 0)")
    if query not in ref.REFERENCES:
        raise ValueError(f"no reference for query {query!r}; have {sorted(ref.REFERENCES)}")
    source = source_of(p)
    return ref.REFERENCES[query](source.event_at(k) for k in range(p.events))
