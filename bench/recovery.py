"""Checkpoints and recovery on the padded word count (issue: fault tolerance).

For each per-task state size (``--state-mb``, default 1, 10, 100), on 3 local workers,
the padded word count of bench/reconfig.py (:func:`bench.reconfig.padded_params`: 2 count
tasks holding the given state each, on 2 workers) first runs unthrottled to measure its
maximum rate, as there (:func:`bench.reconfig.max_rate`); then:

1. **Overhead.** ``--rounds`` rounds; each runs the job once per configuration of
   :data:`CONFIGS`, in turn, so that the VM's drift hits each alike: no checkpoints,
   every 10 s, every 1 s, every 1 s written whole (``full_every=1``). A run is WARMUP_S
   then ``--seconds`` at half the maximum rate (p99 latency, from the sinks' histograms),
   then ``--seconds`` unthrottled (the source's schedule steps to OVERDRIVE times the
   maximum; throughput: the sink's rate over those seconds, the first left out). Each
   figure is also taken against the no-checkpoint run of its round. Of each checkpoint
   started during the half-rate seconds: its duration (barrier to manifest written) and
   the bytes its tasks wrote, against the bytes a restore of it reads (every chain).
2. **Recovery.** ``--rounds`` rounds, each once with a spare worker (the third, idle:
   the recovery places the lost tasks on it) and once without (the third retired: the
   recovery asks the local backend for a new worker process). The job runs at half
   rate, checkpointed as RECOVERY_POLICY says, its sinks logging when each batch
   arrives (:mod:`bench.arrivals`); KILL_AFTER_S after its KILL_AT_CHECKPOINT-th complete
   checkpoint (chains of incremental parts grown as they are in a long run), the worker
   hosting count-1 is SIGKILLed. From the kill: **first output**, the first batch a
   recovered sink task writes (a replayed record: the outage as the output sees it);
   **caught up**, when the recovered sinks have written as many records as the sources
   emitted from the checkpoint's positions to the kill (later ones were emitted after
   it); **p99 back**, the end of the first whole second after the recovery whose p99 is
   within 2x the p99 from the warm-up to the kill. And the recovery's own report.
3. **Exactly once.** A bounded run (EXACT_SENTENCES sentences at EXACT_RATE per second,
   the same checkpoints, the same kill after EXACT_AT_CHECKPOINT checkpoints) whose sink
   (``Collect``, mode "all") writes every (word, running count), compared with those that
   ``examples.wordcount.reference`` implies: nothing missing, nothing twice.

The VM is shared: each size records the load average as it starts and ends. Writes JSON
to ``bench/results/recovery.json``. ``--quick``: 1 MB, 1 round, 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.arrivals import Arrivals, read_arrivals
from bench.reconfig import WARMUP_S, WORDS, max_rate, padded_params, window
from bench.throughput import write_report
from controlplane.coordinator import Coordinator, RunningJob, RuntimeConfig
from controlplane.coordinator.checkpoint_report import CheckpointPolicy, CheckpointReport
from controlplane.coordinator.checkpointer import manifest_path
from controlplane.coordinator.report import RunReport
from controlplane.coordinator.workers import start_workers
from controlplane.runner import LocalCluster
from controlplane.statuses import CheckpointStatus
from examples.wordcount import reference
from runtime.checkpoints.store import open_store
from runtime.dataflow import JobGraph, load_job
from runtime.io import Sink
from runtime.sinks import Collect, read_parts

WORDCOUNT = "examples.wordcount:build"
CONFIGS: dict[str, CheckpointPolicy | None] = {
    "none": None,
    "every_10s": CheckpointPolicy(interval_s=10.0),
    "every_1s": CheckpointPolicy(interval_s=1.0),
    "every_1s_whole": CheckpointPolicy(interval_s=1.0, full_every=1),
}
OVERDRIVE = 10.0  # the unthrottled seconds: a rate far above what the job sustains
RECOVERY_POLICY = CheckpointPolicy(interval_s=1.0)  # incremental, full_every=8
KILL_AT_CHECKPOINT = 10  # past full_every: key groups' chains as long as they get
KILL_AFTER_S = 0.5  # half an interval after a checkpoint completed: a typical replay
AFTER_KILL_S = 20.0  # at most this long to watch a recovered job (p99 back, caught up)
EXACT_SENTENCES = 300_000
EXACT_RATE = 20_000.0  # sentences/s: the bounded run ends ~15 s after it starts
EXACT_AT_CHECKPOINT = 3
WAIT_S = 120.0  # no wait for a checkpoint or a job lasts longer (a slow VM is not stuck)


class Observed:
    """What the coordinator tells of the benchmark's jobs: each checkpoint's report as
    it was last told, and each recovery's report."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, dict[int, CheckpointReport]] = {}
        self.recoveries: dict[str, list[RunReport]] = {}

    def checkpoint(self, job_id: str, what: CheckpointReport | int) -> None:
        if isinstance(what, CheckpointReport):
            self.checkpoints.setdefault(job_id, {})[what.id] = what

    def recovered(self, job_id: str, report: RunReport, _version: dict[str, Any]) -> None:
        self.recoveries.setdefault(job_id, []).append(report)

    def completed(self, job_id: str) -> list[CheckpointReport]:
        reports = self.checkpoints.get(job_id, {}).values()
        return [r for r in reports if r.status == CheckpointStatus.COMPLETED]


