"""Nexmark on local workers: sustained events/s, latency and a live rescale of each query.

For each query of :data:`QUERIES` (q0, q1, q2 stateless; q3, q4, q5, q7, q8, q11 on event
time, :mod:`examples.nexmark.windowed`) and each worker count of ``--workers``,
``--rounds`` rounds of:

1. Maximum sustained throughput: ``--events`` events, unthrottled, 4 source partitions,
   parallelism = workers, rows discarded; the rate is the median of the per-second
   event rates at an operator that reads every event (the query's for q0-q2, the first
   split of the others: :data:`examples.nexmark.windowed.READS`), leaving out the first
   and last seconds (the overall rate when the run is too short for that).
2. Latency at half of it: the same query throttled to 50% of the round's rate, unbounded,
   for ``--latency-seconds`` after a 3 s warm-up; p50/p99/max of the sinks' latency. In
   the event-time jobs a record's timestamp is its event time (a window's result: just
   before the window's end), and the events' time follows the wall clock
   (``time_from_start``, ``event_rate`` = the rate), so the latency is the real delay
   from when an event happened (when a window ended) to its row at the sink; for q0-q2
   it runs from when the event was due at the source.
3. Then, in the same run, one live rescale of the query's stateful operator
   (:data:`examples.nexmark.windowed.STATEFUL`) to one more task: the reconfiguration's
   completion time, and p99 and peak latency from its start to 3 s after its end
   (``null`` when no row reached the sinks then: a tumbling window of 10 s may not close
   in that time).

Each figure is reported as the median of the rounds with their range. With ``--only``,
the results of the other queries already in ``--out`` are kept (each result has its own
date). ``--profile`` instead profiles in this process with cProfile the per-record work
of a q1 task next to the word count's, and of a q5 pipeline (generator, event-time
stamps and source watermarks, the bids split, codec at each keyed edge, both window
stages with their timers), and prints where the time goes by component.

Writes JSON to ``bench/results/nexmark.json`` (or ``--out``):
``.venv/bin/python bench/nexmark.py [--workers 1 2] [--rounds 3] [--only q5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import math
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import per_second_rates, write_report
from controlplane.abstraction import scale
from controlplane.coordinator import RunningJob, RuntimeConfig
from controlplane.runner import LocalCluster, run_local
from examples.nexmark import queries, windowed
from runtime.dataflow import Dataflow
from runtime.metrics import LatencyHistogram, summarize_latency

QUERIES: dict[str, Callable[[dict[str, Any] | None], Dataflow]] = dict(queries.JOBS)
"""Query name -> job callable taking the params of :class:`examples.nexmark.queries.Params`."""

FLINK_PER_CORE = {"q1": 158e3, "q2": 175e3, "q3": 152e3, "q5": 22e3, "q8": 146e3, "q11": 40e3}
"""Flink's published Nexmark throughput per core (events/s), to compare with 1 worker."""

PARTITIONS = 4
WARMUP_S = 3.0  # latency samples before this are the start-up, not the steady state
AFTER_S = 3.0  # a rescale's latency window runs this long past its end
REPORT_S = 1.1  # workers report their metrics every second: the last of a window is in after this
RUN_TIMEOUT_S = 600.0  # a throughput run that takes longer has hung


def reads(query: str) -> str:
    """An operator of ``query``'s job that reads every event."""
    return windowed.READS.get(query, query)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def max_throughput(query: str, workers: int, events: int, config: RuntimeConfig) -> dict:
    params = {"events": events, "partitions": PARTITIONS, "parallelism": workers}
    result = await run_local(
        QUERIES[query](params).compile(), workers=workers, config=config, timeout=RUN_TIMEOUT_S
    )
    if result.status != "finished":
        raise RuntimeError(f"{query} throughput run ended {result.status}: {result.error}")
    duration = result.summary["duration_s"]
    rates = per_second_rates(result.job, reads(query))
    return {
        "events": events,
        "duration_s": duration,
        "overall_events_per_s": round(events / duration),
        "steady_events_per_s": round(statistics.median(rates))
        if rates
        else round(events / duration),
        "per_second_events": rates,
    }


def latency_between(job: RunningJob, start: float, end: float) -> dict:
    """The sinks' latency over the per-second reports made in ``(start, end]``."""
    hist = LatencyHistogram()
    for t, _task, snap in job.metrics.samples:
        if start < t <= end and "latency" in snap:
            hist.merge(LatencyHistogram.from_dict(snap["latency"]))
    return summarize_latency(hist)


