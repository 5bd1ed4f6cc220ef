"""Live reconfiguration against stop-and-restart, on the word count (issue: live reconfiguration).

For each per-task state size (``--state-mb``, default 1, 10, 100), a word count runs
unbounded on 2 of 3 local workers (the third is a spare, kept up between changes), with
every word carrying ``state_bytes`` of padding so that each count task holds about the
given size. The default rate is half of what that
padded job sustains unthrottled, measured first on the same workers (``--rate`` sets one
for every size). After a warm-up, each change is made live, then the same change (or its
mirror, which moves as much) with the stop-and-restart baseline, on the running workers
and on new worker processes, a few seconds apart:

- rebalance moving half the key groups (each count task gives half of its groups away);
- scale out 2 -> 4 and back in 4 -> 2 (count and its forward sink);
- migrate a task: count-0 with its forward sink to the spare worker, or back beside
  split-0 when it is on one (what a cluster keeps spare workers for: moving work off a
  busy or failing machine);
- migrate two count tasks with their forward sinks (each to the other's worker, so each
  worker keeps one count and its sink): both workers send and receive state at once;
- swap the count logic.

Live changes run in pause mode (every affected task pauses until its part is done; key
groups that leave for another worker are copied ahead while their task runs, and the
update ships what changed since, see ``runtime.precopy``), also without that copying
(``live_nocopy``, as before it existed), and,
for the rebalance, scale and migrate changes, in fluid mode: in one step (keyed tasks
that give or gain key groups do not pause; records of a moving group wait for its state)
and in steps in which no task gives or gains more than ``FLUID_BATCH`` key groups (a
migrating task hands its key groups to a stand-in on the target worker first): the
steps that only move key groups run as stages of one reconfiguration (``fluid``); with
``--with-steps`` also each as its own reconfiguration (``fluid_steps``, as before stages
existed), to compare.

For each: completion time and its phases, the longest pause, p99 and max latency of the
seconds from the change to 3 s after its end against the seconds before it, and the sink
throughput over the same window against the seconds before it. All the changes run
``--repeat`` rounds (default 3) on the same job; each row gives the median of its
rounds (and the range of the completion time), the rounds are kept in the JSON. Then the
sync time against the number of upstream tasks (1, 2, 4, 8) on a nearly idle pipeline.
Writes JSON to ``bench/results/reconfig.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import write_report
from controlplane.abstraction import AssignWorkload, Plan, migrate, scale, update_logic
from controlplane.coordinator import Coordinator, RunningJob, RuntimeConfig
from controlplane.coordinator import fluid as fluid_mode
from controlplane.coordinator.layouts import refresh_workers
from controlplane.coordinator.workers import start_workers
from controlplane.runner import LocalCluster
from runtime.dataflow import load_job
from runtime.metrics import LatencyHistogram, summarize_latency

WORDS = 8
KEYS = 10_000
WARMUP_S = 6.0
AFTER_S = 3.0  # the "after" window: the seconds following a change
BEFORE_S = 4.0  # the "before" window: steady seconds right before a change
RECOVER_S = 20.0  # at most this long to wait for latency to come back to steady state
SETTLE_RATE_TOLERANCE = 0.1  # a settled job's sink rate is within 10% of the steady one
MAX_RATE_S = 6.0  # seconds of unthrottled running to measure the padded job's maximum
CPU_S = 3  # seconds of steady running over which the processes' CPU is measured
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's unit
FLUID_BATCH = 4  # key groups each task gives or gains per step in fluid mode (of 128)
PRECOPY_MIN_BYTES = RuntimeConfig().precopy_min_bytes  # the default: 32 MB per task
PRECOPY_PAUSE_MS = RuntimeConfig().precopy_pause_ms  # the default
COPYING_AHEAD = ("live", "fluid_all")  # the modes that copy state ahead
LIVE_COMPARED = ("live", "live_nocopy", "fluid_all")  # the restarts' ratios are against these


def window(job: RunningJob, start: float, end: float) -> dict:
    """Latency and sink rate of the per-second reports made in (start, end].

    Each worker reports every second what happened since its last report, so the records
    reported in a window of a few seconds, over its length, are its sink rate.
    """
    hist = LatencyHistogram()
    records = 0
    for t, task, snap in job.metrics.samples:
        if not start < t <= end:
            continue
        if "latency" in snap:
            hist.merge(LatencyHistogram.from_dict(snap["latency"]))
        if job.metrics.operator_of.get(task) == "sink":
            records += snap.get("records_in", 0)
    return {"latency": summarize_latency(hist), "sink_rate": records / max(end - start, 1e-9)}


def halves(job: RunningJob) -> Plan:
    """Each count task gives the second half of its key groups to the next task."""
    a = job.abstraction
    tasks = a.operator("count").tasks
    keep = {t.id: list(t.workload.key_groups[: len(t.workload.key_groups) // 2]) for t in tasks}
    give = {t.id: list(t.workload.key_groups[len(t.workload.key_groups) // 2 :]) for t in tasks}
    ids = [t.id for t in tasks]
    new = {tid: keep[tid] + give[ids[i - 1]] for i, tid in enumerate(ids)}
    return Plan(a.version, (AssignWorkload("count", new),))


def pause_variants(rounds: list[tuple], pauses: list[float]) -> list[tuple]:
    """Each (change, how, builder) of ``rounds`` with the copy-ahead pause budget it runs
    with: with more than one budget, a mode that copies ahead runs once per budget, in turn,
    so that the budgets are compared in the same job: with the first under its own name,
    with the others as ``how@<budget>ms``. Consecutive changes in one mode run together per
    budget (scale out, then the scale in that undoes it), so that each finds what it
    changes."""
    out = []
    for how, together in itertools.groupby(rounds, key=lambda r: r[1]):
        changes = list(together)
        for p in pauses if how in COPYING_AHEAD else pauses[:1]:
            out += [(name, how_at(how, p, pauses), build, p) for name, _, build in changes]
    return out


def how_at(how: str, pause_ms: float, pauses: list[float]) -> str:
    """The name of ``how`` run with the copy-ahead pause budget ``pause_ms`` of ``pauses``."""
    return how if pause_ms == pauses[0] else f"{how}@{pause_ms:g}ms"


def steps(co: Coordinator) -> list[tuple[str, str, object]]:
    """(change, how, plan builder) in order; each builder sees the abstraction of its moment."""

    def to_standby(j: RunningJob) -> Plan:
        """Migrate count-0 with its forward sink to a spare worker (one the job does not
        use, as a cluster keeps for moving work off a busy or failing machine, see
        :func:`spare_worker`), or, when count-0 is on one, back beside split-0 (which
        never moves): either way one task's state moves to a worker with room for it."""
        a = refresh_workers(j.abstraction, co.alive_workers(), "local")
        here = a.task("count-0").resources.worker
        home = a.task("split-0").resources.worker
        if here != home:
            return migrate(a, "count-0", home, with_forward=True)
        return migrate(a, "count-0", unused_workers(co, j)[0], with_forward=True)

    def swap_workers(j: RunningJob) -> Plan:
        """Migrate count-0 and count-1, each with its forward sink, to each other's worker
        (a count task and its sink stay together, as Flink's chaining would keep them)."""
        a = j.abstraction
        w0, w1 = a.task("count-0").resources.worker, a.task("count-1").resources.worker
        first = migrate(a, "count-0", w1, with_forward=True)
        second = migrate(a, "count-1", w0, with_forward=True)
        return Plan(a.version, tuple(first.ops) + tuple(second.ops))

    def logic(j: RunningJob) -> Plan:
        a = j.abstraction
        current = a.operator("count").tasks[0].logic.ref
        ref = "examples.wordcount:count_word_v2"
        return update_logic(
            a, "count", ref if current != ref else "examples.wordcount:count_word_v3"
        )

    def to(n: int):
        return lambda j: scale(j.abstraction, "count", n)

    def fluid(build, batch_size=FLUID_BATCH):
        return lambda j: replace(build(j), mode="fluid", batch_size=batch_size)

    return [
        ("rebalance half the key groups", "live", halves),
        ("rebalance half the key groups", "live_nocopy", halves),
        ("rebalance half the key groups", "fluid_all", fluid(halves, None)),
        ("rebalance half the key groups", "fluid", fluid(halves)),
        ("rebalance half the key groups", "fluid_steps", fluid(halves)),
        ("rebalance half the key groups", "restart", halves),
        ("rebalance half the key groups", "restart_new", halves),
        ("scale out 2 -> 4", "live", to(4)),
        ("scale in 4 -> 2", "live", to(2)),
        ("scale out 2 -> 4", "live_nocopy", to(4)),
        ("scale in 4 -> 2", "live_nocopy", to(2)),
        ("scale out 2 -> 4", "fluid_all", fluid(to(4), None)),
        ("scale in 4 -> 2", "fluid_all", fluid(to(2), None)),
        ("scale out 2 -> 4", "fluid", fluid(to(4))),
        ("scale in 4 -> 2", "fluid", fluid(to(2))),
        ("scale out 2 -> 4", "fluid_steps", fluid(to(4))),
        ("scale in 4 -> 2", "fluid_steps", fluid(to(2))),
        ("scale out 2 -> 4", "restart", to(4)),
        ("scale in 4 -> 2", "restart", to(2)),
        ("scale out 2 -> 4", "restart_new", to(4)),
        ("scale in 4 -> 2", "restart_new", to(2)),
        ("migrate a task (to a standby worker)", "live", to_standby),
        ("migrate a task (to a standby worker)", "live_nocopy", to_standby),
        ("migrate a task (to a standby worker)", "fluid_all", fluid(to_standby, None)),
        ("migrate a task (to a standby worker)", "fluid", fluid(to_standby)),
        ("migrate a task (to a standby worker)", "fluid_steps", fluid(to_standby)),
        ("migrate a task (to a standby worker)", "restart", to_standby),
        ("migrate a task (to a standby worker)", "restart_new", to_standby),
        ("migrate two tasks (swap workers)", "live", swap_workers),
        ("migrate two tasks (swap workers)", "live_nocopy", swap_workers),
        ("migrate two tasks (swap workers)", "fluid_all", fluid(swap_workers, None)),
        ("migrate two tasks (swap workers)", "fluid", fluid(swap_workers)),
        ("migrate two tasks (swap workers)", "fluid_steps", fluid(swap_workers)),
        ("migrate two tasks (swap workers)", "restart", swap_workers),
        ("migrate two tasks (swap workers)", "restart_new", swap_workers),
        ("swap logic", "live", logic),
        ("swap logic", "restart", logic),
        ("swap logic", "restart_new", logic),
    ]


