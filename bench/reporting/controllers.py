"""The controllers against static configurations: the autoscalers, hot keys split, the load
balancer and DSC placement, a subsection each from its own result file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import fmt, fraction, load, rerun


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
        f"{fmt(d['sample_s'])} s metrics windows after that. {what} {rerun(d['command'])}",
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


def _safety(d: dict) -> str:
    """The host's cooldowns of the run's controllers, as a clause (empty if not recorded)."""
    safety = (d.get("controller") or {}).get("safety") or {}
    if "cooldown_s" not in safety:
        return ""
    out = f", host cooldown {fmt(safety['cooldown_s'])} s"
    if safety.get("scale_out_cooldown_s") is not None:
        out += f" ({fmt(safety['scale_out_cooldown_s'])} s for a scale-out)"
    return out


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
        f"attached at {fmt(d['warmup_s'])} s, metrics read every {fmt(d['sample_s'])} s"
        f"{_safety(d)}. {rerun(d['command'])}",
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
        f"1 and 2 ways count. {rerun(d['command'])}",
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
            f"{fraction(x['count_busy']['median'])} | {fmt(x['p99_ms']['median'])}{after} | "
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
            fraction,
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
        _spread_row("MB/s crossing workers", a["cross_mb_per_s"], s["cross_mb_per_s"], fraction),
        _spread_row("MB/s between tasks", a["total_mb_per_s"], s["total_mb_per_s"], fraction),
        f"| share of bytes crossing workers | {fraction(a['cross_fraction'])} | "
        f"{fraction(s['cross_fraction'])} |",
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