def rates_between(job: RunningJob, operator: str, start: float, end: float) -> list[float]:
    buckets: dict[int, int] = {}
    for t, task, snap in job.metrics.samples:
        if start < t <= end and job.metrics.operator_of.get(task) == operator:
            buckets[int(t)] = buckets.get(int(t), 0) + snap.get("records_in", 0)
    secs = sorted(buckets)
    return [buckets[s] for s in secs[1:-1]]


async def latency_at(
    query: str, workers: int, rate: float, seconds: float, config: RuntimeConfig
) -> dict:
    """Latency at ``rate`` (see the module), then a live rescale of the stateful operator."""
    params = {
        "events": 0,
        "rate": rate,
        "partitions": PARTITIONS,
        "parallelism": workers,
        "event_rate": max(1, round(rate)),
        "time_from_start": True,
    }
    async with LocalCluster(workers, config) as cluster:
        co = cluster.coordinator
        job = await co.submit(QUERIES[query](params).compile())
        await asyncio.sleep(WARMUP_S + seconds)
        if job.done:
            raise RuntimeError(f"{query} latency run ended {job.status}: {job.error}")
        steady_from, steady_to = (job.started_at or 0) + WARMUP_S, time.time()
        out: dict[str, Any] = {
            "target_events_per_s": round(rate),
            "measured_events_per_s": None,
            "latency_ms": latency_between(job, steady_from, steady_to),
            "rescale": None,
        }
        rates = rates_between(job, reads(query), steady_from, steady_to)
        out["measured_events_per_s"] = round(statistics.median(rates)) if rates else None
        op = windowed.STATEFUL.get(query)
        if op is not None:
            tasks = len(job.abstraction.operator(op).tasks)
            t0 = time.time()
            rec = await co.apply_plan(job.id, scale(job.abstraction, op, tasks + 1))
            t1 = time.time()
            await asyncio.sleep(AFTER_S + REPORT_S)
            around = latency_between(job, t0, t1 + AFTER_S)
            out["rescale"] = {
                "operator": op,
                "tasks": [tasks, tasks + 1],
                "status": rec.status,
                "error": rec.error,
                "completion_ms": rec.timings_ms.get("total", round((t1 - t0) * 1000, 1)),
                "latency_around_ms": around,
            }
        await co.stop_job(job.id)
    return out


def _figure(rounds: list[dict], get: Callable[[dict], float | None]) -> dict | None:
    values = [v for v in map(get, rounds) if v is not None]
    return spread(values) if values else None


def _latency(r: dict, field: str) -> float | None:
    latency = r["latency_at_half"]["latency_ms"]
    return latency[field] if latency["count"] else None  # no row reached the sinks


def _rescale(r: dict, field: str) -> float | None:
    rescale = r["latency_at_half"]["rescale"]
    if rescale is None:
        return None
    if field == "completion_ms":
        return rescale["completion_ms"]
    return rescale["latency_around_ms"][field] if rescale["latency_around_ms"]["count"] else None


async def measure(query: str, workers: int, args: argparse.Namespace, config: RuntimeConfig):
    rounds = []
    for i in range(args.rounds):
        peak = await max_throughput(query, workers, args.events, config)
        half = await latency_at(
            query, workers, 0.5 * peak["steady_events_per_s"], args.latency_seconds, config
        )
        lat, rescale = half["latency_ms"], half["rescale"]
        line = (
            f"{query} on {workers} worker(s), round {i + 1}: "
            f"{peak['steady_events_per_s']:,} events/s; at {half['target_events_per_s']:,}/s "
            f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms"
        )
        if rescale is not None:
            around = rescale["latency_around_ms"]
            line += (
                f"; rescale {rescale['status']} in {rescale['completion_ms']:.0f} ms, "
                f"max {around['max_ms']} ms around it"
            )
        print(line, flush=True)
        rounds.append({"max_throughput": peak, "latency_at_half": half})
    return {
        "query": query,
        "workers": workers,
        "date": args.started,
        "events_per_s": spread([r["max_throughput"]["steady_events_per_s"] for r in rounds]),
        "p50_ms_at_half": _figure(rounds, lambda r: _latency(r, "p50_ms")),
        "p99_ms_at_half": _figure(rounds, lambda r: _latency(r, "p99_ms")),
        "rescale_completion_ms": _figure(rounds, lambda r: _rescale(r, "completion_ms")),
        "rescale_p99_ms": _figure(rounds, lambda r: _rescale(r, "p99_ms")),
        "rescale_max_ms": _figure(rounds, lambda r: _rescale(r, "max_ms")),
        "rounds": rounds,
    }