def unused_workers(co: Coordinator, job: RunningJob) -> list[str]:
    """The alive workers that host none of ``job``'s tasks."""
    used = set(job.layout.workers_used())
    return [w.id for w in co.alive_workers() if w.id not in used]


async def spare_worker(co: Coordinator, job: RunningJob) -> None:
    """Make sure a worker the job does not use is up (a restart on new workers retires
    the spare the job moved to), started before the change is timed."""
    if not unused_workers(co, job):
        await start_workers(co, 1, "the benchmark keeps a spare worker")


async def steady_cpu(co: Coordinator, seconds: int = CPU_S) -> dict[str, float]:
    """Percent of one core each worker used (as it reports every second), averaged over
    ``seconds`` of the running job, and this process's (the coordinator and the
    benchmark's driver) over the same seconds: what the job leaves of the machine's
    cores for moving state."""
    me = psutil.Process()
    me.cpu_percent()
    seen: dict[str, list[float]] = {}
    for _ in range(seconds):
        await asyncio.sleep(1.0)
        for w in co.alive_workers():
            seen.setdefault(w.id, []).append(w.cpu_percent)
    used = {w: round(statistics.mean(v), 1) for w, v in sorted(seen.items())}
    used["control_plane"] = round(me.cpu_percent(), 1)
    return used


