"""The connectors' speed: the word count from Kafka and from NATS JetStream against the
generator, in the same run (issue 33, "Speed to reach").

One tansu broker (memory storage, started here, see :mod:`bench.brokers`) and the
machine's JetStream server. First ``--sentences`` sentences of the generator pipeline's
stream (Zipf 1.0 over 10,000 words, 8 words each) are written to a topic of
``--partitions`` partitions and to a stream split into as many subjects. Then, in each of
``--rounds`` rounds, on 2 local workers, every job checkpointed every second (to local
disk) as a user would run it, the pipeline is examples/wordcount.py's (source -> split ->
keyed count -> sink, 2 tasks each) with its source and sink swapped:

1. **generator**: the generator, unthrottled, to the null sink;
2. **kafka**: the topic (``stop_at="end"``) to a Kafka topic through ``KafkaSink``,
   exactly-once (transactions committed with the checkpoints); **kafka, no
   transactions**: the same, at-least-once;
3. **kafka at half rate**: a load process writes sentences to a fresh topic at half the
   rate of 2 while the job reads it; each sentence carries the time it was written, which
   :class:`~bench.brokers.ProducedAt` makes its timestamp, so the sinks' latency
   histograms measure from the producer's write to the sink's ``write`` (not to the
   commit that makes the output visible: with transactions that comes at the next
   checkpoint). Then the same with the consumers' ``fetch.wait.max.ms`` at
   SHORT_FETCH_WAIT_MS (**short fetch**): tansu answers a fetch only when that wait is
   up, not when records arrive (a Kafka broker answers at once);
4. **jetstream** and **jetstream at half rate**: 2 and 3 with ``JetStreamSource``
   (bounded) and ``JetStreamSink`` (exactly-once by write-ahead).

A full-speed run lasts until its input ends or ``WARMUP_S + --seconds``; its rate is the
median of the whole seconds' sink rates after WARMUP_S (words/s: the count emits a
record per word). A half-rate run is WARMUP_S, then ``--seconds`` measured. Of every run
also: each operator's busy and backpressured share of its tasks' time, and the CPU of
the workers and of the broker process (where the time goes). Each broker pipeline's
figures are also taken over the generator's of its round (the ratios).

``--profile``: afterwards, this process takes each path apart with nothing else running
(:func:`bench.brokers.take_apart`, :func:`bench.brokers.take_apart_jetstream`): per
record, the wall time, the client's CPU and the broker's, of reading and decoding the
input, of encoding the counts and of writing them as the sinks do.

``--only jetstream``: the generator and the JetStream runs only (no tansu, no Kafka).

The VM is shared: the load average is recorded as each round starts. Writes JSON to
``bench/results/connectors.json``. ``--quick``: 1 short round, a smaller input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import (
    NATS_URL,
    ProducedAt,
    delete_streams,
    fill_subjects,
    fill_topic,
    nats_server_pid,
    new_stream,
    paced_load,
    running_tansu,
    sentences,
    take_apart,
    take_apart_jetstream,
)
from bench.reconfig import window
from bench.recovery import spread
from bench.throughput import write_report
from connectors.kafka import KafkaSink, KafkaSource
from connectors.nats import JetStreamSink, JetStreamSource
from controlplane.coordinator import Coordinator, RunningJob, RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy
from controlplane.runner import LocalCluster
from runtime.dataflow import JobGraph, load_job
from runtime.io import Sink, Source
from runtime.sinks import Null

WORDS = 8  # per sentence
WARMUP_S = 3.0  # left out of every run's figures: deploy, connections, first fetches
POLICY = CheckpointPolicy(interval_s=1.0)  # "as a user would run it"
STOP_GRACE_S = 1.1  # the workers' last per-second reports of a window arrive by then
LOAD_SLACK_S = 2.0  # the load runs this much past a half-rate run's window
WAIT_S = 300.0  # no full-speed run lasts longer (a slow VM is not stuck)
SHORT_FETCH_WAIT_MS = 20  # the consumers' fetch wait of the "short fetch" half-rate run
PROFILE_RECORDS = 400_000  # count records encoded and produced by --profile
TARGET_RATIO = 0.5  # of the generator's words/s
TARGET_P99_MS = 100.0  # at half the broker pipeline's rate
PARAMS = {"records": 0, "parallelism": 2, "keys": 10_000, "zipf": 1.0}


# -- what the jobs run --------------------------------------------------------------------


def wordcount(source: Source | None = None, sink: Sink | None = None) -> JobGraph:
    """examples/wordcount.py's job (2 tasks per operator) with ``source`` and ``sink``
    in place of the generator and the null sink."""
    graph = load_job("examples.wordcount:build", PARAMS)
    logic = {"sentences": source, "sink": sink or Null()}
    ops = [
        replace(op, logic=logic[op.name]) if logic.get(op.name) is not None else op
        for op in graph.operators
    ]
    return JobGraph.of(graph.name, ops)


# -- measuring a run ----------------------------------------------------------------------


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` so far (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def per_second(job: RunningJob, start: float, end: float) -> list[int]:
    """The sink records reported in each whole second from ``start`` to ``end``."""
    buckets: dict[int, int] = defaultdict(int)
    for t, task, snap in job.metrics.samples:
        if start < t <= end and job.metrics.operator_of.get(task) == "sink":
            buckets[int(t - start)] += snap.get("records_in", 0)
    return [buckets[s] for s in range(int(end - start))]


def operators_time(job: RunningJob, start: float, end: float) -> dict[str, dict[str, float]]:
    """Per operator, the share of its tasks' time spent busy and waiting for output
    credit (backpressure) in the reports of (start, end]."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for t, task, snap in job.metrics.samples:
        if start < t <= end:
            op = sums[job.metrics.operator_of.get(task, "?")]
            for k in ("busy_s", "backpressure_s", "idle_s"):
                op[k] += snap.get(k, 0.0)
    out = {}
    for name, s in sums.items():
        total = s["busy_s"] + s["backpressure_s"] + s["idle_s"] or 1e-9
        out[name] = {
            "busy": round(s["busy_s"] / total, 3),
            "backpressure": round(s["backpressure_s"] / total, 3),
        }
    return out