def table(results: list[dict]) -> str:
    """The results as a markdown table: medians with their ranges."""

    def cell(fig: dict | None, unit: str = "") -> str:
        if fig is None:
            return "-"
        return f"{fig['median']:,.0f}{unit} ({fig['min']:,.0f}-{fig['max']:,.0f})"

    lines = [
        "| query | workers | events/s | p50 ms at half | p99 ms at half "
        "| rescale ms | max ms around it | Flink per core |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        flink = FLINK_PER_CORE.get(r["query"])
        lines.append(
            f"| {r['query']} | {r['workers']} | {cell(r['events_per_s'])} "
            f"| {cell(r['p50_ms_at_half'])} | {cell(r['p99_ms_at_half'])} "
            f"| {cell(r.get('rescale_completion_ms'))} | {cell(r.get('rescale_max_ms'))} "
            f"| {f'{flink:,.0f}' if flink and r['workers'] == 1 else ''} |"
        )
    return "\n".join(lines)


# -- profile ------------------------------------------------------------------------------


def _q1_task(records: int) -> int:
    """What a q1 source task and its query do per record, and the encoding of the events
    as they would cross workers (with ``shuffle``), in batches of 512."""
    from examples.nexmark.queries import currency_conversion, source_of
    from runtime.codec import packb, unpackb

    source = source_of(queries.Params(events=records, partitions=1))
    reader = source.open_partition("p0", 0.0)
    rows = 0
    while (polled := reader.poll(math.inf, 512)) is not None:
        unpackb(packb(polled[0]))
        for event in polled[0]:
            rows += len(currency_conversion(event))
    return rows


def _wordcount_task(sentences: int) -> int:
    """The word count's per-record work: sentences generated, split, counted, encoded."""
    from examples import wordcount
    from runtime.codec import packb, unpackb

    reader = wordcount.source_of(wordcount.Params(records=sentences)).open(0, 1, 0.0)
    counts: dict[str, int] = {}
    while (polled := reader.poll(math.inf, 512)) is not None:
        unpackb(packb(polled[0]))
        for sentence in polled[0]:
            for word in wordcount.split_words(sentence):
                counts[word] = counts.get(word, 0) + 1
    return len(counts)


def _q5_pipeline(events: int) -> int:
    """What the q5 job does per event, in this process: a source task's generating and
    event-time stamping, its watermark (after every batch of 512, where the runtime sends
    one at most every 0.2 s), the bids split, and each window stage (the real keyed
    processors the workers build, with their timers) behind the codec, as on a keyed
    edge between workers. Returns the rows."""
    from runtime.codec import packb, unpackb
    from runtime.eventtime import SourceClock
    from runtime.metrics import TaskMetrics
    from runtime.operators import make_processor
    from runtime.partitioning import Outputs
    from runtime.sinks import Null
    from runtime.state import KeyedState

    source = queries.source_of(
        queries.Params(events=events, partitions=1, out_of_order_group_size=10)
    )
    graph = windowed.build("q5", source, 1, Null()).compile()
    spec = windowed.event_time(source)
    clock = SourceClock(spec, ["p0"])
    stages = []
    for name in ("counts", "hot"):
        op = graph.operator(name)
        outputs = Outputs([], 512, 0.0)
        emitted: list = []
        outputs.emit = lambda values, stamps, into=emitted: into.extend(
            zip(values, stamps, strict=True)
        )
        state = KeyedState(f"{name}-0", range(op.max_parallelism))
        processor = make_processor(
            f"{name}-0", op, 0, outputs, TaskMetrics(op.max_parallelism), state
        )
        stages.append((op.inputs[0].key, processor, emitted))
    reader = source.open_partition("p0", 0.0)
    rows = 0

    def through(values: list, stamps: list, mark: float) -> int:
        for key, processor, emitted in stages:
            values, stamps = unpackb(packb((values, stamps)))
            processor.process(key, values, stamps)
            processor.on_watermark(mark)
            values, stamps = [v for v, _ in emitted], [t for _, t in emitted]
            emitted.clear()
        return sum(len(windowed.hot_rows(r)) for r in values)

    while (polled := reader.poll(math.inf, 512)) is not None:
        stamps = spec.stamps(polled[0])
        clock.observe("p0", stamps, 0.0)
        placed = [(e, t) for e, t in zip(polled[0], stamps, strict=True) if windowed.bids(e)]
        mark = clock.watermark(0.0)
        rows += through([e for e, _ in placed], [t for _, t in placed], mark)
    return rows + through([], [], math.inf)


COMPONENTS = (
    ("generator", ("nexmark/generator", "nexmark/source", "_hashlib", "struct", "_sha3")),
    ("codec", ("runtime/codec", "msgpack", "pickle", "__reduce__", "nexmark/model")),
    ("watermarks", ("runtime/eventtime",)),
    ("windows and timers", ("runtime/windows", "runtime/timers", "operators/timed", "heap")),
    ("keyed state and key groups", ("runtime/state", "runtime/keygroups", "operators/__init__")),
    ("query logic", ("nexmark/windowed", "nexmark/queries", "examples/wordcount")),
)
"""Where a profiled function's own time goes: the first component one of whose markers is
in its file name or (for built-ins) its name."""


def by_component(stats: pstats.Stats) -> dict[str, float]:
    """Share of the profile's own time per :data:`COMPONENTS` (the rest: "other")."""
    totals: dict[str, float] = {}
    for (filename, _line, name), (_cc, _nc, own, _cum, _callers) in stats.stats.items():
        where = f"{filename}:{name}"
        part = next((c for c, marks in COMPONENTS if any(m in where for m in marks)), "other")
        totals[part] = totals.get(part, 0.0) + own
    whole = sum(totals.values()) or 1.0
    return {c: round(t / whole, 3) for c, t in sorted(totals.items(), key=lambda kv: -kv[1])}


def profile(records: int) -> dict[str, Any]:
    """cProfile the tasks; return per-record µs and each's share of time per component,
    and print each's top functions by own time."""
    out: dict[str, Any] = {}
    for name, task in (("q1", _q1_task), ("wordcount", _wordcount_task), ("q5", _q5_pipeline)):
        started = time.perf_counter()
        task(records)
        plain_s = time.perf_counter() - started
        profiler = cProfile.Profile()
        profiler.runcall(task, records)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(15)
        shares = by_component(stats)
        print(
            f"--- {name}: {plain_s / records * 1e6:.2f} µs/record unprofiled; "
            f"own time by component: {shares}\n{text.getvalue()}"
        )
        out[name] = {
            "records": records,
            "us_per_record": round(plain_s / records * 1e6, 2),
            "own_time_by_component": shares,
        }
    return out


def merged(path: str, results: list[dict]) -> list[dict]:
    """``results``, and those of the other (query, workers) already in the report at
    ``path`` (a run ``--only`` some queries keeps the others')."""
    try:
        report = json.loads(Path(path).read_text())
        before = report["results"]
    except (OSError, ValueError, KeyError):
        return results
    ran = {(r["query"], r["workers"]) for r in results}
    kept = [
        {**r, "date": r.get("date", report.get("date"))}
        for r in before
        if (r["query"], r["workers"]) not in ran
    ]
    order = {q: i for i, q in enumerate(QUERIES)}
    return sorted(kept + results, key=lambda r: (order.get(r["query"], 99), r["workers"]))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(QUERIES), default=list(QUERIES))
    parser.add_argument("--profile", action="store_true", help="profile in-process, no runs")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "nexmark.json"))
    args = parser.parse_args()
    if args.profile:
        found = profile(min(args.events, 100_000))
        try:  # kept with the runs' report, which the page renders
            report = json.loads(Path(args.out).read_text())
        except (OSError, ValueError):
            return
        report["profile"] = found
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        return
    config = RuntimeConfig()
    args.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = [
        await measure(query, workers, args, config)
        for query in args.only
        for workers in args.workers
    ]
    results = merged(args.out, results)
    print(table(results))
    write_report(
        args.out,
        "nexmark",
        args.started,
        config=config.to_dict(),
        workload={
            "partitions": PARTITIONS,
            "events": args.events,
            "rounds": args.rounds,
            "latency_seconds": args.latency_seconds,
        },
        flink_per_core_events_per_s=FLINK_PER_CORE,
        results=results,
    )


if __name__ == "__main__":
    asyncio.run(main())