def process_usage(co: Coordinator) -> dict[str, tuple[float, int]]:
    """(CPU seconds, minor page faults) each live worker process has used so far, read
    from ``/proc`` (Linux; empty elsewhere), and this process's (``control_plane``)."""
    pids = {w.id: w.pid for w in co.alive_workers()}
    pids["control_plane"] = os.getpid()
    usage = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # After the command: state is field 3, minflt 10, utime 14 and stime 15 (ticks).
        ticks = int(fields[11]) + int(fields[12])
        usage[name] = (ticks / CLOCK_TICKS, int(fields[7]))
    return usage


def machine_since(before: tuple) -> dict[str, float]:
    """What the machine's CPUs did since ``before`` (``psutil.cpu_times()``), in ms summed
    over the CPUs: ``busy`` (user and system), ``idle``, and ``steal`` (the hypervisor ran
    something else while this VM wanted a CPU; Linux guests only: a slow round with steal
    is the machine's, not the change's)."""
    now = psutil.cpu_times()

    def ms(*fields: str) -> float:
        return round(sum(getattr(now, f, 0.0) - getattr(before, f, 0.0) for f in fields) * 1e3, 1)

    return {"busy_ms": ms("user", "system"), "idle_ms": ms("idle"), "steal_ms": ms("steal")}


