"""Nexmark on local workers: sustained events/s and latency of the queries that run as jobs.

For each query of :data:`QUERIES` (q0, q1, q2 now; the windowed ones join the table when
the runtime has windows) and each worker count of ``--workers``, ``--rounds`` rounds of:

1. Maximum sustained throughput: ``--events`` events, unthrottled, 4 source partitions,
   parallelism = workers, rows discarded; the rate is the median of the per-second
   event rates at the query operator, leaving out the first and last seconds (the
   overall rate when the run is too short for that).
2. Latency at half of it: the same query throttled to 50% of the round's rate for
   ``--latency-seconds``; p50/p99/max of end-to-end latency (the time an event was due at
   the source to its row's arrival at the sink) after a 3 s warm-up.

Each figure is reported as the median of the rounds with their range. ``--profile``
instead profiles, in this process with cProfile, the per-record work of a q1 task
(generating events, the query, encoding batches as they would cross workers) next to
the word count's, and prints where the time goes.

Writes JSON to ``bench/results/nexmark.json`` (or ``--out``):
``.venv/bin/python bench/nexmark.py [--workers 1 2] [--rounds 3] [--only q1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
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
from controlplane.coordinator import RuntimeConfig
from controlplane.runner import run_local
from examples.nexmark import queries
from runtime.dataflow import Dataflow
from runtime.metrics import LatencyHistogram, summarize_latency

QUERIES: dict[str, Callable[[dict[str, Any] | None], Dataflow]] = dict(queries.JOBS)
"""Query name -> job callable taking the params of :class:`examples.nexmark.queries.Params`."""

PARTITIONS = 4
WARMUP_S = 3.0  # latency samples before this are the start-up, not the steady state
RUN_TIMEOUT_S = 600.0  # a throughput run that takes longer has hung


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
    rates = per_second_rates(result.job, query)
    return {
        "events": events,
        "duration_s": duration,
        "overall_events_per_s": round(events / duration),
        "steady_events_per_s": round(statistics.median(rates))
        if rates
        else round(events / duration),
        "per_second_events": rates,
    }


async def latency_at(
    query: str, workers: int, rate: float, seconds: float, config: RuntimeConfig
) -> dict:
    params = {"events": 0, "rate": rate, "partitions": PARTITIONS, "parallelism": workers}
    result = await run_local(
        QUERIES[query](params).compile(),
        workers=workers,
        config=config,
        timeout=seconds + WARMUP_S,
    )
    job = result.job
    start = (job.started_at or 0) + WARMUP_S
    hist = LatencyHistogram()
    for t, _task, snap in job.metrics.samples:
        if t >= start and "latency" in snap:
            hist.merge(LatencyHistogram.from_dict(snap["latency"]))
    rates = per_second_rates(job, query)
    return {
        "target_events_per_s": round(rate),
        "measured_events_per_s": round(statistics.median(rates)) if rates else None,
        "latency_ms": summarize_latency(hist),
    }


async def measure(query: str, workers: int, args: argparse.Namespace, config: RuntimeConfig):
    rounds = []
    for i in range(args.rounds):
        peak = await max_throughput(query, workers, args.events, config)
        half = await latency_at(
            query, workers, 0.5 * peak["steady_events_per_s"], args.latency_seconds, config
        )
        lat = half["latency_ms"]
        print(
            f"{query} on {workers} worker(s), round {i + 1}: "
            f"{peak['steady_events_per_s']:,} events/s; at {half['target_events_per_s']:,}/s "
            f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms",
            flush=True,
        )
        rounds.append({"max_throughput": peak, "latency_at_half": half})
    return {
        "query": query,
        "workers": workers,
        "events_per_s": spread([r["max_throughput"]["steady_events_per_s"] for r in rounds]),
        "p50_ms_at_half": spread([r["latency_at_half"]["latency_ms"]["p50_ms"] for r in rounds]),
        "p99_ms_at_half": spread([r["latency_at_half"]["latency_ms"]["p99_ms"] for r in rounds]),
        "rounds": rounds,
    }


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


def profile(records: int) -> dict[str, Any]:
    """cProfile both tasks; return per-record µs and each's top functions by own time."""
    out: dict[str, Any] = {}
    for name, task in (("q1", _q1_task), ("wordcount", _wordcount_task)):
        started = time.perf_counter()
        task(records)
        plain_s = time.perf_counter() - started
        profiler = cProfile.Profile()
        profiler.runcall(task, records)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        print(f"--- {name}: {plain_s / records * 1e6:.2f} µs/record unprofiled\n{text.getvalue()}")
        out[name] = {"records": records, "us_per_record": round(plain_s / records * 1e6, 2)}
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(QUERIES), default=sorted(QUERIES))
    parser.add_argument("--profile", action="store_true", help="profile q1 in-process, no runs")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "nexmark.json"))
    args = parser.parse_args()
    if args.profile:
        profile(min(args.events, 100_000))
        return
    config = RuntimeConfig()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = [
        await measure(query, workers, args, config)
        for query in args.only
        for workers in args.workers
    ]
    write_report(
        args.out,
        "nexmark",
        started,
        config=config.to_dict(),
        workload={
            "partitions": PARTITIONS,
            "events": args.events,
            "rounds": args.rounds,
            "latency_seconds": args.latency_seconds,
        },
        results=results,
    )


if __name__ == "__main__":
    asyncio.run(main())