class Run:
    """One job's run: submitted on ``workers``, CPU of them and of ``broker`` counted."""

    def __init__(self, co: Coordinator, broker_pid: int | None) -> None:
        self.co = co
        self.broker_pid = broker_pid

    def _pids(self) -> tuple[list[int], list[int]]:
        workers = [w.pid for w in self.co.alive_workers()]
        return workers, [self.broker_pid] if self.broker_pid else []

    async def full_speed(self, graph: JobGraph, seconds: float) -> dict:
        """Until the input ends or WARMUP_S + ``seconds``: the median per-second rate."""
        job = await self.co.submit(graph, checkpoints=POLICY)
        t0 = job.started_at or time.time()
        await asyncio.sleep(max(0.0, t0 + WARMUP_S - time.time()))
        workers, broker = self._pids()
        cpu0 = (cpu_s(workers), cpu_s(broker), time.time())
        with contextlib.suppress(TimeoutError):
            await job.wait(seconds)
        end = job.ended_at or time.time()
        cpu1 = (cpu_s(workers), cpu_s(broker), time.time())
        if not job.done:
            await asyncio.sleep(STOP_GRACE_S)
            await self.co.stop_job(job.id)
        rates = per_second(job, t0 + WARMUP_S, end)
        overall = round(job.metrics.operator_totals("sink") / max(end - t0, 1e-9))
        return {
            "status": job.status,
            "error": job.error,
            # An input read within the warm-up falls back to the overall rate (start included).
            "words_per_s": round(statistics.median(rates)) if rates else overall,
            "per_second": rates,
            "overall_words_per_s": overall,
            "seconds": round(end - t0 - WARMUP_S, 2),
            **self._shares(job, t0 + WARMUP_S, end, cpu0, cpu1),
        }

    async def half_rate(self, graph: JobGraph, load: tuple, rate_words: float, seconds: float):
        """WARMUP_S, then ``seconds`` measured, with ``load`` (paced_load's arguments
        but the rate and duration) writing ``rate_words`` words/s from just before the
        job starts: the sinks' latency and rate over the measured seconds."""
        spawn = multiprocessing.get_context("spawn")
        kind, address, targets, lines = load
        writer = spawn.Process(
            target=paced_load,
            args=(kind, address, targets, rate_words / WORDS, WARMUP_S + seconds + LOAD_SLACK_S),
            kwargs={"lines": lines},
            daemon=True,
        )
        writer.start()
        try:
            job = await self.co.submit(graph, checkpoints=POLICY)
            t0 = job.started_at or time.time()
            await asyncio.sleep(max(0.0, t0 + WARMUP_S - time.time()))
            workers, broker = self._pids()
            cpu0 = (cpu_s(workers), cpu_s(broker), time.time())
            await asyncio.sleep(seconds)
            cpu1 = (cpu_s(workers), cpu_s(broker), time.time())
            await asyncio.sleep(STOP_GRACE_S)
            measured = window(job, t0 + WARMUP_S, t0 + WARMUP_S + seconds)
            if not job.done:
                await self.co.stop_job(job.id)
        finally:
            await asyncio.to_thread(writer.join, LOAD_SLACK_S + 30)
            if writer.is_alive():
                writer.kill()
                writer.join()
        return {
            "status": job.status,
            "error": job.error,
            "target_words_per_s": round(rate_words),
            "sink_words_per_s": round(measured["sink_rate"]),
            "latency_ms": measured["latency"],
            **self._shares(job, t0 + WARMUP_S, t0 + WARMUP_S + seconds, cpu0, cpu1),
        }

    def _shares(self, job: RunningJob, start: float, end: float, cpu0, cpu1) -> dict:
        wall = max(cpu1[2] - cpu0[2], 1e-9)
        return {
            "operators": operators_time(job, start, end),
            "workers_cpu": round((cpu1[0] - cpu0[0]) / wall, 3),  # cores (2 workers)
            "broker_cpu": round((cpu1[1] - cpu0[1]) / wall, 3) if self.broker_pid else None,
        }