def usage_since(before: dict[str, tuple[float, int]], co: Coordinator) -> dict[str, dict]:
    """Each process's CPU (ms, at the kernel's tick granularity) and minor page faults
    since ``before`` (from :func:`process_usage`), for the processes alive at both ends
    (a restart's new workers are left out)."""
    now = process_usage(co)
    return {
        name: {
            "cpu_ms": round((now[name][0] - cpu) * 1000, 1),
            "page_faults": now[name][1] - faults,
        }
        for name, (cpu, faults) in before.items()
        if name in now
    }


async def max_rate(co, params: dict, workers: list[str]) -> float:
    """Words/s the job sustains unthrottled: the median of per-second sink rates over
    MAX_RATE_S seconds after a warm-up (the job is stopped after)."""
    job = await co.submit(load_job("examples.wordcount:build", {**params, "rate": 0}), workers)
    await asyncio.sleep(WARMUP_S)
    t0 = time.time()
    await asyncio.sleep(MAX_RATE_S + 1.1)
    rates = [window(job, t0 + i, t0 + i + 1)["sink_rate"] for i in range(int(MAX_RATE_S))]
    await co.stop_job(job.id)
    return statistics.median(rates)


def _way_back(only: list[str]) -> list[str]:
    """The changes that undo those ``only`` selects, which run with them so that each
    round starts from the same job (a scale out without its scale in would be no change
    the second time)."""
    return [o.replace("scale out 2 -> 4", "scale in 4 -> 2") for o in only if "scale out" in o]


def padded_params(state_mb: float) -> dict:
    """The padded word count's parameters, unbounded and unthrottled (``rate`` is the
    caller's): every word carries padding so that each of the 2 count tasks holds about
    ``state_mb`` MB of state once every word has come."""
    pad = int(state_mb * 2**20 / (KEYS / 2))  # two count tasks share the 10,000 words
    return {"records": 0, "keys": KEYS, "zipf": 1.0, "parallelism": 2, "state_bytes": pad}


