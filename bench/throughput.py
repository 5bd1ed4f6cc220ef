"""Word count throughput and latency on local workers (issue: the runtime's speed targets).

1. Maximum sustained throughput: the word count (Zipf 1.0 over 10,000 words, 8 words per
   sentence) with an unthrottled source on ``--workers`` workers (parallelism = workers),
   discarding results; the steady rate is the median of the per-second word rates at the
   count operator, leaving out the first and last seconds.
2. Latency at half of it: the same job throttled to 50% of the measured maximum for
   ``--latency-seconds``; p50/p99/max of end-to-end latency (source timestamp to sink)
   after a warm-up of 2 s.

Writes JSON to ``bench/results/throughput.json`` (or ``--out``). Run with
``make bench`` or ``.venv/bin/python bench/throughput.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controlplane.coordinator import RunningJob, RuntimeConfig
from controlplane.runner import run_local
from runtime.dataflow import load_job
from runtime.metrics import LatencyHistogram, summarize_latency

WORDS = 8


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_report(path: str, benchmark: str, started: str, **figures: object) -> None:
    """Write a benchmark's JSON: what, when, where, the command to re-run it, its figures."""
    report = {
        "benchmark": benchmark,
        "date": started,
        "machine": machine(),
        "command": f"python bench/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:]),
        **figures,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def per_second_rates(job: RunningJob, operator: str) -> list[float]:
    buckets: dict[int, int] = defaultdict(int)
    for t, task, snap in job.metrics.samples:
        if job.metrics.operator_of.get(task) == operator:
            buckets[int(t)] += snap.get("records_in", 0)
    secs = sorted(buckets)
    return [buckets[s] for s in secs[1:-1]]  # drop partial first and last seconds


async def max_throughput(
    workers: int, sentences: int, config: RuntimeConfig, backend: str = "local"
) -> dict:
    params = {"records": sentences, "parallelism": workers, "zipf": 1.0, "keys": 10_000}
    result = await run_local(
        load_job("examples.wordcount:build", params),
        workers=workers,
        config=config,
        timeout=300,
        backend=backend,
    )
    if result.status != "finished":
        raise RuntimeError(f"throughput run ended {result.status}: {result.error}")
    rates = per_second_rates(result.job, "count")
    words = sentences * WORDS
    return {
        "sentences": sentences,
        "words": words,
        "duration_s": result.summary["duration_s"],
        "overall_words_per_s": round(words / result.summary["duration_s"]),
        # A run too short for whole seconds in the middle falls back to the overall rate.
        "steady_words_per_s": round(statistics.median(rates))
        if rates
        else round(words / result.summary["duration_s"]),
        "steady_from": "median of per-second rates" if rates else "overall rate (run too short)",
        "per_second_words": rates,
    }


async def latency_at(
    workers: int, words_per_s: float, seconds: float, config: RuntimeConfig, backend: str = "local"
) -> dict:
    rate = words_per_s / WORDS
    params = {"records": 0, "rate": rate, "parallelism": workers, "zipf": 1.0, "keys": 10_000}
    warmup = 3.0
    result = await run_local(
        load_job("examples.wordcount:build", params),
        workers=workers,
        config=config,
        timeout=seconds + warmup,
        backend=backend,
    )
    job = result.job
    start = (job.started_at or 0) + warmup
    hist = LatencyHistogram()
    for t, _task, snap in job.metrics.samples:
        if t >= start and "latency" in snap:
            hist.merge(LatencyHistogram.from_dict(snap["latency"]))
    rates = per_second_rates(job, "count")
    return {
        "target_words_per_s": round(words_per_s),
        "measured_words_per_s": round(statistics.median(rates)) if rates else None,
        "seconds": seconds,
        "latency_ms": summarize_latency(hist),
        "status": result.status,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=600_000)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--batch-size", type=int, default=RuntimeConfig.batch_size)
    parser.add_argument("--linger-ms", type=float, default=RuntimeConfig.linger_s * 1000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "throughput.json"))
    args = parser.parse_args()
    config = RuntimeConfig(batch_size=args.batch_size, linger_s=args.linger_ms / 1000)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    peak = await max_throughput(args.workers, args.sentences, config)
    print(
        f"max sustained: {peak['steady_words_per_s']:,} words/s "
        f"(overall {peak['overall_words_per_s']:,} words/s)",
        flush=True,
    )
    half = await latency_at(
        args.workers, 0.5 * peak["steady_words_per_s"], args.latency_seconds, config
    )
    lat = half["latency_ms"]
    print(
        f"at 50% ({half['target_words_per_s']:,} words/s): p50 {lat['p50_ms']} ms, "
        f"p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms",
        flush=True,
    )
    write_report(
        args.out,
        "wordcount-throughput",
        started,
        workers=args.workers,
        config=config.to_dict(),
        workload={"words_per_sentence": WORDS, "keys": 10_000, "zipf": 1.0},
        max_throughput=peak,
        latency_at_half=half,
    )


if __name__ == "__main__":
    asyncio.run(main())
