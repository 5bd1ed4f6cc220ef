"""The Nexmark queries as streampilot jobs: ``examples.nexmark.queries:q0`` (q1, q2, q3,
q4, q5, q7, q8, q11).

q0, q1, q2 are ``events`` (a :class:`~examples.nexmark.source.Nexmark` source) -> the
query (one ``flat_map``) -> a sink. The others run on event time, with windows, joins and
timers: see :mod:`examples.nexmark.windowed` for their operators. Parameters (all
optional; ``streampilot run examples.nexmark.queries:q1 --param events=100000``):

- ``events`` (int, 100000): events to generate; 0 = unbounded.
- ``rate`` (float, 0): events per second over all partitions; 0 = as fast as possible.
- ``seed`` (int, 42): the stream's seed.
- ``partitions`` (int, 4): partitions of the source (what a plan moves between tasks).
- ``parallelism`` (int, 2): tasks per operator.
- ``out_of_order_group_size`` (int, 1): the standard's out-of-order groups (1: in order);
  the event-time jobs' watermarks trail by the bound they give.
- ``event_rate`` (int, 10000): events per second of event time (the standard's
  ``firstEventRate``), whatever the pacing: it sets how many events a window holds.
- ``time_from_start`` (bool, false): event 0 happens at the job's start instead of a
  fixed time (:class:`~examples.nexmark.clock.StartedNexmark`): with ``event_rate`` equal
  to ``rate``, event time follows the wall clock (latency benchmarks).
- ``shuffle`` (bool, false): rebalance the events between the source and the query
  (records cross workers; the query can then be scaled live without the source).
- ``two_phase`` (bool, false): q5 counts bids per auction with a two-phase windowed
  aggregation (``window_aggregate``): the same rows, and a hot auction can be split.
- ``output`` (str, ""): directory for the rows (``part-N.jsonl``); empty = discard.

The rows are those of :mod:`examples.nexmark.reference` for the same events:
``output_rows(query, output) == reference(query, params)``, whatever the parallelism, the
partitioning or the moves (q4's job writes a running average per category, of which
:func:`output_rows` keeps the last). :data:`JOBS` is the table benchmarks and tests read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.io import Sink
from runtime.params import parse_params
from runtime.sinks import Collect, Null, read_parts

from . import reference as ref
from . import windowed
from .clock import StartedNexmark
from .generator import OUT_OF_ORDER_STRIDE
from .model import Bid, Event
from .source import Nexmark

__all__ = [
    "JOBS",
    "Params",
    "build",
    "output_rows",
    "q0",
    "q1",
    "q2",
    "q3",
    "q4",
    "q5",
    "q7",
    "q8",
    "q11",
    "reference",
    "source_of",
]


@dataclass(frozen=True)
class Params:
    events: int = 100_000
    rate: float = 0.0
    seed: int = 42
    partitions: int = 4
    parallelism: int = 2
    out_of_order_group_size: int = 1
    event_rate: int = 10_000
    time_from_start: bool = False
    shuffle: bool = False
    two_phase: bool = False  # q5: bids per auction by window_aggregate (hot auctions split)
    output: str = ""

    def __post_init__(self) -> None:
        if self.events < 0:
            raise ValueError(f"param 'events' must be >= 0 (0 = unbounded), got {self.events}")
        if self.rate < 0:
            raise ValueError(
                f"param 'rate' must be >= 0 (events/s; 0 = as fast as possible), got {self.rate}"
            )
        for name in ("partitions", "parallelism", "out_of_order_group_size", "event_rate"):
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
    return (StartedNexmark if p.time_from_start else Nexmark)(
        events=p.events or None,
        rate=p.rate or None,
        seed=p.seed,
        partitions_count=p.partitions,
        out_of_order_group_size=p.out_of_order_group_size,
        event_rate=p.event_rate,
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


def build(
    query: str,
    source: Nexmark,
    parallelism: int,
    sink: Sink,
    shuffle: bool = False,
    two_phase: bool = False,
):
    """The job of ``query`` over ``source``, each operator with ``parallelism`` tasks: for
    a key of :data:`LOGIC`, ``events`` -> ``query`` -> ``sink``; for an event-time query,
    :func:`examples.nexmark.windowed.build` (``shuffle`` does not apply: its records
    cross workers on its keyed edges; ``two_phase`` only applies there)."""
    if query in windowed.BUILDERS:
        return windowed.build(query, source, parallelism, sink, two_phase)
    if two_phase:
        raise ValueError(f"param 'two_phase' applies to {', '.join(windowed.TWO_PHASE)}")
    if query not in LOGIC:
        have = sorted([*LOGIC, *windowed.BUILDERS])
        raise ValueError(f"no streampilot job for query {query!r}; have {have}")
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
    return build(query, source_of(p), p.parallelism, sink, p.shuffle, p.two_phase)


def q0(params: dict[str, Any] | None = None) -> Dataflow:
    """Pass-through: every bid's ``(auction, bidder, price, date_time, extra)``."""
    return _job("q0", params)