async def run_state_size(
    state_mb: float,
    rate_words: float | None,
    only: list[str] | None = None,
    repeat: int = 1,
    with_steps: bool = False,
    pauses: list[float] | None = None,
    reserve_mb: int = 0,
) -> dict:
    params = padded_params(state_mb)
    pad = params["state_bytes"]
    entries: dict[str, dict] = {}
    async with LocalCluster(3, worker_reserve_mb=reserve_mb) as cluster:
        co = cluster.coordinator
        config = co.config
        workers = [w.id for w in co.alive_workers()][:2]  # the third is a spare
        max_words = None
        if rate_words is None:
            max_words = await max_rate(co, params, workers)
            rate_words = max_words / 2
            print(f"  {state_mb:>5} MB  max {max_words:,.0f} words/s, running at half", flush=True)
        params["rate"] = rate_words / WORDS
        job = await co.submit(load_job("examples.wordcount:build", params), workers)
        await asyncio.sleep(WARMUP_S)
        steady = window(job, time.time() - 3.0, time.time())
        steady_p99, steady_rate = steady["latency"]["p99_ms"], steady["sink_rate"]
        cpu = await steady_cpu(co)
        print(f"  {state_mb:>5} MB  steady CPU (% of one core): {cpu}", flush=True)
        samples: dict[tuple[str, str], list[dict]] = {}
        rounds = [step for _ in range(repeat) for step in steps(co)]
        budgets = pauses or [PRECOPY_PAUSE_MS]
        if state_mb * 2**20 < PRECOPY_MIN_BYTES:  # no task holds enough to copy ahead
            budgets = budgets[:1]  # so the other budgets would run the same protocol again
        for name, how, build, pause_ms in pause_variants(rounds, budgets):
            if only and not any(o in f"{name} / {how}" for o in only + _way_back(only)):
                continue
            if how == "fluid_steps" and not with_steps:
                continue
            await spare_worker(co, job)
            plan = build(job)
            if not plan.ops:  # e.g. a swap of two tasks that an earlier change put together
                print(f"  {state_mb:>5} MB  {name:<30} {how:<11} skipped: nothing to change")
                continue
            before = window(job, time.time() - BEFORE_S, time.time())
            usage0, machine0 = process_usage(co), psutil.cpu_times()
            t0 = time.time()
            fluid_mode.JOIN_STAGES = how != "fluid_steps"  # each step its own run, to compare
            co.config = replace(
                config,
                precopy_min_bytes=None if how == "live_nocopy" else PRECOPY_MIN_BYTES,
                precopy_pause_ms=pause_ms,
            )
            rec = await co.apply_plan(
                job.id,
                plan,
                restart=how.startswith("restart"),
                new_workers=(how == "restart_new"),
            )
            t1 = time.time()  # the change is complete: the window runs AFTER_S past it
            usage, machine = usage_since(usage0, co), machine_since(machine0)
            await asyncio.sleep(AFTER_S + 1.1)
            after = window(job, t0, t1 + AFTER_S)
            recovered = await recover(job, steady_p99)
            settled = await settle(job, steady_p99, steady_rate)  # the next "before" is steady
            samples.setdefault((name, how), []).append(
                {
                    "status": rec.status,
                    "error": rec.error,
                    "timings_ms": rec.timings_ms,
                    "max_pause_ms": max(rec.pause_ms.values(), default=0.0),
                    "steps": rec.steps,
                    "runs": rec.runs,
                    "stage_ms": rec.stage_ms,
                    "precopied_bytes": sum(c["bytes"] for c in rec.precopied.values()),
                    "precopy_pause_ms": pause_ms,
                    "precopied": rec.precopied,
                    "affected_tasks": len(rec.affected),
                    # What each process spent from the plan's submission to its end.
                    "usage_during_change": usage,
                    "machine_during_change": machine,
                    "latency_before_ms": before["latency"],
                    "latency_after_ms": after["latency"],
                    "p99_ratio": _ratio(after["latency"]["p99_ms"], before["latency"]["p99_ms"]),
                    # Against the run's steady p99, set once all the changes have run
                    # (see steady_before_changes).
                    "p99_over_steady": None,
                    "throughput_ratio": _ratio(after["sink_rate"], before["sink_rate"]),
                    "recovered_after_s": recovered,
                    "settled_after_s": settled,
                    # Above 1: the change started while the job was still catching up.
                    "rate_before_over_steady": _ratio(before["sink_rate"], steady_rate),
                }
            )
            print(
                f"  {state_mb:>5} MB  {name:<30} {how:<11} {rec.status:<9} "
                f"total {rec.timings_ms.get('total', 0):8.1f} ms  "
                f"p99 {before['latency']['p99_ms']:.1f} -> {after['latency']['p99_ms']:.1f} ms  "
                f"max {after['latency']['max_ms']:.1f} ms",
                flush=True,
            )
        summary = job.summary()
        await co.stop_job(job.id)
    steady_before = steady_before_changes([r for runs in samples.values() for r in runs])
    for (name, how), runs in samples.items():
        entries.setdefault(name, {"change": name})[how] = {**median_of(runs), "samples": runs}
    for entry in entries.values():
        for baseline in ("restart", "restart_new"):
            base = entry.get(baseline)
            for how in [h for h in entry if h.partition("@")[0] in LIVE_COMPARED] if base else ():
                live = entry[how]
                entry[f"{baseline}_over_{how}"] = {
                    "completion": _ratio(
                        base["timings_ms"].get("total", 0), live["timings_ms"].get("total", 0)
                    ),
                    "peak_latency": _ratio(
                        base["latency_after_ms"]["max_ms"], live["latency_after_ms"]["max_ms"]
                    ),
                }
    return {
        "state_mb_per_task": state_mb,
        "pad_bytes_per_word": pad,
        "worker_reserve_mb": reserve_mb,
        "rate_words_per_s": rate_words,
        "max_words_per_s": max_words,
        "steady_p99_ms": steady_p99,
        "steady_p99_before_changes_ms": steady_before,
        "steady_sink_rate": steady_rate,
        "steady_cpu_percent": cpu,
        "cpu_count": psutil.cpu_count(),
        "changes": list(entries.values()),
        "job": summary,
    }


