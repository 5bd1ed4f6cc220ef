"""Render BENCHMARKS.md from the JSON results in bench/results/ (figures are never typed in).

Run after the benchmarks: ``.venv/bin/python bench/report.py``. The page is short: the
setup, one table per question, the verdicts computed from the rows, and how to re-run
each benchmark. What a result file holds beyond that (every round, every way of making a
change, the ``notes`` a run was annotated with) stays in the file, and git keeps the
history of earlier runs; notes are not rendered. The few notes the page has are written
here, each a sentence or three, with their figures read from the results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).parent
RESULTS = HERE / "results"
PAGE = HERE.parent / "BENCHMARKS.md"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(x: object, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.1f}{unit}"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    return f"{x}{unit}"


def _day(date: str) -> str:
    """The day of an ISO timestamp (``2026-11-26T08:43:01Z`` -> ``2026-11-26``)."""
    return date.partition("T")[0]


def _rerun(command: str) -> str:
    return f"Re-run: `{command.strip()}`."


# The runtime's targets for the word count.
TARGET_WORDS_PER_S = 400_000
TARGET_P99_MS = 50.0


def throughput_section(d: dict) -> list[str]:
    peak, half = d["max_throughput"], d["latency_at_half"]
    lat = half["latency_ms"]
    return [
        "## Throughput and latency of the runtime",
        "",
        f"Word count on {d['workers']} local workers, batches of {d['config']['batch_size']} "
        f"records or {d['config']['linger_s'] * 1000:g} ms; Zipf {d['workload']['zipf']} over "
        f"{d['workload']['keys']:,} words, {d['workload']['words_per_sentence']} words per "
        f"sentence. Latency at half the maximum rate. {_rerun(d['command'])}",
        "",
        "| measure | result | target |",
        "|---|---|---|",
        f"| max sustained throughput (median of per-second rates) | "
        f"{fmt(peak['steady_words_per_s'])} words/s | >= {TARGET_WORDS_PER_S:,} words/s |",
        f"| overall rate of the bounded run ({fmt(peak['words'])} words) | "
        f"{fmt(peak['overall_words_per_s'])} words/s | |",
        f"| p50 latency at {fmt(half['measured_words_per_s'])} words/s | {fmt(lat['p50_ms'])} ms | |",
        f"| p99 latency at that rate | {fmt(lat['p99_ms'])} ms | < {TARGET_P99_MS:g} ms |",
        f"| max latency at that rate | {fmt(lat['max_ms'])} ms | |",
        "",
    ]


# The ways a change is made, in the order the benchmark makes them.
HOWS = ("live", "live_nocopy", "fluid_all", "fluid", "fluid_steps", "restart", "restart_new")


def _runs(n: int) -> str:
    return "1 run" if n == 1 else f"{n} runs"


def _label(how: str, r: dict) -> str:
    """How a change was made, in words: the mode, and for ``mode@<n>ms`` the copy-ahead
    pause budget it ran with."""
    mode, _, budget = how.partition("@")
    label = {
        "live": "pause",
        "live_nocopy": "pause, no copy ahead",
        "fluid_all": "fluid, 1 step" if r["steps"] == 1 else f"fluid, all ({r['steps']} steps)",
        "fluid": f"fluid, {r['steps']} steps in {_runs(r.get('runs', r['steps']))}",
        "fluid_steps": f"fluid, {r['steps']} steps, a run each",
        "restart_new": "restart, new workers",
    }.get(mode, mode)
    return f"{label}, copying ahead to a {budget.removesuffix('ms')} ms pause" if budget else label


# The targets for a live change against the stop-and-restart on new workers.
TARGET_RATIO = 10.0  # the baseline at least 10x worse in completion time and peak latency
TARGET_P99 = 3.0  # p99 during a change under 3x steady
# Changes the benchmark makes beyond the list the targets were set for (rebalance, scale
# out and back, migrate a task, swap logic): judged the same way, and said to be extra.
EXTRA_CHANGES = ("migrate two tasks (swap workers)",)


class Judged(NamedTuple):
    """One live way of making a change, against the restart on new workers of its run."""

    how: str
    completion: float  # the restart's completion time over this way's
    peak: float  # the restart's peak latency over this way's
    p99: float  # p99 during the change over the run's steady p99
    met: bool  # all three targets


def _judged(c: dict) -> list[Judged]:
    """Each live way a change was made, judged from the medians of its rounds."""
    base = c.get("restart_new")
    if not base or base.get("status") != "completed":
        return []
    judged = []
    for how, r in c.items():
        if not isinstance(r, dict) or "timings_ms" not in r or how.startswith("restart"):
            continue
        total, peak = r["timings_ms"].get("total"), r["latency_after_ms"]["max_ms"]
        p99 = r.get("p99_over_steady")
        if r["status"] != "completed" or not total or not peak or p99 is None:
            continue
        completion = base["timings_ms"]["total"] / total
        peak_ratio = base["latency_after_ms"]["max_ms"] / peak
        met = completion >= TARGET_RATIO and peak_ratio >= TARGET_RATIO and p99 < TARGET_P99
        judged.append(Judged(how, completion, peak_ratio, p99, met))
    return judged


VERDICT_COLUMNS = (
    "change",
    "met",
    "best way",
    "total ms [range]",
    "longest pause ms",
    "restart, new workers: total ms / max latency ms",
    "completion",
    "peak latency",
    "p99 / steady",
    "ways that met",
)


def _best(c: dict) -> Judged | None:
    """The way of making a change that met every target with the most to spare in
    completion time, else the fastest that kept p99 under its bound, else the fastest."""
    judged = _judged(c)
    if not judged:
        return None
    met = [j for j in judged if j.met]
    bounded = [j for j in judged if j.p99 < TARGET_P99]
    return max(met or bounded or judged, key=lambda j: j.completion)


def verdicts(size: dict) -> list[str]:
    """A size's verdict table, computed from its rows: per change, the best way of making
    it (:func:`_best`), its figures, the restart's, the ratios and whether all three
    targets were met. Changes without a completed restart on new workers are left out."""
    out = [
        "| " + " | ".join(VERDICT_COLUMNS) + " |",
        "|" + "---|" * len(VERDICT_COLUMNS),
    ]
    for c in size["changes"]:
        best = _best(c)
        if best is None:
            continue
        r, base = c[best.how], c["restart_new"]
        span = r.get("total_ms_range")
        total = fmt(r["timings_ms"]["total"]) + (
            f" [{fmt(span[0])}-{fmt(span[1])}]" if span and r.get("repeats", 1) > 1 else ""
        )
        extra = " (extra)" if c["change"] in EXTRA_CHANGES else ""
        cells = (
            f"{c['change']}{extra}",
            "yes" if best.met else "no",
            _label(best.how, r),
            total,
            fmt(r.get("max_pause_ms")),
            f"{fmt(base['timings_ms']['total'])} / {fmt(base['latency_after_ms']['max_ms'])}",
            f"{best.completion:,.1f}x",
            f"{best.peak:,.1f}x",
            f"{best.p99:,.1f}x",
            f"{sum(j.met for j in _judged(c))} of {len(_judged(c))}",
        )
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def _missed(size: dict) -> list[str]:
    """The changes of a size for which no way met every target."""
    return [c["change"] for c in size["changes"] if (b := _best(c)) is not None and not b.met]


def _apart(size: dict) -> str:
    """For a size run apart from the rest: its date and command, read from its ``run``."""
    run = size.get("run", "")
    commands = re.findall(r"`([^`]+)`", run)
    date = re.search(r"\d{4}-\d\d-\d\dT", run)
    if not commands:
        return ""
    when = f" on {date.group(0)[:-1]}" if date else ""
    return f" Run apart{when}: `{commands[-1]}`."


def _rounds(size: dict) -> int:
    return max(
        (r.get("repeats", 1) for c in size["changes"] for r in c.values() if isinstance(r, dict)),
        default=1,
    )


def _cpu(size: dict) -> float | None:
    usage = size.get("steady_cpu_percent")
    return round(sum(usage.values())) if usage else None


def _size_section(
    size: dict, again: bool, shipping: dict | None, met_elsewhere: set[str]
) -> list[str]:
    mb = size["state_mb_per_task"]
    rounds = _rounds(size)
    steady = size.get("steady_p99_before_changes_ms") or size.get("steady_p99_ms")
    cpu = _cpu(size)
    out = [
        f"### {mb:g} MB of state per count task{', run again' if again else ''}",
        "",
        f"{fmt(round(size['rate_words_per_s']))} words/s"
        + (
            f" (half the {fmt(round(size['max_words_per_s']))} measured first)"
            if size.get("max_words_per_s")
            else ""
        )
        + f", {'1 round' if rounds == 1 else f'medians of {rounds} rounds'}"
        + (f", steady p99 {fmt(steady)} ms" if steady else "")
        + (
            f", the processes at {fmt(cpu)}% of the {size['cpu_count'] * 100}% of "
            f"{size['cpu_count']} cores at steady state"
            if cpu is not None
            else ""
        )
        + f".{_apart(size)}",
        "",
        *verdicts(size),
    ]
    missed = [
        f"{c} (met in the other run of this size)" if c in met_elsewhere else c
        for c in _missed(size)
    ]
    if missed and shipping and shipping["mb"] == mb and cpu is not None:
        v = shipping["variants"].get("default") or next(iter(shipping["variants"].values()))
        out += [
            f"Missed: {', '.join(missed)}. Shipping {mb:g} MB costs the sender "
            f"{fmt(v['sender_cpu_ms'])} ms and the receiver {fmt(v['receiver_cpu_ms'])} ms of "
            f"CPU with nothing else running (state shipping below), and the job already used "
            f"{fmt(cpu)}% of {size['cpu_count'] * 100}%: these moves are bound by the CPU the "
            "job leaves ([design](docs/design.md#pre-copy-copy-ahead)).",
            "",
        ]
    elif missed:
        out += [f"Missed: {', '.join(missed)}.", ""]
    return out


def reconfig_section(d: dict, shipping: dict | None = None) -> list[str]:
    out = [
        "## Live reconfiguration against stop-and-restart",
        "",
        "Word count on 2 of 3 local workers (the third an idle spare), every word padded so "
        "that each count task holds the state in the heading, at half the rate the padded "
        "job sustained. Each change is made every way below, then stopped and restarted on "
        "new worker processes, in the same job. Latency is measured from the start of a "
        "change to 3 s after it ends; steady p99 is the median p99 of the windows before "
        f"the changes. {_rerun(d['command'])}",
        "",
        "- **pause**: affected tasks pause until their part is done; key groups leaving for "
        "another worker (32 MB or more of them) are first copied ahead while the job runs.",
        "- **pause, no copy ahead**: the same without copying ahead.",
        "- **fluid, 1 step**: tasks that only give or gain key groups run on; records of a "
        "moving group wait for its state.",
        "- **fluid, n steps in k runs**: the plan in steps of a few key groups, run as stages "
        "of k reconfigurations (**a run each**: every step a reconfiguration of its own).",
        "- **copying ahead to a 20 ms pause**: with a copy-ahead pause budget.",
        "- **restart, new workers**: savepoint to local disk, stop, redeploy on new worker "
        "processes (Python, no JVM start: an optimistic baseline).",
        "",
        f"**Targets:** the restart at least {TARGET_RATIO:g}x slower in completion time and in "
        f"peak latency, with p99 during the change under {TARGET_P99:g}x steady. Each table "
        "names, per change, the way that met them with the most to spare (else the fastest "
        "within the p99 bound); the ratios are of medians.",
        "",
    ]
    seen: set[float] = set()
    for size in d["state_sizes"]:
        mb = size["state_mb_per_task"]
        met_elsewhere = {
            c["change"]
            for other in d["state_sizes"]
            if other is not size and other["state_mb_per_task"] == mb
            for c in other["changes"]
            if (b := _best(c)) is not None and b.met
        }
        out += _size_section(size, mb in seen, shipping, met_elsewhere)
        seen.add(mb)
    out += [
        "### Sync time against the number of upstream tasks",
        "",
        f"A rebalance of the count operator on a nearly idle pipeline, "
        f"{len(d['sync_vs_upstream'][0]['sync_ms'])} times each; linger {d['linger_ms']:g} ms.",
        "",
        "| upstream (split) tasks | sync median ms | sync max ms |",
        "|---|---|---|",
        *(
            f"| {s['upstream_tasks']} | {fmt(s['sync_ms_median'])} | {fmt(s['sync_ms_max'])} |"
            for s in d["sync_vs_upstream"]
        ),
        "",
    ]
    return out


def state_transfer_section(d: dict) -> list[str]:
    out = [
        "## State shipping: CPU on each end",
        "",
        f"A sender process copies {fmt(d['mb'])} MB of word-count state (64 key groups) "
        "ahead to a receiver process through the workers' code, with nothing else running; "
        "medians of the rounds. `no pool` is the receiver without its reused buffers, "
        f"which faults in every payload's memory afresh. {_rerun(d['command'])}",
        "",
        "| variant | sender CPU ms (system) | receiver CPU ms (system) | receiver page faults "
        "| first byte to last group read ms |",
        "|---|---|---|---|---|",
    ]
    for name, v in d["variants"].items():
        out.append(
            f"| {name} | {fmt(v['sender_cpu_ms'])} ({fmt(v['sender_sys_ms'])}) "
            f"| {fmt(v['receiver_cpu_ms'])} ({fmt(v['receiver_sys_ms'])}) "
            f"| {fmt(v['receiver_page_faults'])} | {fmt(v['wall_ms'])} |"
        )
    return [*out, ""]


def fork_copy_section(d: dict) -> list[str]:
    out = [
        "## Copying state ahead: on the worker's thread or from a forked child",
        "",
        f"One process holds {fmt(d['state_mb'])} MB of word-count state and applies "
        f"{fmt(d['updates'])} records to it while every key group is copied and written to a "
        "socket: not at all, on its own thread between records (as the workers do), or by a "
        "child forked first. Medians of the rounds; the copy's CPU is the parent's over "
        "`none`. A forked copy was tried end to end in the workers and did not shorten "
        f"changes, so it was left out. {_rerun(d['command'])}",
        "",
        "| variant | parent CPU ms | of it, the copy's | parent page faults | fork ms | wall ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in d["medians"].items():
        out.append(
            f"| {name} | {fmt(v['parent_cpu_ms'])} | {fmt(v['copy_cpu_ms_on_parent'])} "
            f"| {fmt(v['parent_page_faults'])} | {fmt(v['fork_ms'])} | {fmt(v['wall_ms'])} |"
        )
    return [*out, ""]


# The overhead targets, by configuration: the throughput at least this share of the run
# without checkpoints of the same round, p99 at most this many times its.
OVERHEAD_TARGETS = {"every_10s": (0.95, 1.5), "every_1s": (0.85, 2.0)}
BEHIND_P50_MS = 100.0  # p50 above this without checkpoints: the job fell behind its rate
CHECKPOINT_CONFIGS = {
    "none": "none",
    "every_10s": "every 10 s",
    "every_1s": "every 1 s",
    "every_1s_whole": "every 1 s, written whole",
}
RECOVERY_MODES = {"spare": "the spare worker", "new_worker": "a new worker process"}


def recovery_target_s(state_mb: float, mode: str) -> float | None:
    """The longest time to first output allowed: at 10 MB per task (and below) 2 s, 1 s
    with a spare worker kept; at 100 MB 5 s; nothing is set above."""
    if state_mb <= 10:
        return 1.0 if mode == "spare" else 2.0
    return 5.0 if state_mb <= 100 else None


def _spread(s: dict, digits: int = 1, scale: float = 1.0) -> str:
    """A median with its [min-max] range (the range only over more than one value), to
    ``digits`` decimals, each times ``scale``."""
    if s.get("median") is None:
        return "n/a"
    median, low, high = (f"{s[k] * scale:,.{digits}f}" for k in ("median", "min", "max"))
    return median if s.get("n", 1) < 2 else f"{median} [{low}-{high}]"


def _times(x: dict) -> str:
    return "n/a" if x.get("median") is None else f"{x['median']:.2f}x"


def _mb(size: dict) -> str:
    return f"{size['state_mb_per_task']:g} MB"


def _behind(size: dict) -> bool:
    """Whether the job fell behind its rate even without checkpoints (its p50 at half
    rate far above the few ms of a job that keeps up): p99 is then the backlog's."""
    p50 = size["overhead"]["none"].get("p50_ms", {}).get("median")
    return p50 is not None and p50 > BEHIND_P50_MS