async def until(what: str, condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Wait until ``condition()`` holds (checked every 10 ms); raises after ``timeout``."""
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g}s")
        await asyncio.sleep(0.01)


def with_sink(graph: JobGraph, sink: Sink) -> JobGraph:
    """``graph`` with ``sink`` as the logic of its operator ``sink``."""
    ops = [replace(op, logic=sink) if op.name == "sink" else op for op in graph.operators]
    return JobGraph.of(graph.name, ops)


async def keep_workers(co: Coordinator, n: int) -> list[str]:
    """Exactly ``n`` workers alive (between jobs: the ones beyond ``n`` host nothing),
    starting or retiring some; returns their ids."""
    alive = co.alive_workers()
    if len(alive) < n:
        await start_workers(co, n - len(alive), "the benchmark keeps a spare worker")
    for w in alive[n:]:
        await co.retire_worker(w.id, "the benchmark runs without a spare worker")
    return [w.id for w in co.alive_workers()]


async def finish(co: Coordinator, job: RunningJob, store: Path) -> None:
    """Stop ``job`` and remove its checkpoints (at 100 MB per task and an interval of 1 s
    a job's chains come to gigabytes)."""
    await co.stop_job(job.id)
    await asyncio.to_thread(shutil.rmtree, store / job.id, True)


def spread(values: list[float | None]) -> dict[str, float | int | None]:
    """Median, min and max of the values present, and how many there are."""
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(present), 3),
        "min": round(min(present), 3),
        "max": round(max(present), 3),
        "n": len(present),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# -- 1. overhead ---------------------------------------------------------------------------


async def overhead_run(
    co: Coordinator,
    seen: Observed,
    params: dict,
    policy: CheckpointPolicy | None,
    workers: list[str],
    seconds: float,
    store: Path,
) -> dict:
    """One run of the job in one configuration (module docstring, step 1)."""
    job = await co.submit(load_job(WORDCOUNT, params), workers, checkpoints=policy)
    t0 = job.started_at or time.time()
    half_end, end = t0 + WARMUP_S + seconds, t0 + WARMUP_S + 2 * seconds
    await asyncio.sleep(end + 1.1 - time.time())  # the workers' last reports of the window
    half = window(job, t0 + WARMUP_S, half_end)
    full = window(job, half_end + 1.0, end)
    checkpoints = [
        {**r.reported(), "started_s": round(r.started_at - t0, 3)}
        for r in sorted(seen.checkpoints.get(job.id, {}).values(), key=lambda r: r.id)
    ]
    await finish(co, job, store)
    return {
        "status": job.status,
        "latency_ms": half["latency"],
        "half_rate_sink_words_per_s": round(half["sink_rate"]),
        "max_words_per_s": round(full["sink_rate"]),
        "checkpoints": checkpoints,
    }


def overhead_summary(rounds: list[dict[str, dict]], seconds: float) -> dict[str, dict]:
    """Per configuration: its figures over the rounds, the ratios to the no-checkpoint run
    of each round, and its checkpoints started during the half-rate seconds."""
    out = {}
    for name in CONFIGS:
        runs = [r[name] for r in rounds]
        taken = [
            c
            for run in runs
            for c in run["checkpoints"]
            if WARMUP_S <= c["started_s"] < WARMUP_S + seconds
        ]
        done = [c for c in taken if c["status"] == CheckpointStatus.COMPLETED]
        out[name] = {
            "max_words_per_s": spread([r["max_words_per_s"] for r in runs]),
            "p99_ms": spread([r["latency_ms"]["p99_ms"] for r in runs]),
            # Above steady (some ms) without checkpoints: the job fell behind its rate.
            "p50_ms": spread([r["latency_ms"]["p50_ms"] for r in runs]),
            "half_rate_sink_words_per_s": spread([r["half_rate_sink_words_per_s"] for r in runs]),
            "throughput_ratio": spread(
                [_ratio(r[name]["max_words_per_s"], r["none"]["max_words_per_s"]) for r in rounds]
            ),
            "p99_ratio": spread(
                [
                    _ratio(r[name]["latency_ms"]["p99_ms"], r["none"]["latency_ms"]["p99_ms"])
                    for r in rounds
                ]
            ),
            "checkpoints_completed": len(done),
            "checkpoints_abandoned": len(taken) - len(done),
            "abandoned_because": sorted({c["error"] for c in taken if c["error"]})[:3],
            "duration_ms": spread([c["duration_ms"] for c in done]),
            "bytes_written": spread([c["bytes"] for c in done]),
            "bytes_restore_reads": spread([c["full_bytes"] for c in done]),
            "written_over_restore_reads": spread(
                [_ratio(c["bytes"], c["full_bytes"]) for c in done]
            ),
        }
    return out


# -- 2. recovery ---------------------------------------------------------------------------


async def kill_after_checkpoints(co: Coordinator, seen: Observed, job: RunningJob, n: int) -> float:
    """SIGKILL the worker hosting count-1 KILL_AFTER_S after ``job``'s ``n``-th complete
    checkpoint; returns when (``time.time()``)."""
    await until(f"{n} complete checkpoints", lambda: len(seen.completed(job.id)) >= n or job.done)
    await asyncio.sleep(KILL_AFTER_S)
    if job.done:
        raise RuntimeError(f"job {job.id} ended ({job.status}: {job.error}) before the kill")
    victim = co.workers[job.layout.placement["count-1"]]
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    return killed_at


def replayed_records(job: RunningJob, manifest: dict, until_s: float) -> int:
    """The sink records the sources' records from checkpoint ``manifest``'s positions to
    ``until_s`` make (each sentence's words; the sources kept up with their rate)."""
    source = job.graph.operator("sentences")
    sentences = 0
    for task, part in manifest["tasks"].items():
        if task.rpartition("-")[0] != "sentences":
            continue
        reader = source.logic.open(int(task.rpartition("-")[2]), source.parallelism, job.started_at)
        reader.seek(part["position"])
        polled = reader.poll(until_s, 1 << 40)
        sentences += len(polled[0]) if polled else 0
        reader.close()
    return sentences * WORDS


async def recovery_run(
    co: Coordinator, seen: Observed, params: dict, spare: bool, store: Path, logs: Path
) -> dict:
    """One kill and recovery (module docstring, step 2)."""
    workers = await keep_workers(co, 3 if spare else 2)
    graph = with_sink(load_job(WORDCOUNT, params), Arrivals(str(logs)))
    job = await co.submit(graph, workers[:2], checkpoints=RECOVERY_POLICY)
    t0 = job.started_at or time.time()
    killed_at = await kill_after_checkpoints(co, seen, job, KILL_AT_CHECKPOINT)
    steady = window(job, t0 + WARMUP_S, killed_at)["latency"]["p99_ms"]
    await until("recovery", lambda: bool(seen.recoveries.get(job.id)) or job.done, AFTER_KILL_S)
    if not seen.recoveries.get(job.id):
        await finish(co, job, store)
        return {"spare": spare, "status": job.status, "error": job.error}
    report = seen.recoveries[job.id][0]
    recovered_at = report.ended_at or time.time()
    # Read now: once the job has taken `retained` more checkpoints, this one is removed.
    checkpoint = seen.checkpoints[job.id][report.plan["checkpoint_id"]]
    path = manifest_path(job.id, checkpoint.id)
    manifest = msgpack.unpackb(open_store(str(store)).get(path), strict_map_key=False)
    p99_back = None
    end = recovered_at + 1.05
    while end < killed_at + AFTER_KILL_S and p99_back is None:
        await asyncio.sleep(max(end - time.time(), 0) + 0.05)
        last = window(job, end - 1.05, end)["latency"]
        if last["count"] and last["p99_ms"] <= 2 * max(steady, 5.0):
            p99_back = round(end - killed_at, 3)
        end += 1.0
    await asyncio.sleep(0.2)  # the sinks' logs flushed
    writes = sorted(b for o in read_arrivals(logs) if o.opened > killed_at for b in o.batches)
    owed = replayed_records(job, manifest, killed_at)
    caught_up, written = None, 0
    for t, n in writes:
        written += n
        if written >= owed:
            caught_up = round(t - killed_at, 3)
            break
    await finish(co, job, store)
    shutil.rmtree(logs, ignore_errors=True)
    started = recovered_at - report.timings_ms["total"] / 1000
    return {
        "spare": spare,
        "status": report.status,
        "placed_on": report.plan["placed_on"],
        "spare_worker": workers[2] if spare else None,
        "checkpoint_id": checkpoint.id,
        "replayed_s": round(killed_at - checkpoint.started_at, 3),
        "replayed_records": owed,
        "restore_reads_bytes": checkpoint.full_bytes,
        "steady_p99_ms": steady,
        "first_output_s": round(writes[0][0] - killed_at, 3) if writes else None,
        "caught_up_s": caught_up,
        "p99_back_s": p99_back,
        "detect_ms": round((started - killed_at) * 1000, 1),
        "timings_ms": report.timings_ms,
    }


def recovery_summary(runs: list[dict]) -> dict[str, dict]:
    """With a spare worker and without: each figure over the rounds (a round whose job
    did not recover counts in ``rounds``, not in ``recovered``)."""
    out = {}
    for name, spare in (("spare", True), ("new_worker", False)):
        mine = [r for r in runs if r["spare"] == spare]
        out[name] = {
            **{
                k: spread([r.get(k) for r in mine])
                for k in (
                    "first_output_s",
                    "caught_up_s",
                    "p99_back_s",
                    "replayed_s",
                    "detect_ms",
                    "restore_reads_bytes",
                    "steady_p99_ms",
                )
            },
            "timings_ms": {
                k: spread([r.get("timings_ms", {}).get(k) for r in mine])
                for k in ("halt", "place", "restore", "total")
            },
            "recovered": sum(r["status"] == "completed" for r in mine),
            "rounds": len(mine),
        }
    return out


# -- 3. exactly once -----------------------------------------------------------------------


async def exact_run(
    co: Coordinator, seen: Observed, state_mb: float, store: Path, out: Path
) -> dict:
    """The bounded run with a kill, against the reference (module docstring, step 3)."""
    params = {**padded_params(state_mb), "records": EXACT_SENTENCES, "rate": EXACT_RATE}
    workers = await keep_workers(co, 3)
    graph = with_sink(load_job(WORDCOUNT, params), Collect(str(out), mode="all"))
    job = await co.submit(graph, workers[:2], checkpoints=RECOVERY_POLICY)
    killed = True
    try:
        await kill_after_checkpoints(co, seen, job, EXACT_AT_CHECKPOINT)
    except RuntimeError:
        killed = False
    await job.wait(WAIT_S)
    written = Counter((w, n) for w, n in read_parts(out))
    counts = reference(params)
    expected = Counter((w, n) for w, c in counts.items() for n in range(1, c + 1))
    await finish(co, job, store)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "sentences": EXACT_SENTENCES,
        "rate_sentences_per_s": EXACT_RATE,
        "status": job.status,
        "killed": killed,
        "recoveries": len(seen.recoveries.get(job.id, [])),
        "records_written": sum(written.values()),
        "records_expected": sum(expected.values()),
        "missing": sum((expected - written).values()),
        "twice": sum((written - expected).values()),
    }


