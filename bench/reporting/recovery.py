"""Checkpoints and recovery: the overhead of checkpoints against their targets, what a
checkpoint writes and a restore reads, and the recovery from a lost worker (time to first
output against its target, nothing lost or twice)."""

from __future__ import annotations

from .common import fmt, fraction, opening, rounds_of, spread, times, verdict

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


def _mb(size: dict) -> str:
    return f"{size['state_mb_per_task']:g} MB"


def _behind(size: dict) -> bool:
    """Whether the job fell behind its rate even without checkpoints (its p50 at half
    rate far above the few ms of a job that keeps up): p99 is then the backlog's."""
    p50 = size["overhead"]["none"].get("p50_ms", {}).get("median")
    return p50 is not None and p50 > BEHIND_P50_MS


def _overhead_rows(size: dict) -> tuple[list[str], list[str]]:
    """The overhead table's rows of a size, and what missed its target with the figure
    that missed (only throughput is judged where the job fell behind without
    checkpoints, see :func:`_behind`)."""
    rows, missed = [], []
    behind = _behind(size)
    for name, label in CHECKPOINT_CONFIGS.items():
        o = size["overhead"][name]
        target, met = OVERHEAD_TARGETS.get(name), ""
        ratios = (times(o["throughput_ratio"]), times(o["p99_ratio"]))
        if target:
            ratio, p99 = o["throughput_ratio"]["median"], o["p99_ratio"]["median"]
            short = [] if ratio is not None and ratio >= target[0] else [f"throughput {ratios[0]}"]
            if not behind and (p99 is None or p99 > target[1]):
                short.append(f"p99 {ratios[1]}")
            met = ("no" if short else "yes") + (", throughput only" if behind else "")
            if short:
                missed.append(f"{_mb(size)} {label} ({', '.join(short)})")
        rows.append(
            f"| {_mb(size)} | {label} | {spread(o['max_words_per_s'], 0)} | "
            f"{ratios[0] if name != 'none' else ''} | {spread(o['p99_ms'])} | "
            f"{ratios[1] if name != 'none' else ''} | {met} |"
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
            f"({o['checkpoints_abandoned']}) | {spread(o['duration_ms'])} | "
            f"{spread(o['bytes_written'], 1, 1 / 2**20)} | "
            f"{spread(o['bytes_restore_reads'], 1, 1 / 2**20)} | "
            f"{fraction(o['written_over_restore_reads']['median'])} |"
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
            missed.append(f"{_mb(size)} onto {label} ({fmt(first)} s)")
        out.append(
            f"| {_mb(size)} | {label} | {r['recovered']} of {r['rounds']} | "
            f"{spread(r['first_output_s'], 2)} | {met} | "
            f"{spread(r['caught_up_s'], 2)} | {spread(r['p99_back_s'], 1)} | "
            f"{spread(r['steady_p99_ms'], 0)} | {spread(r['replayed_s'], 2)} |"
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


RECOVERY_TITLE = "Checkpoints and recovery"


def _missed(sizes: list[dict]) -> tuple[list[str], list[str], list[str]]:
    """What missed the overhead, the recovery and the exactly-once targets."""
    overhead = [m for size in sizes for m in _overhead_rows(size)[1]]
    recovery = [m for size in sizes for m in _recovery_rows(size)[2]]
    twice = [
        f"{_mb(s)} ({fmt(s['exactly_once']['twice'])} records twice, "
        f"{fmt(s['exactly_once']['missing'])} missing)"
        for s in sizes
        if not _exact(s["exactly_once"])
    ]
    return overhead, recovery, twice


def recovery_verdict(d: dict) -> str:
    sizes = d["state_sizes"]
    overhead, recovery, twice = _missed(sizes)
    judged = (
        ("overhead", overhead, 2 * len(sizes)),
        ("first output", recovery, 2 * len(sizes)),
        ("exactly once", twice, len(sizes)),
    )
    return "; ".join(
        f"{name} met" if not miss else f"{name} missed {len(miss)} of {n}"
        for name, miss, n in judged
    )


def recovery_section(d: dict) -> list[str]:
    sizes = d["state_sizes"]
    every = d["recovery_policy"]["interval_s"]
    load = ", ".join(f"{fmt(s['load_average']['start'][0])} ({_mb(s)})" for s in sizes)
    missed_overhead, missed_recovery, twice = _missed(sizes)
    e = sizes[0]["exactly_once"]
    return [
        *opening(
            RECOVERY_TITLE,
            "The padded word count (2 count tasks on 2 of 3 local workers) checkpointed to "
            f"local disk; per configuration {d['warmup_s']:g} s warm-up, {d['seconds']:g} s at "
            f"half rate (p99), {d['seconds']:g} s unthrottled (throughput); ratios to no "
            f"checkpoints in the same round; {rounds_of(d['rounds'])}; load at start {load}.",
            d["command"],
        ),
        "**Overhead of checkpoints.**",
        "",
        "| state per task | checkpoints | max words/s [range] | / none | p99 ms at half rate "
        "[range] | / none | met |",
        "|---|---|---|---|---|---|---|",
        *(row for size in sizes for row in _overhead_rows(size)[0]),
        "",
        *_behind_note(sizes),
        *verdict(
            "every 10 s, throughput at least 95% and p99 at most 1.5x; every 1 s, 85% and 2x",
            missed_overhead,
        ),
        "**What a checkpoint writes** (at half rate): barrier to manifest, MB written, MB a "
        "restore reads; incremental (`full_every=8`) or whole (`full_every=1`).",
        "",
        "| state per task | checkpoints | completed (abandoned) | duration ms [range] | "
        "MB written [range] | MB a restore reads [range] | written / read |",
        "|---|---|---|---|---|---|---|",
        *(row for size in sizes for row in _checkpoint_rows(size)),
        "",
        f"**Recovery from a lost worker**: a count task's worker is SIGKILLed "
        f"{fmt(d['kill_after_s'])} s after checkpoint {d['kill_at_checkpoint']} (every "
        f"{every:g} s); its tasks go to the spare or a new process. From the kill: first "
        "output of a recovered sink; caught up with the sources at the kill; p99 back "
        "within 2x of p99 before; replayed: input from the checkpoint to the kill.",
        "",
        "| state per task | lost tasks to | recovered | first output s [range] | met "
        "| caught up s [range] | p99 back s [range] | p99 before ms [range] | replayed s |",
        "|---|---|---|---|---|---|---|---|---|",
        *(row for size in sizes for row in _recovery_rows(size)[0]),
        "",
        *verdict(
            "first output under 2 s up to 10 MB (1 s onto the spare), 5 s at 100 MB",
            missed_recovery,
        ),
        "The recovery's own report (medians, ms): halt the tasks, place them (find or start "
        "workers), restore (deploy, read state, start).",
        "",
        "| state per task | lost tasks to | kill to start | halt | place | restore | total "
        "| MB a restore reads |",
        "|---|---|---|---|---|---|---|---|",
        *(row for size in sizes for row in _recovery_rows(size)[1]),
        "",
        f"**Exactly once**: {fmt(e['sentences'])} sentences at "
        f"{e['rate_sentences_per_s']:,.0f}/s, the same checkpoints and kill; every (word, "
        "running count) written against the reference.",
        "",
        "| state per task | killed, recoveries | records written | expected | missing | twice "
        "| exact |",
        "|---|---|---|---|---|---|---|",
        *(_exact_row(size) for size in sizes),
        "",
        *verdict("nothing lost, nothing twice", twice),
    ]
