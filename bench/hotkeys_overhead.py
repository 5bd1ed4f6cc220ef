"""What the hot-key sketch costs: the word count with it on and off, its cost per batch
against the keyed processing of the batch, and the bytes the console reads for a keyed
operator.

1. End to end: the word count (``examples.wordcount``, 8 words per sentence over 10,000
   words, uniform and Zipf 1.0) unthrottled on ``--workers`` local workers, with the
   sketch on (``RuntimeConfig(hot_keys=True)``, the default) and off, in interleaved
   rounds: each round runs both, the one that went second in the round before going
   first, so that the VM's drift reaches both alike. A run's rate is the median of its
   per-second word rates at the count operator (first and last seconds left out); a
   round's ratio is on over off.
2. Per batch, in this process: the count operator's ``KeyedProcessor`` (owning all key
   groups, its state warm) processing batches of ``batch_size`` words, against
   ``HotKeySampler.feed`` of the same batches, as the task loop calls them; and the
   sketch's ``take`` once per metrics snapshot.
3. Payload: the JSON the console reads for the count operator at ``max_parallelism``
   128, from snapshots of real ``TaskMetrics`` through the control plane's own
   summaries: its heat map (``GET /jobs/{id}/metrics/series``, 300 s in 2 s steps, the
   console's read) and its tasks' entries in ``GET /jobs/{id}/metrics`` (5 s, the
   console's window) with and without their ``hot_keys``, at 1 to 8 count tasks.

Writes JSON to ``bench/results/hotkeys_overhead.json`` (or ``--out``). Run with
``.venv/bin/python bench/hotkeys_overhead.py`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import statistics
import sys
import time
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import per_second_rates, write_report
from controlplane.coordinator import RuntimeConfig
from controlplane.engine_views import MetricsView
from controlplane.http import GZIP_LEVEL
from controlplane.metrics.series import series
from controlplane.metrics.service import summarize
from controlplane.runner import run_local
from examples.wordcount import word_key
from runtime.channels import OutputChannel
from runtime.dataflow import load_job
from runtime.keygroups import key_group_fn
from runtime.metrics import (
    HOT_KEY_COUNTERS,
    HOT_KEY_SAMPLES,
    HOT_KEYS_REPORTED,
    TaskMetrics,
)
from runtime.operators import KeyedProcessor
from runtime.partitioning import ForwardEdge, Outputs
from runtime.sources import key_names
from runtime.state import KeyedState

WORDS = 8  # words per sentence
KEYS = 10_000  # distinct words
MAX_PARALLELISM = 128  # the word count's key groups
WORKLOADS = {"uniform": 0.0, "zipf": 1.0}  # name -> Zipf skew of the words
SERIES_WINDOW_S, SERIES_STEP_S = 300.0, 2.0  # what the console's charts read
METRICS_WINDOW_S = 5.0  # the console's metrics window
PAYLOAD_TASKS = (1, 2, 4, 8)


def spread(values: Sequence[float], digits: int = 1) -> dict:
    """Median, min, max and count, as the report reads them."""

    def rounded(x: float) -> float:
        return round(x, digits) if digits else round(x)

    return {
        "median": rounded(statistics.median(values)),
        "min": rounded(min(values)),
        "max": rounded(max(values)),
        "n": len(values),
    }


def wordcount(zipf: float, sentences: int, workers: int):
    params = {"records": sentences, "parallelism": workers, "zipf": zipf, "keys": KEYS}
    return load_job("examples.wordcount:build", params)


# -- 1. end to end ---------------------------------------------------------------------------


async def run_once(zipf: float, sentences: int, workers: int, config: RuntimeConfig) -> dict:
    """One bounded word count, unthrottled: its steady and overall words per second."""
    result = await run_local(
        wordcount(zipf, sentences, workers), workers=workers, config=config, timeout=600
    )
    if result.status != "finished":
        raise RuntimeError(f"word count ended {result.status}: {result.error}")
    rates = per_second_rates(result.job, "count")
    overall = sentences * WORDS / result.summary["duration_s"]
    return {
        "steady_words_per_s": round(statistics.median(rates)) if rates else round(overall),
        "overall_words_per_s": round(overall),
        "whole_seconds": len(rates),
    }


async def end_to_end(rounds: int, sentences: int, workers: int, batch_size: int) -> dict:
    """Per workload: each round's runs with the sketch on and off, their medians and
    ranges, and the per-round ratios on / off."""
    out: dict = {}
    for name, zipf in WORKLOADS.items():
        runs: dict[str, list[dict]] = {"on": [], "off": []}
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for mode in order:
                config = RuntimeConfig(batch_size=batch_size, hot_keys=mode == "on")
                run = await run_once(zipf, sentences, workers, config)
                runs[mode].append(run)
                print(
                    f"{name} round {r + 1} sketch {mode}: {run['steady_words_per_s']:,} words/s",
                    flush=True,
                )
        on = [x["steady_words_per_s"] for x in runs["on"]]
        off = [x["steady_words_per_s"] for x in runs["off"]]
        out[name] = {
            "zipf": zipf,
            "on_words_per_s": spread(on, 0),
            "off_words_per_s": spread(off, 0),
            "on_over_off": spread([a / b for a, b in zip(on, off, strict=True)], 3),
            "runs": runs,
        }
    return out


# -- 2. per batch ----------------------------------------------------------------------------


def words(zipf: float, n: int, seed: int) -> list[str]:
    """``n`` words drawn as the word count's generator draws them."""
    names = key_names(KEYS)
    rng = random.Random(seed)
    if zipf <= 0:
        return rng.choices(names, k=n)
    cum = list(accumulate(1.0 / (r + 1) ** zipf for r in range(KEYS)))
    return rng.choices(names, cum_weights=cum, k=n)