def _overhead_rows(size: dict) -> tuple[list[str], list[str]]:
    """The overhead table's rows of a size, and what missed its target (only throughput
    is judged where the job fell behind without checkpoints, see :func:`_behind`)."""
    rows, missed = [], []
    behind = _behind(size)
    for name, label in CHECKPOINT_CONFIGS.items():
        o = size["overhead"][name]
        target, met = OVERHEAD_TARGETS.get(name), ""
        if target:
            ratio, p99 = o["throughput_ratio"]["median"], o["p99_ratio"]["median"]
            ok = ratio is not None and ratio >= target[0]
            if not behind:
                ok = ok and p99 is not None and p99 <= target[1]
            met = ("yes" if ok else "no") + (", throughput only" if behind else "")
            if not ok:
                missed.append(f"{_mb(size)} {label}")
        ratios = (_times(o["throughput_ratio"]), _times(o["p99_ratio"]))
        rows.append(
            f"| {_mb(size)} | {label} | {_spread(o['max_words_per_s'], 0)} | "
            f"{ratios[0] if name != 'none' else ''} | {_spread(o['p99_ms'])} | "
            f"{ratios[1] if name != 'none' else ''} | "
            + (f">= {target[0]:.0%}, <= {target[1]:g}x | {met} |" if target else "| |")
        )
    return rows, missed