def q1(params: dict[str, Any] | None = None) -> Dataflow:
    """Currency conversion: q0 with prices in euros."""
    return _job("q1", params)


def q2(params: dict[str, Any] | None = None) -> Dataflow:
    """Selection: ``(auction, price)`` of the bids on every 123rd auction."""
    return _job("q2", params)


def q3(params: dict[str, Any] | None = None) -> Dataflow:
    """Local item suggestion: ``(name, city, state, auction)`` of the category-10
    auctions of sellers in OR, ID or CA (an incremental join)."""
    return _job("q3", params)


def q4(params: dict[str, Any] | None = None) -> Dataflow:
    """Average closing price per category, as a running ``(category, mean, auctions)``."""
    return _job("q4", params)


def q5(params: dict[str, Any] | None = None) -> Dataflow:
    """Hot items: per sliding window (10 s every 2 s), the auctions with the most bids."""
    return _job("q5", params)


def q7(params: dict[str, Any] | None = None) -> Dataflow:
    """Highest bid: per tumbling window (10 s), the bids at its highest price."""
    return _job("q7", params)


def q8(params: dict[str, Any] | None = None) -> Dataflow:
    """New users: people who opened an auction in the 10 s window they registered in."""
    return _job("q8", params)


def q11(params: dict[str, Any] | None = None) -> Dataflow:
    """User sessions: bids per bidder per session (10 s of inactivity closes one)."""
    return _job("q11", params)


JOBS: dict[str, Callable[[dict[str, Any] | None], Dataflow]] = {
    "q0": q0,
    "q1": q1,
    "q2": q2,
    "q3": q3,
    "q4": q4,
    "q5": q5,
    "q7": q7,
    "q8": q8,
    "q11": q11,
}
"""The queries that run as streampilot jobs, by name (benchmarks and tests read it)."""


def output_rows(query: str, output: str | os.PathLike[str]) -> list[tuple]:
    """The rows a job of ``query`` wrote to the ``Collect`` directory ``output``, as its
    reference gives them: sorted tuples; for q4, each category's last running mean."""
    rows = sorted(tuple(r) for r in read_parts(output))
    return windowed.final_averages(rows) if query == "q4" else rows


def reference(query: str, params: dict[str, Any] | None = None) -> list[tuple]:
    """``query``'s rows computed in this process for the events of ``params`` (bounded)."""
    p = parse_params(Params, params)
    if not p.events:
        raise ValueError("reference() needs a bounded run (events > 0)")
    if query not in ref.REFERENCES:
        raise ValueError(f"no reference for query {query!r}; have {sorted(ref.REFERENCES)}")
    source = source_of(p)
    return ref.REFERENCES[query](source.event_at(k) for k in range(p.events))