# -- a state size --------------------------------------------------------------------------


async def run_state_size(state_mb: float, rounds: int, seconds: float) -> dict:
    params = padded_params(state_mb)
    scratch = Path(tempfile.mkdtemp(prefix="streampilot-bench-recovery-"))
    store = scratch / "checkpoints"
    seen = Observed()
    config = RuntimeConfig(checkpoint_store=str(store))
    load_start = os.getloadavg()  # the VM is shared: how busy it was, 1, 5 and 15 minutes
    try:
        async with LocalCluster(3, config=config) as cluster:
            co = cluster.coordinator
            co.on_checkpoint, co.on_recovery = seen.checkpoint, seen.recovered
            workers = [w.id for w in co.alive_workers()][:2]  # the third is a spare
            max_words = await max_rate(co, params, workers)
            rate = max_words / 2 / WORDS
            print(f"  {state_mb:>5} MB  max {max_words:,.0f} words/s, running at half", flush=True)
            at = WARMUP_S + seconds
            two_phase = {
                **params,
                "rate": rate,
                "schedule": f"{at}:{rate}, {at}:{OVERDRIVE * rate * 2}",
            }
            overhead = []
            for i in range(rounds):
                runs = {}
                for name, policy in CONFIGS.items():
                    runs[name] = r = await overhead_run(
                        co, seen, two_phase, policy, workers, seconds, store
                    )
                    ratio = _ratio(r["max_words_per_s"], runs["none"]["max_words_per_s"])
                    print(
                        f"  {state_mb:>5} MB  round {i + 1} {name:<15} max {r['max_words_per_s']:>11,} "
                        f"words/s ({ratio}x)  p99 {r['latency_ms']['p99_ms']:7.1f} ms  "
                        f"{len(r['checkpoints'])} checkpoints",
                        flush=True,
                    )
                overhead.append(runs)
            recoveries = []
            for i in range(rounds):
                for spare in (True, False):
                    r = await recovery_run(
                        co, seen, {**params, "rate": rate}, spare, store, scratch / "arrivals"
                    )
                    recoveries.append(r)
                    print(
                        f"  {state_mb:>5} MB  round {i + 1} recovery {'spare' if spare else 'new worker':<10} "
                        f"first output {r['first_output_s']} s, caught up {r['caught_up_s']} s, "
                        f"p99 back {r['p99_back_s']} s; {r['timings_ms']}",
                        flush=True,
                    )
            exact = await exact_run(co, seen, state_mb, store, scratch / "out")
            print(f"  {state_mb:>5} MB  exactly once: {exact}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = overhead_summary(overhead, seconds)
    return {
        "state_mb_per_task": state_mb,
        "pad_bytes_per_word": params["state_bytes"],
        # What checkpoints written whole write: the state of the job's tasks.
        "state_bytes": summary["every_1s_whole"]["bytes_written"]["median"],
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "max_words_per_s": max_words,
        "rate_words_per_s": max_words / 2,
        "overhead": summary,
        "overhead_rounds": overhead,
        "recovery": recovery_summary(recoveries),
        "recovery_rounds": recoveries,
        "exactly_once": exact,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds",
        type=float,
        default=20.0,
        help="seconds at half rate, then as many unthrottled, per overhead run",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a try-out: --state-mb 1 --rounds 1 --seconds 5"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "recovery.json"))
    args = parser.parse_args()
    if args.quick:
        args.state_mb, args.rounds, args.seconds = [1], 1, 5.0
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sizes = [await run_state_size(mb, args.rounds, args.seconds) for mb in args.state_mb]
    write_report(
        args.out,
        "recovery",
        started,
        rounds=args.rounds,
        seconds=args.seconds,
        warmup_s=WARMUP_S,
        configs={k: asdict(p) if p else None for k, p in CONFIGS.items()},
        recovery_policy=asdict(RECOVERY_POLICY),
        kill_at_checkpoint=KILL_AT_CHECKPOINT,
        kill_after_s=KILL_AFTER_S,
        state_sizes=sizes,
    )


if __name__ == "__main__":
    asyncio.run(main())