def _behind_note(sizes: list[dict]) -> list[str]:
    """A sentence on the sizes at which the job fell behind without checkpoints."""
    behind = [s for s in sizes if _behind(s)]
    if not behind:
        return []
    each = "; ".join(
        f"{_mb(s)}: p50 {fmt(s['overhead']['none']['p50_ms']['median'])} ms, "
        f"{fmt(round(s['overhead']['none']['max_words_per_s']['median']))} words/s unthrottled "
        f"against {fmt(round(s['rate_words_per_s']))} offered"
        for s in behind
    )
    return [
        "Without checkpoints the job fell behind its rate at some sizes, the VM running "
        f"slower in the rounds than when the maximum was measured ({each}): there p99 is "
        "the backlog's, so only throughput is judged.",
        "",
    ]


def _checkpoint_rows(size: dict) -> list[str]:
    rows = []
    for name, label in CHECKPOINT_CONFIGS.items():
        o = size["overhead"][name]
        if name == "none":
            continue
        rows.append(
            f"| {_mb(size)} | {label} | {o['checkpoints_completed']} "
            f"({o['checkpoints_abandoned']}) | {_spread(o['duration_ms'])} | "
            f"{_spread(o['bytes_written'], 1, 1 / 2**20)} | "
            f"{_spread(o['bytes_restore_reads'], 1, 1 / 2**20)} | "
            f"{_fraction(o['written_over_restore_reads']['median'])} |"
        )
    return rows