def per_batch(zipf: float, batches: int, batch_size: int, repeats: int = 5) -> dict:
    """Microseconds per batch of the count's keyed processing and of the sketch's feed
    (medians of ``repeats`` passes over the same batches), and of one ``take``."""
    graph = wordcount(zipf, 1, 1)
    op = graph.operator("count")
    key_fn = next(inp.key for down, inp in graph.downstream("split") if down.name == "count")
    channel = OutputChannel("bench/count-0>sink-0", "sink-0", credits=1)
    outputs = Outputs([ForwardEdge("sink", [channel])], batch_size=1 << 30, linger_s=3600.0)
    metrics = TaskMetrics(MAX_PARALLELISM, hot_keys=True)
    state = KeyedState("count-0", set(range(MAX_PARALLELISM)))
    processor = KeyedProcessor("count-0", op, outputs, metrics, state)
    sampler = metrics.hot_keys
    assert sampler is not None
    data = words(zipf, batches * batch_size, seed=7)
    chunks = [data[i : i + batch_size] for i in range(0, len(data), batch_size)]
    stamps = [0.0] * batch_size
    clock = time.perf_counter

    def process_pass() -> float:
        spent = 0.0
        for values in chunks:
            t0 = clock()
            processor.process(key_fn, values, stamps)
            spent += clock() - t0
            channel.buf_v.clear()  # what a flush sends, dropped outside the timing
            channel.buf_t.clear()
        return spent / len(chunks) * 1e6

    def feed_pass() -> float:
        t0 = clock()
        for values in chunks:
            sampler.feed(key_fn, values)
        return (clock() - t0) / len(chunks) * 1e6

    process_pass()  # every word's state made: the steady state of a long run
    processing = [process_pass() for _ in range(repeats)]
    feeding = []
    takes = []
    for _ in range(repeats):
        feeding.append(feed_pass())
        t0 = clock()
        sampler.take(HOT_KEYS_REPORTED)
        takes.append((clock() - t0) * 1e6)
    keyed, sketch = statistics.median(processing), statistics.median(feeding)
    return {
        "keyed_us_per_batch": spread(processing, 2),
        "sketch_us_per_batch": spread(feeding, 2),
        "sketch_over_keyed": round(sketch / keyed, 4),
        "take_us": spread(takes, 1),
    }


# -- 3. payload ------------------------------------------------------------------------------