def steady_before_changes(samples: list[dict]) -> float | None:
    """The run's steady p99: the median of the p99s of the BEFORE_S windows before its
    changes (each taken once the job settled, see :func:`settle`), and each sample's
    ``p99_over_steady`` against it. Robust to a slow moment, where the p99 of the seconds
    after the warm-up is one moment's (at 100 MB it has been 3.7x the median of the
    windows before), and the same yardstick for every change of the run."""
    before = [r["latency_before_ms"]["p99_ms"] for r in samples if r["latency_before_ms"]["count"]]
    if not before:
        return None
    steady = statistics.median(before)
    for r in samples:
        r["p99_over_steady"] = _ratio(r["latency_after_ms"]["p99_ms"], steady)
    return steady


def median_of(runs: list[dict]) -> dict:
    """One row for the repetitions of a change: each figure the median of its runs (the
    completion time also its range); the status says how many completed."""

    def med(get) -> float | None:
        values = [v for v in (get(r) for r in runs) if v is not None]
        return round(statistics.median(values), 3) if values else None

    first = runs[0]
    completed = sum(r["status"] == "completed" for r in runs)
    totals = [r["timings_ms"].get("total", 0.0) for r in runs]
    return {
        "status": "completed"
        if completed == len(runs)
        else f"{completed} of {len(runs)} completed",
        "error": next((r["error"] for r in runs if r["error"]), None),
        "repeats": len(runs),
        "timings_ms": {
            k: med(lambda r, k=k: r["timings_ms"].get(k))
            for k in dict.fromkeys(k for r in runs for k in r["timings_ms"])
        },
        "total_ms_range": [min(totals), max(totals)],
        "max_pause_ms": med(lambda r: r["max_pause_ms"]),
        "precopied_bytes": med(lambda r: r.get("precopied_bytes")),
        "steps": first["steps"],
        "runs": first["runs"],
        "affected_tasks": first["affected_tasks"],
        **{
            side: {k: med(lambda r, k=k, side=side: r[side][k]) for k in first[side]}
            for side in ("latency_before_ms", "latency_after_ms")
        },
        "p99_ratio": med(lambda r: r["p99_ratio"]),
        "p99_over_steady": med(lambda r: r.get("p99_over_steady")),
        "throughput_ratio": med(lambda r: r["throughput_ratio"]),
        "recovered_after_s": med(lambda r: r["recovered_after_s"]),
    }


async def recover(job: RunningJob, steady_p99: float) -> float | None:
    """Wait until a whole second's p99 is back within 2x of steady (or RECOVER_S passed);
    returns how long after now that took, or None if it did not recover."""
    t0 = time.time()
    while time.time() - t0 < RECOVER_S:
        await asyncio.sleep(1.0)
        last = window(job, time.time() - 1.05, time.time())["latency"]
        if last["count"] and last["p99_ms"] <= 2 * max(steady_p99, 5.0):
            return round(time.time() - t0, 1)
    return None