def _recovery_rows(size: dict) -> tuple[list[str], list[str], list[str]]:
    """The rows of the recovery tables of a size (times to output, the recovery's own
    report), and what missed its target."""
    out, own, missed = [], [], []
    for mode, label in RECOVERY_MODES.items():
        r = size["recovery"][mode]
        limit = recovery_target_s(size["state_mb_per_task"], mode)
        first = r["first_output_s"]["median"]
        met = "" if limit is None else "yes" if first is not None and first < limit else "no"
        if met == "no":
            missed.append(f"{_mb(size)} onto {label}")
        out.append(
            f"| {_mb(size)} | {label} | {r['recovered']} of {r['rounds']} | "
            f"{_spread(r['first_output_s'], 2)} | {f'< {limit:g} s' if limit else ''} | {met} | "
            f"{_spread(r['caught_up_s'], 2)} | {_spread(r['p99_back_s'], 1)} | "
            f"{_spread(r['steady_p99_ms'], 0)} | {_spread(r['replayed_s'], 2)} |"
        )
        t = r["timings_ms"]
        own.append(
            f"| {_mb(size)} | {label} | {fmt(r['detect_ms']['median'])} | "
            + " | ".join(fmt(t[k]["median"]) for k in ("halt", "place", "restore", "total"))
            + f" | {fmt(round(r['restore_reads_bytes']['median'] / 2**20, 1))} |"
        )
    return out, own, missed


def _exact_row(size: dict) -> str:
    """A size's bounded run, as a row of the exactly-once table."""
    e = size["exactly_once"]
    return (
        f"| {_mb(size)} | {'yes' if e['killed'] else 'no'}, {e['recoveries']} | "
        f"{fmt(e['records_written'])} | {fmt(e['records_expected'])} | {fmt(e['missing'])} | "
        f"{fmt(e['twice'])} | {'yes' if _exact(e) else 'no'} |"
    )


def _exact(e: dict) -> bool:
    """Exact: the run was killed, recovered and finished, nothing missing, nothing twice."""
    return bool(e["killed"] and e["recoveries"] and e["status"] == "finished") and not (
        e["missing"] or e["twice"]
    )