def snapshots(tasks: int, seconds: int, words_per_s: float, feed_last_s: int) -> list:
    """``(time, task, snapshot)`` of ``tasks`` count tasks over ``seconds`` at
    ``words_per_s`` Zipf 1.0 words in all, key groups split evenly between the tasks; the
    last ``feed_last_s`` seconds also feed each task's sketch (with batches of 512 words
    of its groups, as many as the rate makes)."""
    group_of = key_group_fn(MAX_PARALLELISM)
    names = key_names(KEYS)
    weights = [1.0 / (r + 1) for r in range(KEYS)]
    total = sum(weights)
    per_group = [0.0] * MAX_PARALLELISM
    for name, w in zip(names, weights, strict=True):
        per_group[group_of(name)] += w / total
    owner = [g * tasks // MAX_PARALLELISM for g in range(MAX_PARALLELISM)]
    sample = words(1.0, 200_000, seed=11)
    batches = []  # per task, batches of 512 of the words of its groups, fed in turn
    for t in range(tasks):
        own = [w for w in sample if owner[group_of(w)] == t]
        batches.append([own[i : i + 512] for i in range(0, len(own), 512)])
    rng = random.Random(3)
    metrics = [TaskMetrics(MAX_PARALLELISM, hot_keys=True) for _ in range(tasks)]
    out = []
    now = 1_000_000.0
    for s in range(seconds):
        for t, m in enumerate(metrics):
            counts = m.key_group_counts
            assert counts is not None
            for g in range(MAX_PARALLELISM):
                if owner[g] == t:
                    counts[g] = round(words_per_s * per_group[g] * rng.uniform(0.9, 1.1))
            m.records_in = sum(counts)
            m.busy_s, m.idle_s = 0.5, 0.5
            if s >= seconds - feed_last_s and m.hot_keys is not None:
                for i in range(max(m.records_in // 512, 1)):
                    m.hot_keys.feed(word_key, batches[t][i % len(batches[t])])
            snap = m.snapshot({})
            snap["span_s"] = 1.0  # taken a second after the one before, as workers do
            out.append((now + s, f"count-{t}", snap))
    return out


def _view(samples: list, tasks: int, window_s: float) -> MetricsView:
    end = samples[-1][0]
    return MetricsView(
        now=end + 0.5,
        window_s=window_s,
        samples=tuple(x for x in samples if x[0] > end + 0.5 - window_s),
        operator_of={f"count-{t}": "count" for t in range(tasks)},
        kinds={"count": "keyed"},
        placement={f"count-{t}": f"w{t % 2}" for t in range(tasks)},
        workers={},
    )


def payload(words_per_s: float) -> dict:
    """Bytes of the count operator's heat map (as JSON, and gzipped as the server sends it
    to a client that accepts gzip) and of its tasks' metrics entries."""
    out = {}
    seconds = int(SERIES_WINDOW_S)
    for tasks in PAYLOAD_TASKS:
        samples = snapshots(tasks, seconds, words_per_s, feed_last_s=int(METRICS_WINDOW_S) + 1)
        heat = series(1, _view(samples, tasks, SERIES_WINDOW_S), SERIES_STEP_S).key_groups[0]
        entries = summarize(1, _view(samples, tasks, METRICS_WINDOW_S)).tasks
        with_keys = sum(len(e.model_dump_json()) for e in entries)
        without = sum(len(e.model_copy(update={"hot_keys": []}).model_dump_json()) for e in entries)
        out[str(tasks)] = {
            "heat_map_bytes": len(heat.model_dump_json()),
            "heat_map_gzip_bytes": len(gzip.compress(heat.model_dump_json().encode(), GZIP_LEVEL)),
            "heat_map_cells": len(heat.groups) * len(heat.records_per_s[0]),
            "metrics_tasks_bytes": with_keys,
            "metrics_tasks_bytes_without_hot_keys": without,
            "hot_keys_bytes": with_keys - without,
        }
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=2_000_000, help="per run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=RuntimeConfig.batch_size)
    parser.add_argument("--batches", type=int, default=2_000, help="per-batch passes")
    parser.add_argument("--payload-words-per-s", type=float, default=800_000.0)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "hotkeys_overhead.json")
    )
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    micro = {
        name: per_batch(zipf, args.batches, args.batch_size) for name, zipf in WORKLOADS.items()
    }
    for name, m in micro.items():
        print(
            f"{name}: keyed {m['keyed_us_per_batch']['median']} µs/batch, sketch "
            f"{m['sketch_us_per_batch']['median']} µs/batch ({m['sketch_over_keyed']:.1%})",
            flush=True,
        )
    sizes = payload(args.payload_words_per_s)
    print(f"payload bytes: {sizes}", flush=True)
    e2e = await end_to_end(args.rounds, args.sentences, args.workers, args.batch_size)
    write_report(
        args.out,
        "hotkeys-overhead",
        started,
        workers=args.workers,
        rounds=args.rounds,
        sentences=args.sentences,
        batch_size=args.batch_size,
        sketch={"counters": HOT_KEY_COUNTERS, "samples": HOT_KEY_SAMPLES},
        workload={"words_per_sentence": WORDS, "keys": KEYS},
        end_to_end=e2e,
        per_batch=micro,
        payload={
            "max_parallelism": MAX_PARALLELISM,
            "words_per_s": args.payload_words_per_s,
            "series_window_s": SERIES_WINDOW_S,
            "series_step_s": SERIES_STEP_S,
            "metrics_window_s": METRICS_WINDOW_S,
            "by_tasks": sizes,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