# -- a round ------------------------------------------------------------------------------


def delete_topics(bootstrap: str, *topics: str) -> None:
    """Delete ``topics`` (the broker's memory is the VM's)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(topics), operation_timeout=30).values():
        try:
            future.result(30)
        except Exception as exc:  # a topic left behind costs memory, not correctness
            print(f"  (could not delete a topic: {exc})", flush=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


async def one_round(
    co: Coordinator, broker: Any, i: int, args: argparse.Namespace, lines: list[str], inputs
) -> dict:
    topic, stream, subjects = inputs
    generator = Run(co, None)
    out: dict[str, Any] = {"load_average": os.getloadavg()}

    def say(name: str, r: dict) -> None:
        lat = r.get("latency_ms")
        tail = f"p99 {lat['p99_ms']} ms, p50 {lat['p50_ms']} ms" if lat else ""
        rate = r.get("words_per_s") or r.get("sink_words_per_s")
        print(
            f"  round {i + 1} {name:<22} {rate or 0:>10,} words/s {tail} "
            f"(workers {r['workers_cpu']} cores, broker {r['broker_cpu']}) {r['status']}",
            flush=True,
        )

    out["generator"] = await generator.full_speed(wordcount(), args.seconds)
    say("generator", out["generator"])
    if broker is not None:
        await kafka_runs(Run(co, broker.process.pid), broker, i, args, lines, topic, out, say)
    await jetstream_runs(Run(co, nats_server_pid()), i, args, lines, (stream, subjects), out, say)
    gen = out["generator"]["words_per_s"]
    out["ratios"] = {
        name: _ratio(out[name]["words_per_s"], gen)
        for name in ("kafka", "kafka_no_txn", "jetstream")
        if name in out
    }
    return out


async def kafka_runs(
    kafka: Run, broker: Any, i: int, args: argparse.Namespace, lines: list[str], topic: str,
    out: dict, say: Any,
) -> None:  # fmt: skip
    """Runs 2 and 3 of the module docstring into ``out``."""
    for txn in (True, False):
        name = "kafka" if txn else "kafka_no_txn"
        sink_topic = f"counts-{i}-{name}"
        broker.create_topic(sink_topic, args.partitions)
        source = KafkaSource(broker.bootstrap, topic, stop_at="end")
        sink = KafkaSink(broker.bootstrap, sink_topic, transactions=txn)
        out[name] = await kafka.full_speed(wordcount(source, sink), args.seconds)
        say(name, out[name])
        await asyncio.to_thread(delete_topics, broker.bootstrap, sink_topic)

    live, sink_topic = f"live-{i}", f"counts-{i}-half"
    broker.create_topic(live, args.partitions)
    broker.create_topic(sink_topic, args.partitions)
    source = ProducedAt(KafkaSource(broker.bootstrap, live))
    sink = KafkaSink(broker.bootstrap, sink_topic)
    half = (out["kafka"]["words_per_s"] or 0) / 2
    targets = [(live, p) for p in range(args.partitions)]
    out["kafka_half"] = await kafka.half_rate(
        wordcount(source, sink), ("kafka", broker.bootstrap, targets, lines), half, args.seconds
    )
    say("kafka at half rate", out["kafka_half"])
    await asyncio.to_thread(delete_topics, broker.bootstrap, live, sink_topic)

    # tansu answers a fetch only when fetch.wait.max.ms (librdkafka: 500) is up, not
    # when records come: the same with the consumers' wait cut, as a user of it would.
    live, sink_topic = f"live-{i}-short", f"counts-{i}-half-short"
    broker.create_topic(live, args.partitions)
    broker.create_topic(sink_topic, args.partitions)
    short = {"fetch.wait.max.ms": SHORT_FETCH_WAIT_MS}
    source = ProducedAt(KafkaSource(broker.bootstrap, live, config=short))
    sink = KafkaSink(broker.bootstrap, sink_topic)
    targets = [(live, p) for p in range(args.partitions)]
    out["kafka_half_short_fetch"] = await kafka.half_rate(
        wordcount(source, sink), ("kafka", broker.bootstrap, targets, lines), half, args.seconds
    )
    say("kafka at half, short fetch", out["kafka_half_short_fetch"])
    await asyncio.to_thread(delete_topics, broker.bootstrap, live, sink_topic)


async def jetstream_runs(
    nats_: Run, i: int, args: argparse.Namespace, lines: list[str], inputs: tuple, out: dict,
    say: Any,
) -> None:  # fmt: skip
    """Run 4 of the module docstring into ``out``."""
    stream, subjects = inputs
    sink_stream = await asyncio.to_thread(new_stream, "SPBENCHOUT")
    try:
        source = JetStreamSource(servers=NATS_URL, stream=stream, subjects=subjects, bounded=True)
        sink = JetStreamSink(servers=NATS_URL, subject=f"{sink_stream}.counts", stream=sink_stream)
        out["jetstream"] = await nats_.full_speed(wordcount(source, sink), args.seconds)
        say("jetstream", out["jetstream"])
    finally:
        await asyncio.to_thread(delete_streams, sink_stream)

    live_stream = await asyncio.to_thread(new_stream, "SPBENCHLIVE")
    sink_stream = await asyncio.to_thread(new_stream, "SPBENCHOUT")
    try:
        live_subjects = tuple(f"{live_stream}.in.{p}" for p in range(args.partitions))
        source = ProducedAt(
            JetStreamSource(servers=NATS_URL, stream=live_stream, subjects=live_subjects)
        )
        sink = JetStreamSink(servers=NATS_URL, subject=f"{sink_stream}.counts", stream=sink_stream)
        half = (out["jetstream"]["words_per_s"] or 0) / 2
        out["jetstream_half"] = await nats_.half_rate(
            wordcount(source, sink), ("nats", NATS_URL, list(live_subjects), lines), half,
            args.seconds,
        )  # fmt: skip
        say("jetstream at half rate", out["jetstream_half"])
    finally:
        await asyncio.to_thread(delete_streams, live_stream, sink_stream)


RUNS = (
    "generator",
    "kafka",
    "kafka_no_txn",
    "kafka_half",
    "kafka_half_short_fetch",
    "jetstream",
    "jetstream_half",
)


def summary(rounds: list[dict]) -> dict:
    """Each run's figures over the rounds (medians and ranges), the ratios to the
    generator of the same round, and the verdicts."""
    out: dict[str, Any] = {}
    for name in RUNS:
        runs = [r[name] for r in rounds if name in r]
        if not runs:  # a leg --only left out
            continue
        s: dict[str, Any] = {
            "workers_cpu": spread([r["workers_cpu"] for r in runs]),
            "broker_cpu": spread([r["broker_cpu"] for r in runs]),
            "operators": {
                op: {
                    k: spread([r["operators"].get(op, {}).get(k) for r in runs])["median"]
                    for k in ("busy", "backpressure")
                }
                for op in ("sentences", "split", "count", "sink")
            },
        }
        if "_half" in name:
            s["target_words_per_s"] = spread([r["target_words_per_s"] for r in runs])
            s["sink_words_per_s"] = spread([r["sink_words_per_s"] for r in runs])
            # A run whose sinks saw nothing (its pipeline sustained no rate to halve) has
            # no latency: its empty histogram's zeros are left out.
            timed = [r["latency_ms"] for r in runs if r["latency_ms"].get("count")]
            for k in ("p50_ms", "p99_ms", "max_ms"):
                s[k] = spread([lat.get(k) for lat in timed])
        else:
            s["words_per_s"] = spread([r["words_per_s"] for r in runs])
        if name in ("kafka", "kafka_no_txn", "jetstream"):
            s["ratio"] = spread([r["ratios"][name] for r in rounds])
        out[name] = s
    for broker in ("kafka", "jetstream"):
        if broker not in out:
            continue
        ratio = out[broker]["ratio"]["median"]
        p99 = out[f"{broker}_half"]["p99_ms"]["median"]
        out[broker]["met"] = {
            "throughput": ratio is not None and ratio >= TARGET_RATIO,
            "p99": p99 is not None and p99 < TARGET_P99_MS,
        }
    return out


# -- the whole run ------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict:
    lines = sentences(args.sentences)
    scratch = Path(tempfile.mkdtemp(prefix="streampilot-bench-connectors-"))
    config = RuntimeConfig(checkpoint_store=str(scratch / "checkpoints"))
    stream = await asyncio.to_thread(new_stream, "SPBENCHIN")
    subjects = tuple(f"{stream}.in.{p}" for p in range(args.partitions))
    try:
        with running_tansu() if args.only != "jetstream" else contextlib.nullcontext() as broker:
            topic = "sentences"
            t = time.time()
            if broker is not None:
                broker.create_topic(topic, args.partitions)
                await asyncio.to_thread(fill_topic, broker.bootstrap, topic, args.partitions, lines)
            await asyncio.to_thread(fill_subjects, stream, list(subjects), lines)
            print(f"  {len(lines):,} sentences written to both in {time.time() - t:.1f} s")
            async with LocalCluster(2, config=config) as cluster:
                rounds = []
                for i in range(args.rounds):
                    inputs = (topic, stream, subjects)
                    rounds.append(
                        await one_round(cluster.coordinator, broker, i, args, lines, inputs)
                    )
            profile = None
            if args.profile:
                records = min(args.sentences * WORDS, PROFILE_RECORDS)
                profile = {
                    "jetstream": await asyncio.to_thread(
                        take_apart_jetstream, stream, subjects, records
                    ),
                }
                if broker is not None:
                    profile["kafka"] = await asyncio.to_thread(
                        take_apart, broker, topic, args.partitions, records
                    )
                print(f"  the paths taken apart: {profile}", flush=True)
    finally:
        await asyncio.to_thread(delete_streams, stream)
        shutil.rmtree(scratch, ignore_errors=True)
    return {"rounds": rounds, "summary": summary(rounds), "profile": profile}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured seconds of each run, at most"
    )
    parser.add_argument("--sentences", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="take the paths apart after")
    parser.add_argument(
        "--only",
        choices=("all", "jetstream"),
        default="all",
        help="jetstream: the generator and the JetStream runs only (no tansu, no Kafka runs)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a try-out: 1 round, 4 s, 200,000 sentences"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "connectors.json"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.sentences = 1, 4.0, 200_000
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()
    figures = await run(args)
    write_report(
        args.out,
        "connectors",
        started,
        rounds_run=args.rounds,
        seconds=args.seconds,
        warmup_s=WARMUP_S,
        sentences=args.sentences,
        words_per_sentence=WORDS,
        partitions=args.partitions,
        workers=2,
        checkpoint_interval_s=POLICY.interval_s,
        load_average={"start": load, "end": os.getloadavg()},
        targets={"ratio": TARGET_RATIO, "p99_ms": TARGET_P99_MS},
        **figures,
    )


if __name__ == "__main__":
    asyncio.run(main())