def _rounds_of(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"


def recovery_section(d: dict) -> list[str]:
    sizes = d["state_sizes"]
    every = d["recovery_policy"]["interval_s"]
    load = ", ".join(f"{fmt(s['load_average']['start'][0])} ({_mb(s)})" for s in sizes)
    out = [
        "## Checkpoints and recovery",
        "",
        "The padded word count above (2 count tasks on 2 of 3 local workers, each with the "
        "state of the first column), checkpointed to local disk; per configuration "
        f"{d['warmup_s']:g} s warm-up, {d['seconds']:g} s at half its unthrottled rate (p99), "
        f"{d['seconds']:g} s unthrottled (throughput). Ratios to the run without "
        f"checkpoints of the same round; medians of {_rounds_of(d['rounds'])}. Load as each "
        f"size started: {load}. {_rerun(d['command'])}",
        "",
        "**Targets:** every 10 s, throughput at least 95% and p99 at most 1.5x; every 1 s, "
        "at least 85% and 2x.",
        "",
        "| state per task | checkpoints | max words/s [range] | / none | p99 ms at half rate "
        "[range] | / none | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    missed: list[str] = []
    for size in sizes:
        rows, miss = _overhead_rows(size)
        out += rows
        missed += miss
    out += [""] + ([f"Missed: {', '.join(missed)}.", ""] if missed else []) + _behind_note(sizes)
    states = ", ".join(
        f"{s['state_bytes'] / 2**20:,.1f} MB at {_mb(s)}" for s in sizes if s["state_bytes"]
    )
    out += [
        "Checkpoints during the half-rate seconds: barrier to manifest, bytes written, and "
        "bytes a restore reads (chains of incremental parts, `full_every=8`; written "
        f"whole, `full_every=1`: the state, {states} per task).",
        "",
        "| state per task | checkpoints | completed (abandoned) | duration ms [range] | "
        "MB written [range] | MB a restore reads [range] | written / read |",
        "|---|---|---|---|---|---|---|",
        *(row for size in sizes for row in _checkpoint_rows(size)),
        "",
        f"A worker hosting a count task is SIGKILLed {fmt(d['kill_after_s'])} s after the "
        f"{d['kill_at_checkpoint']}th checkpoint (every {every:g} s); its tasks go to an "
        "idle spare or to a new worker process. From the kill, at the sinks: **first "
        "output** of a recovered sink; **caught up** with what the sources emitted up to "
        "the kill; **p99 back** within 2x of **p99 before** (warm-up to kill). Replayed: "
        "seconds of input from the checkpoint to the kill.",
        "",
        "**Targets:** first output under 2 s at 10 MB per task (1 s onto a spare worker), "
        "under 5 s at 100 MB; 1 MB is held to the 10 MB ones.",
        "",
        "| state per task | lost tasks to | recovered | first output s [range] | target | met "
        "| caught up s [range] | p99 back s [range] | p99 before ms [range] | replayed s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    own: list[str] = []
    missed = []
    for size in sizes:
        rows, theirs, miss = _recovery_rows(size)
        out += rows
        own += theirs
        missed += miss
    out += [""] + ([f"Missed: {', '.join(missed)}.", ""] if missed else [])
    out += [
        "The recovery's own report (medians, ms): kill to its start, halt (stop the job's "
        "tasks), place (find or start workers), restore (deploy, read state, start).",
        "",
        "| state per task | lost tasks to | kill to start | halt | place | restore | total "
        "| MB a restore reads |",
        "|---|---|---|---|---|---|---|---|",
        *own,
        "",
    ]
    out += [
        f"Nothing lost or duplicated: a bounded run ({fmt(sizes[0]['exactly_once']['sentences'])} "
        f"sentences at {sizes[0]['exactly_once']['rate_sentences_per_s']:,.0f} per second, the "
        "same checkpoints and kill) whose sink writes every (word, running count), against "
        "those the in-process reference implies.",
        "",
        "| state per task | killed, recoveries | records written | expected | missing | twice "
        "| exact |",
        "|---|---|---|---|---|---|---|",
        *(_exact_row(size) for size in sizes),
        "",
    ]
    twice = [
        f"{_mb(s)} ({fmt(s['exactly_once']['twice'])} records twice, "
        f"{fmt(s['exactly_once']['missing'])} missing)"
        for s in sizes
        if not _exact(s["exactly_once"])
    ]
    if twice:
        out += [f"Missed: {', '.join(twice)}.", ""]
    return out


def spark_section(d: dict) -> list[str]:
    local, spark = d["backends"]["local"], d["backends"]["spark"]

    def row(name: str, get: Callable[[dict], Any], unit: str) -> str:
        a, b = get(local), get(spark)
        ratio = f"{b / a:.2f}" if a and b is not None else "n/a"
        return f"| {name} | {fmt(a)}{unit} | {fmt(b)}{unit} | {ratio} |"

    def plan(kind: str, field: str) -> Callable[[dict], Any]:
        return lambda b: b["plans"][kind][field]

    return [
        "## Spark backend against local",
        "",
        f"Word count on {d['workers']} workers each, Spark `{d['spark_master']}` (session start "
        f"{fmt(d['spark_session_start_s'])} s, once); medians of "
        f"{len(local['max_throughput']['steady_words_per_s_rounds'])} interleaved runs per "
        f"backend; latency and plans at {d.get('load', 0.5):.0%} of the local maximum. "
        f"{_rerun(d['command'])}",
        "",
        "| measure | local | spark | spark / local |",
        "|---|---|---|---|",
        row(
            "max sustained throughput",
            lambda b: b["max_throughput"]["steady_words_per_s"],
            " words/s",
        ),
        row("p50 latency", lambda b: b["latency"]["latency_ms"]["p50_ms"], " ms"),
        row("p99 latency", lambda b: b["latency"]["latency_ms"]["p99_ms"], " ms"),
        row("rebalance: total", plan("rebalance", "total_ms"), " ms"),
        row("rebalance: longest pause", plan("rebalance", "max_pause_ms"), " ms"),
        row("scale-out: total", plan("scale_out", "total_ms"), " ms"),
        row("scale-out: longest pause", plan("scale_out", "max_pause_ms"), " ms"),
        "",
    ]


# The connectors' pipelines, in the table's order: (result, label, its half-rate run).
CONNECTOR_ROWS = (
    ("generator", "generator -> null", None),
    ("kafka", "Kafka -> Kafka", "kafka_half"),
    ("kafka", "the same, fetch wait 20 ms", "kafka_half_short_fetch"),
    ("kafka_no_txn", "Kafka -> Kafka, no transactions", None),
    ("jetstream", "JetStream -> JetStream", "jetstream_half"),
)


def _connectors_where(d: dict) -> list[str]:
    """Two lines on where the time goes, from the runs' operator shares and, when the
    run took the paths apart (``--profile``), their per-record costs."""
    s, apart = d["summary"], d.get("profile") or {}
    kafka, nats = apart.get("kafka", {}), apart.get("jetstream", {})

    def cpu(part: dict, name: str) -> float:
        return part.get(name, {}).get("client_cpu_us_per_record") or 0.0

    ops = s["kafka"]["operators"]
    line = (
        f"Kafka: sources backpressured {ops['sentences']['backpressure'] or 0:.0%}, sinks busy "
        f"{ops['sink']['busy'] or 0:.0%}, tansu {s['kafka']['broker_cpu']['median'] or 0:.2f} cores"
    )
    if kafka:
        line += (
            f"; alone, a count record costs the sink "
            f"{cpu(kafka, 'KafkaSinkWriter: encode, transaction'):.1f} µs of CPU (JSON "
            f"{cpu(kafka, 'encode JSON'):.1f}), a sentence the reader "
            f"{cpu(kafka, 'KafkaPartitionReader.poll (both)'):.1f} µs"
        )
    lines = [
        line + f". The workers use {s['kafka']['workers_cpu']['median'] or 0:.2f} of the 2 "
        "cores: the pipeline is CPU-bound. At half rate the p50 is tansu's (it answers a "
        "fetch when librdkafka's 500 ms wait is up); what is left of the p99 with a 20 ms "
        "wait was not taken apart."
        if "workers_cpu" in s["kafka"]
        else line + ". At half rate the p50 is tansu's (it answers a fetch when librdkafka's "
        "500 ms wait is up)."
    ]
    if nats:
        read = cpu(nats, "JetStreamReader.poll (fetch, decode)")
        write = cpu(nats, "JetStreamWriter: encode, publish acknowledged")
        cap = round(2e6 / (read / 8 + write)) if read or write else None
        lines.append(
            f"JetStream: nats-py takes {read:.0f} µs of CPU per sentence read, {write:.0f} µs per "
            f"record published and acknowledged: with 2 cores, {fmt(cap)} words/s at most "
            "before the broker's share. Commits run off the worker's loop."
        )
    return lines


def connectors_section(d: dict) -> list[str]:
    """The word count through each broker against the generator, and why it falls short."""
    s, targets = d["summary"], d["targets"]
    low, high = (f(r["load_average"][0] for r in d["rounds"]) for f in (min, max))
    load = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
    rows = []
    for name, label, half in CONNECTOR_ROWS:
        latency = s.get(half) if half else None
        shown = name != "kafka" or half == "kafka_half"  # the second Kafka row: latency only
        rows.append(
            f"| {label} | {_spread(s[name]['words_per_s'], 0) if shown else ''} | "
            f"{_times(s[name].get('ratio', {})) if shown and name != 'generator' else ''} | "
            + (
                f"{fmt(latency['p50_ms']['median'])} / {_spread(latency['p99_ms'])}"
                if latency
                else ""
            )
            + " |"
        )
    missed = [
        f"{broker} {', '.join(k for k, ok in s[key]['met'].items() if not ok)}"
        for broker, key in (("Kafka", "kafka"), ("JetStream", "jetstream"))
        if not all(s[key]["met"].values())
    ]
    return [
        "## Connectors: Kafka and NATS JetStream",
        "",
        f"Word count on {d['workers']} local workers, checkpoints every "
        f"{d['checkpoint_interval_s']:g} s, from {d['sentences']:,} sentences in a tansu topic "
        f"(memory storage, {d['partitions']} partitions) or a JetStream stream "
        f"({d['partitions']} subjects) to a topic or stream; the generator pipeline in the "
        "same rounds. Latency at half rate, from the producer's write. Medians of "
        f"{_rounds_of(d['rounds_run'])}, load {load}. {_rerun(d['command'])}",
        "",
        "| pipeline | words/s [range] | / generator | p50 / p99 [range] ms at half rate |",
        "|---|---|---|---|",
        *rows,
        "",
        f"**Targets:** {targets['ratio']:.0%} of the generator's words/s, p99 under "
        f"{targets['p99_ms']:g} ms. " + (f"Missed: {'; '.join(missed)}." if missed else "Met."),
        "",
        *(line for where in _connectors_where(d) for line in (where, "")),
    ]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def _outcomes(summary: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in summary["decisions"].items()) or "none"


def _reconfigurations(run: dict) -> str:
    """One sentence on the reconfigurations a controller made in a run."""
    recs = run["reconfigurations"]
    if not recs:
        return "The controller made no reconfiguration."
    done = sum(r["status"] == "completed" for r in recs)
    pause = max((r["max_pause_ms"] or 0.0 for r in recs), default=0.0)
    total = max((r["timings_ms"].get("total") or 0.0 for r in recs), default=0.0)
    return (
        f"It made {len(recs)} reconfigurations ({done} completed); the longest took "
        f"{fmt(total)} ms, the longest pause {fmt(pause)} ms."
    )


def _controller_header(d: dict, title: str, what: str) -> list[str]:
    c = d["controller"]
    return [
        f"### {title}",
        "",
        f"`{d['job']}` on {d['workers']} local workers, {fmt(d['duration_s'])} s per run; "
        f"`{c['builtin']}` attached at {fmt(d['warmup_s'])} s, figures over the "
        f"{fmt(d['sample_s'])} s metrics windows after that. {what} {_rerun(d['command'])}",
        "",
        f"![{d['scenario']}](bench/results/controllers_{d['scenario']}.png)",
        "",
    ]


def _table(controlled: str, static: str, rows: list[str], a: dict, closing: str) -> list[str]:
    """The comparison table of a controlled run and its static twin, then ``closing``."""
    return [
        f"| measure | {controlled} | {static} |",
        "|---|---|---|",
        *rows,
        f"| decisions | {_outcomes(a)} | |",
        "",
        closing,
        "",
    ]


def _fraction(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _spread_row(name: str, a: dict, b: dict, show: Callable[[Any], str] = fmt) -> str:
    """A row of per-window figures (mean / median / p90 / max) of both runs."""
    keys = ("mean", "median", "p90", "max")
    return (
        f"| {name} (mean / median / p90 / max) | {' / '.join(show(a[k]) for k in keys)} | "
        f"{' / '.join(show(b[k]) for k in keys)} |"
    )


AUTOSCALER_NAMES = {
    "static": "static (parallelism 1)",
    "autoscaler": "`latency_autoscaler` (eSault)",
    "ds2": "`ds2_autoscaler` (DS2)",
    "flink": "`flink_autoscaler` (Flink's rule, default windows)",
}


def _seconds(x: float | None, never: str = "not by the end") -> str:
    return never if x is None else f"{fmt(x)} s"


def autoscaler_section(d: dict) -> list[str]:
    summary = d["summary"]
    limit = fmt(d["controller"]["config"]["max_latency_ms"])
    policies = [name for name in AUTOSCALER_NAMES if name in summary]
    out = [
        "### Autoscalers: stock exchange, order rate x3 then back",
        "",
        f"`{d['job']}` on {d['workers']} local workers, {fmt(d['duration_s'])} s per run, the "
        f"same job under {len(policies)} policies one after the other; the order rate steps "
        "from 4,000 to 12,000 orders/s at 25% of the run and back at 60%; controllers "
        f"attached at {fmt(d['warmup_s'])} s, metrics read every {fmt(d['sample_s'])} s. "
        f"{_rerun(d['command'])}",
        "",
        f"![{d['scenario']}](bench/results/controllers_{d['scenario']}.png)",
        "",
        f"| policy | up: last over {limit} ms | s over | peak p99 ms | "
        "reconfigs | down: scaled in after | reconfigs | reconfigs at steady load | "
        "task-seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in policies:
        x = summary[name]
        up, down = x["steps"]["up"], x["steps"]["down"]
        scaled = "no scale-out" if x["scaled_in_s"] == 0 else _seconds(x["scaled_in_s"])
        out.append(
            f"| {AUTOSCALER_NAMES[name]} | {_seconds(up['recovery_s'], 'at the step down')}"
            f" | {fmt(up['seconds_over'])} | {fmt(up['peak_p99_ms'])} | "
            f"{up['reconfigurations']} | {scaled if name != 'static' else '-'} | "
            f"{down['reconfigurations']} | {x['steady_reconfigurations']} | "
            f"{fmt(x['task_seconds']['total'])} |"
        )
    out += [
        "",
        "Targets: p99 back under its limit within 5 s of the step up, at most 2 "
        "reconfigurations a step, scaled in within 30 s of the step down, none at steady "
        'load. "Last over" is the last 1 s window of the high phase with p99 over the '
        'limit, after the step; "s over" counts them all.',
        "",
    ]
    return out


def hotkeys_section(d: dict) -> list[str]:
    summary = d["summary"]
    one, two = (summary[w]["words_per_s"]["median"] for w in ("1 way", "2 ways"))
    out = [
        "### Hot keys split: Zipf 2.0 word count, its top word more than a task can take",
        "",
        f"`{d['job']}` with `aggregate`, {fmt(d['params']['work_us'])} us of compute per word "
        f"counted, Zipf 2.0 over 10,000 words (the top one about 61% of them), 3 count tasks "
        f'on {d["workers"]} workers, {fmt(d["duration_s"])} s runs. "N ways": unthrottled, '
        'the top word split over N count tasks before measuring. "static" and '
        f'"balancer" (`load_balancer`): {fmt((one + two) / 2)} words/s offered, between what '
        f"1 and 2 ways count. {_rerun(d['command'])}",
        "",
        f"![{d['scenario']}](bench/results/controllers_{d['scenario']}.png)",
        "",
        "| run | words/s counted (median) | over 1 way | busiest count task | p99 ms, median "
        "(after the last split) | splits |",
        "|---|---|---|---|---|---|",
    ]
    for label, x in summary.items():
        words = x["words_per_s"]["median"]
        settled = x.get("p99_ms_settled", x["p99_ms"])["median"]
        after = f" ({fmt(settled)})" if x["splits"] else ""
        out.append(
            f"| {label} | {fmt(words)} | {_ratio(words, one)} | "
            f"{_fraction(x['count_busy']['median'])} | {fmt(x['p99_ms']['median'])}{after} | "
            f"{'; '.join(x['splits']) or '-'} |"
        )
    return [*out, ""]


def balancer_section(d: dict) -> list[str]:
    a, s = d["summary"]["balancer"], d["summary"]["static"]
    threshold = d["controller"]["config"]["threshold"]
    out = _controller_header(
        d,
        "Load balancer: word count, Zipf keys reshuffled every 30 s",
        "Static keeps the initial even split of key groups.",
    )
    rows = [
        _spread_row(
            "imbalance (max - mean) / mean of count tasks",
            a["imbalance"],
            s["imbalance"],
            _fraction,
        ),
        f"| windows over the threshold ({fmt(threshold)}) | {a['samples_over_threshold']} of "
        f"{a['samples']} | {s['samples_over_threshold']} of {s['samples']} |",
        _spread_row("p99 latency ms", a["p99_ms"], s["p99_ms"]),
        f"| words/s counted | {fmt(a['words_per_s'])} | {fmt(s['words_per_s'])} |",
        f"| key groups moved | {a['key_groups_moved']} | 0 |",
    ]
    closing = (
        f"Mean imbalance, balancer / static: "
        f"{_ratio(a['imbalance']['mean'], s['imbalance']['mean'])}; "
        f"p99 median: {_ratio(a['p99_ms']['median'], s['p99_ms']['median'])}. "
        + _reconfigurations(d["runs"]["balancer"])
        + " At this rate no count task is saturated, so evening their load does not lower "
        f"latency. The balanced run's p99 bursts (up to {fmt(a['p99_ms']['max'])} ms) did not "
        "recur in later runs of the same moves; their cause was not found."
    )
    return out + _table("load_balancer", "static", rows, a, closing)


def placement_section(d: dict) -> list[str]:
    a, s = d["summary"]["dsc"], d["summary"]["round-robin"]
    out = _controller_header(
        d,
        "DSC placement: word count from round-robin placement",
        "Both runs start from round-robin placement (task k on worker k mod n); the source is "
        "unthrottled, so throughput is the most each placement sustains.",
    )
    rows = [
        _spread_row("MB/s crossing workers", a["cross_mb_per_s"], s["cross_mb_per_s"], _fraction),
        _spread_row("MB/s between tasks", a["total_mb_per_s"], s["total_mb_per_s"], _fraction),
        f"| share of bytes crossing workers | {_fraction(a['cross_fraction'])} | "
        f"{_fraction(s['cross_fraction'])} |",
        _spread_row("words/s counted", a["words_per_s"], s["words_per_s"]),
        _spread_row("p99 latency ms", a["p99_ms"], s["p99_ms"]),
    ]
    closing = (
        f"Crossing share, DSC / round-robin: {_ratio(a['cross_fraction'], s['cross_fraction'])}; "
        f"mean throughput: {_ratio(a['words_per_s']['mean'], s['words_per_s']['mean'])}."
    )
    if a.get("words_per_s_before_and_after"):
        before, after = a["words_per_s_before_and_after"]
        closing += (
            f" Unthrottled runs vary from run to run; within the DSC run, words/s after its "
            f"re-placement over before: {_ratio(after['mean'], before['mean'])}, the fairer "
            "figure."
        )
    closing += " " + _reconfigurations(d["runs"]["dsc"])
    return out + _table("dsc_placement", "round-robin", rows, a, closing)


CONTROLLER_SECTIONS = {
    "autoscaler": autoscaler_section,
    "balancer": balancer_section,
    "placement": placement_section,
    "hotkeys": hotkeys_section,
}


def controllers_section() -> list[str]:
    found = {name: d for name in CONTROLLER_SECTIONS if (d := load(f"controllers_{name}"))}
    if not found:
        return []
    out = [
        "## Controllers against static configurations",
        "",
        "Each scenario runs the job on its own `streampilot server` per run, driven through "
        "REST: with built-in controllers attached, and without (static). The plots need the "
        "`bench` extra (matplotlib).",
        "",
    ]
    for name, d in found.items():
        out += CONTROLLER_SECTIONS[name](d)
    return out


def setup_section(results: list[dict]) -> list[str]:
    """Where and when the results were measured, and how to read them."""
    machines = sorted(
        {(r["machine"]["cpu"], r["machine"]["cores"], r["machine"]["python"]) for r in results}
    )
    days = sorted(_day(r["date"]) for r in results)
    on = "; ".join(f"{cpu} ({cores} cores), Python {py}" for cpu, cores, py in machines)
    span = days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"
    return [
        "## Setup",
        "",
        f"Measured on {on}, a shared VM, from {span}. Local workers are processes on that "
        "machine. Figures are medians of rounds, with [min-max] ranges where a table shows "
        "them; the VM's speed drifts from run to run, so compare figures measured in the "
        "same run (the ratios) rather than absolute times across runs.",
        "",
        "Re-run everything with `make bench` (about three hours; it installs the `bench` "
        "extra), or one benchmark with the command under its table, then "
        "`.venv/bin/python bench/report.py` to render this page.",
        "",
    ]


def _nexmark_row(r: dict, flink: dict) -> str:
    peak = flink.get(r["query"]) if r["workers"] == 1 else None
    rescale = r.get("rescale_completion_ms")
    return (
        f"| {r['query']} | {r['workers']} | {_spread({**r['events_per_s'], 'n': 3}, 0)} | "
        f"{fmt(r['p50_ms_at_half']['median'])} / {fmt(r['p99_ms_at_half']['median'])} | "
        + (
            f"{fmt(rescale['median'])} / {fmt((r.get('rescale_max_ms') or {}).get('median'))}"
            if rescale
            else ""
        )
        + f" | {format(int(peak), ',') if peak else ''} |"
    )


def _shares(part: dict) -> str:
    shares = sorted(part["own_time_by_component"].items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {share:.0%}" for name, share in shares if share >= 0.05)


def nexmark_section(d: dict) -> list[str]:
    """Nexmark queries: throughput, latency at half load, a live rescale; where time goes."""
    results, flink = d["results"], d.get("flink_per_core_events_per_s", {})
    days = sorted({_day(r.get("date", d["date"])) for r in results})
    prof = d.get("profile") or {}
    where = (
        "Where the time goes (cProfile of one pipeline in one process, own time): "
        + "; ".join(
            f"{name} {part['us_per_record']:g} µs per event: {_shares(part)}"
            for name, part in prof.items()
            if name != "wordcount"
        )
        + "."
        if prof
        else ""
    )
    return [
        "## Nexmark",
        "",
        f"The Nexmark queries on local workers ({d['workload']['partitions']} source "
        f"partitions, {d['workload']['events']:,} events per run), medians of "
        f"{_rounds_of(d['workload']['rounds'])} measured on {', '.join(days)}: events/s as "
        "fast as the source goes, p50 / p99 at half that rate (from the event time, which "
        "follows the wall clock), then a live rescale of the stateful operator at half load "
        "(completion / highest latency around it). Flink 1.13's published figures are per "
        f"core. {_rerun(d['command'])}",
        "",
        "| query | workers | events/s [range] | p50 / p99 ms | rescale / max ms | Flink |",
        "|---|---|---|---|---|---|",
        *(_nexmark_row(r, flink) for r in results),
        "",
        *([where, ""] if where else []),
    ]


def render() -> str:
    """The page, from whatever results are present."""
    tp, rc, st, fc, rv, sp = (
        load(n)
        for n in ("throughput", "reconfig", "state_transfer", "fork_copy", "recovery", "spark")
    )
    cn, nx = load("connectors"), load("nexmark")
    controllers = [d for n in CONTROLLER_SECTIONS if (d := load(f"controllers_{n}"))]
    present = [d for d in (tp, rc, st, fc, rv, sp, cn, nx, *controllers) if d]
    lines = [
        "# Benchmarks",
        "",
        "Rendered by `bench/report.py` from the JSON files in `bench/results/`, which the "
        "benchmarks write; no figure here is typed in. How the mechanisms measured here work "
        "is in [docs/design.md](docs/design.md).",
        "",
    ]
    if present:
        lines += setup_section(present)
    if tp:
        lines += throughput_section(tp)
    if rc:
        lines += reconfig_section(rc, st)
    if st:
        lines += state_transfer_section(st)
    if fc:
        lines += fork_copy_section(fc)
    if rv:
        lines += recovery_section(rv)
    if sp:
        lines += spark_section(sp)
    if cn:
        lines += connectors_section(cn)
    if nx:
        lines += nexmark_section(nx)
    lines += controllers_section()
    return "\n".join(lines)


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE.name} ({PAGE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