async def settle(job: RunningJob, steady_p99: float, steady_rate: float) -> float | None:
    """Wait at least BEFORE_S, and until the last BEFORE_S seconds look steady (at most
    RECOVER_S more): their p99 within 2x of steady and their sink rate within
    SETTLE_RATE_TOLERANCE of the steady rate. The next change's "before" window is then
    steady, and its workers have caught up: a job still working off the backlog of a
    restart runs faster than its sources' rate, its p99 possibly already low, and a copy
    ahead started then finds no idle moments. Returns how long it waited, or None if the
    job did not settle."""
    t0 = time.time()
    await asyncio.sleep(BEFORE_S)
    while time.time() - t0 < BEFORE_S + RECOVER_S:
        last = window(job, time.time() - BEFORE_S, time.time())
        p99_ok = last["latency"]["count"] and last["latency"]["p99_ms"] <= 2 * max(steady_p99, 5.0)
        rate_off = abs(last["sink_rate"] / max(steady_rate, 1e-9) - 1.0)
        if p99_ok and rate_off <= SETTLE_RATE_TOLERANCE:
            return round(time.time() - t0, 1)
        await asyncio.sleep(1.0)
    return None


async def sync_vs_upstream(counts: list[int]) -> list[dict]:
    """Sync time of a small rebalance with 1..8 upstream (split) tasks, nearly idle pipeline."""
    out = []
    for n in counts:
        params = {"records": 0, "rate": 2_000, "keys": 1_000, "zipf": 1.0, "parallelism": n}
        async with LocalCluster(2) as cluster:
            co = cluster.coordinator
            job = await co.submit(load_job("examples.wordcount:build", params))
            if n != 2:  # parallelism n for sources and split; count and sink back to 2
                rec = await co.apply_plan(job.id, scale(job.abstraction, "count", 2))
                if rec.status != "completed":
                    raise RuntimeError(f"scaling count to 2 failed: {rec.error}")
            await asyncio.sleep(2.0)
            syncs = []
            for _ in range(7):
                rec = await co.apply_plan(job.id, halves(job))
                syncs.append(rec.timings_ms["sync"])
                await asyncio.sleep(0.3)
            await co.stop_job(job.id)
        out.append(
            {
                "upstream_tasks": n,
                "sync_ms_median": round(statistics.median(syncs), 3),
                "sync_ms_max": round(max(syncs), 3),
                "sync_ms": syncs,
            }
        )
        print(
            f"  upstream {n}: sync median {statistics.median(syncs):.2f} ms, max {max(syncs):.2f} ms",
            flush=True,
        )
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="words/s (default: half the maximum the padded job sustains, measured first)",
    )
    parser.add_argument("--state-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--upstream", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument(
        "--only",
        nargs="+",
        help="run only the changes whose 'change / how' contains one of these (e.g. 'migrate')",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of all the changes (each row: the median of its rounds)",
    )
    parser.add_argument(
        "--with-steps",
        action="store_true",
        help="also run each batched fluid change with a live reconfiguration per step",
    )
    parser.add_argument(
        "--precopy-pause-ms",
        type=float,
        nargs="+",
        default=[PRECOPY_PAUSE_MS],
        help=(
            "copy-ahead pause budget (RuntimeConfig.precopy_pause_ms); with several, each mode "
            "that copies ahead runs once per budget in every round: with the first under its "
            "own name, with the others as how@<budget>ms (only the first at state sizes "
            "below the copy-ahead threshold, where nothing is copied ahead)"
        ),
    )
    parser.add_argument(
        "--reserve-mb",
        type=int,
        default=0,
        help="each worker's memory reserve (--reserve-mb of runtime.worker; see runtime.heap), "
        "the restart's new workers' too",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "reconfig.json"))
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sizes = []
    for mb in args.state_mb:
        sizes.append(
            await run_state_size(
                mb,
                args.rate,
                args.only,
                args.repeat,
                args.with_steps,
                args.precopy_pause_ms,
                args.reserve_mb,
            )
        )
    sync = await sync_vs_upstream(args.upstream)
    write_report(
        args.out, "reconfig", started, linger_ms=5.0, state_sizes=sizes, sync_vs_upstream=sync
    )


if __name__ == "__main__":
    asyncio.run(main())
