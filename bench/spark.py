"""Word count on the ``spark`` backend against ``local``, in the same run (issue 6).

For each backend in turn, on ``--workers`` workers (Spark: ``local[N]`` tasks of this
process's SparkSession, so only who starts the worker processes differs):

1. Maximum sustained throughput of the unthrottled word count (``bench/throughput.py``'s).
2. Latency at one common rate: ``--load`` (0.3) of the local backend's maximum, for
   ``--latency-seconds`` after a 3 s warm-up (``bench/throughput.py``'s).
3. One rebalance (a skewed load over ``count``'s key groups) and one scale-out of
   ``count`` by one task, live on a job at that rate: total time and longest task pause.

Every measure runs ``--rounds`` times per backend, interleaved (the machine is shared: its
load hits both alike); the JSON keeps every run and reports the medians.

Writes JSON to ``bench/results/spark.json`` (or ``--out``) with both backends' figures and
the spark/local ratios. Run with ``.venv/bin/python bench/spark.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import WORDS, latency_at, max_throughput, write_report
from controlplane.abstraction import rebalance, scale
from controlplane.coordinator import RuntimeConfig
from controlplane.runner import LocalCluster
from runtime.dataflow import load_job

BACKENDS = ("local", "spark")
WARMUP_S = 3.0  # latency and plans are measured once the job has run this long
SETTLE_S = 2.0  # records flow this long between the two plans
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def wordcount(workers: int, **params: object):
    return load_job(
        "examples.wordcount:build",
        {"parallelism": workers, "zipf": 1.0, "keys": 10_000, **params},
    )


def _plan_figures(rec) -> dict:
    return {
        "status": rec.status,
        "error": rec.error,
        "total_ms": round(rec.timings_ms.get("total", 0.0), 1),
        "max_pause_ms": round(max(rec.pause_ms.values(), default=0.0), 1),
        "affected_tasks": len(rec.affected),
    }


async def reconfigurations(backend: str, workers: int, words_per_s: float, config) -> dict:
    async with LocalCluster(workers, config, backend=backend) as cluster:
        co = cluster.coordinator
        job = await co.submit(wordcount(workers, records=0, rate=words_per_s / WORDS))
        await asyncio.sleep(WARMUP_S)
        skew = {g: 8.0 if g < 16 else 1.0 for g in range(128)}  # count-0 overloaded
        moved = await co.apply_plan(job.id, rebalance(job.abstraction, "count", skew))
        await asyncio.sleep(SETTLE_S)
        grown = len(job.abstraction.operator("count").tasks) + 1
        scaled = await co.apply_plan(job.id, scale(job.abstraction, "count", grown))
        await asyncio.sleep(SETTLE_S)
        await co.stop_job(job.id)
        return {"rebalance": _plan_figures(moved), "scale_out": _plan_figures(scaled)}


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def ratio(spark: float | None, local: float | None) -> float | None:
    return round(spark / local, 3) if spark and local else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each measure per backend")
    parser.add_argument(
        "--load", type=float, default=0.3, help="latency and plans at this share of local's max"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "spark.json"))
    args = parser.parse_args()
    from controlplane.backends.spark import spark_session

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    session = await asyncio.to_thread(spark_session, f"local[{args.workers}]", SPARK_CONF)
    session.sparkContext.setLogLevel("ERROR")
    session_s = round(time.monotonic() - t0, 2)
    config = RuntimeConfig()
    figures: dict[str, dict] = {}
    rounds: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    for i in range(args.rounds):  # interleaved: a shared machine's load hits both alike
        for backend in BACKENDS if i % 2 == 0 else BACKENDS[::-1]:
            run = await max_throughput(args.workers, args.sentences, config, backend)
            rounds[backend].append(run)
            print(f"{backend} round {i + 1}: {run['steady_words_per_s']:,} words/s", flush=True)
    for backend, runs in rounds.items():
        steady = [r["steady_words_per_s"] for r in runs]
        figures[backend] = {
            "max_throughput": {
                "steady_words_per_s": round(statistics.median(steady)),
                "steady_words_per_s_rounds": steady,
                "rounds": runs,
            }
        }
    rate = args.load * figures["local"]["max_throughput"]["steady_words_per_s"]
    lats: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    plans: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    for i in range(args.rounds):
        for backend in BACKENDS if i % 2 == 0 else BACKENDS[::-1]:
            lat = await latency_at(args.workers, rate, args.latency_seconds, config, backend)
            lats[backend].append(lat)
            plans[backend].append(await reconfigurations(backend, args.workers, rate, config))
            ms, done = lat["latency_ms"], plans[backend][-1]
            print(
                f"{backend} round {i + 1}: p50 {ms['p50_ms']} ms p99 {ms['p99_ms']} ms; "
                f"rebalance {done['rebalance']['total_ms']} ms, "
                f"scale-out {done['scale_out']['total_ms']} ms",
                flush=True,
            )
    for backend in BACKENDS:
        figures[backend]["latency"] = {
            "target_words_per_s": round(rate),
            "latency_ms": {
                q: median([r["latency_ms"][q] for r in lats[backend]])
                for q in ("p50_ms", "p99_ms", "max_ms")
            },
            "rounds": lats[backend],
        }
        figures[backend]["plans"] = {
            kind: {
                f: median([r[kind][f] for r in plans[backend]])
                for f in ("total_ms", "max_pause_ms")
            }
            for kind in ("rebalance", "scale_out")
        } | {"rounds": plans[backend]}
    local, spark = figures["local"], figures["spark"]
    write_report(
        args.out,
        "wordcount-spark-vs-local",
        started,
        workers=args.workers,
        spark_master=f"local[{args.workers}]",
        load=args.load,
        spark_session_start_s=session_s,
        config=config.to_dict(),
        backends=figures,
        spark_over_local={
            "steady_words_per_s": ratio(
                spark["max_throughput"]["steady_words_per_s"],
                local["max_throughput"]["steady_words_per_s"],
            ),
            "latency_p50_ms": ratio(
                spark["latency"]["latency_ms"]["p50_ms"], local["latency"]["latency_ms"]["p50_ms"]
            ),
            "latency_p99_ms": ratio(
                spark["latency"]["latency_ms"]["p99_ms"], local["latency"]["latency_ms"]["p99_ms"]
            ),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
