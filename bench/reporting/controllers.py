"""The controllers against static configurations: the autoscalers, hot keys split, the load
balancer and DSC placement, a subsection each from its own result file."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from .common import fmt, fraction, load, opening, verdict

CONTROLLERS_TITLE = "Controllers"
AUTOSCALER_TITLE = "Autoscalers"
BALANCER_TITLE = "Load balancer"
PLACEMENT_TITLE = "DSC placement"
HOTKEYS_TITLE = "Hot-key split"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def _outcomes(summary: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in summary["decisions"].items()) or "none"


def _reconfigurations(run: dict) -> str:
    """One clause on the reconfigurations a controller made in a run."""
    recs = run["reconfigurations"]
    if not recs:
        return "no reconfiguration"
    done = sum(r["status"] == "completed" for r in recs)
    pause = max((r["max_pause_ms"] or 0.0 for r in recs), default=0.0)
    total = max((r["timings_ms"].get("total") or 0.0 for r in recs), default=0.0)
    return (
        f"{len(recs)} reconfigurations ({done} completed), longest {fmt(total)} ms, "
        f"pause {fmt(pause)} ms"
    )


def _controller_header(d: dict, title: str, what: str) -> list[str]:
    c = d["controller"]
    return [
        *opening(
            title,
            f"`{d['job']}` on {d['workers']} local workers, {fmt(d['duration_s'])} s runs; "
            f"`{c['builtin']}` attached at {fmt(d['warmup_s'])} s, figures per "
            f"{fmt(d['sample_s'])} s window after that. {what}",
            d["command"],
            level=3,
        ),
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

# The autoscalers' targets: p99 back under its limit within this long after the step up,
# at most this many reconfigurations a step, scaled in within this long after the step
# down, and no reconfiguration at steady load.
UP_WITHIN_S = 5.0
RECONFIGS_PER_STEP = 2
DOWN_WITHIN_S = 30.0


def _seconds(x: float | None, never: str = "not by the end") -> str:
    return never if x is None else f"{fmt(x)} s"


def _safety(d: dict) -> str:
    """The host's cooldowns of the run's controllers, as a clause (empty if not recorded)."""
    safety = (d.get("controller") or {}).get("safety") or {}
    if "cooldown_s" not in safety:
        return ""
    out = f", cooldown {fmt(safety['cooldown_s'])} s"
    if safety.get("scale_out_cooldown_s") is not None:
        out += f" ({fmt(safety['scale_out_cooldown_s'])} s to scale out)"
    return out


def _autoscaler_missed(x: dict) -> list[str]:
    """What a policy's run missed of the targets, each with its figure."""
    up, down = x["steps"]["up"], x["steps"]["down"]
    missed = []
    if up["recovery_s"] is None or up["recovery_s"] > UP_WITHIN_S:
        missed.append("up " + _seconds(up["recovery_s"], "not back"))
    most = max(up["reconfigurations"], down["reconfigurations"])
    if most > RECONFIGS_PER_STEP:
        missed.append(f"{most} reconfigs a step")
    if not x["scaled_in_s"]:  # 0: it never scaled out; None: not back in by the end
        missed.append("no scale-out" if x["scaled_in_s"] == 0 else "no scale-in")
    elif x["scaled_in_s"] > DOWN_WITHIN_S:
        missed.append(f"down {_seconds(x['scaled_in_s'])}")
    if x["steady_reconfigurations"]:
        missed.append(f"{x['steady_reconfigurations']} at steady load")
    return missed


def autoscaler_verdict(d: dict) -> str:
    summary = d["summary"]
    judged = [n for n in AUTOSCALER_NAMES if n in summary and n != "static"]
    met = [n for n in judged if not _autoscaler_missed(summary[n])]
    return f"met by {len(met)} of {len(judged)} policies" if met else "missed by every policy"


def autoscaler_section(d: dict) -> list[str]:
    summary = d["summary"]
    limit = fmt(d["controller"]["config"]["max_latency_ms"])
    policies = [name for name in AUTOSCALER_NAMES if name in summary]
    out = [
        *opening(
            AUTOSCALER_TITLE,
            f"`{d['job']}` on {d['workers']} local workers, {fmt(d['duration_s'])} s per "
            "policy; orders step from 4,000 to 12,000/s at 25% of the run and back at 60%; "
            f"attached at {fmt(d['warmup_s'])} s, metrics every {fmt(d['sample_s'])} s"
            f"{_safety(d)}. Last over: the last 1 s window with p99 over the limit.",
            d["command"],
            level=3,
        ),
        f"![{d['scenario']}](bench/results/controllers_{d['scenario']}.png)",
        "",
        f"| policy | up: last over {limit} ms | s over | peak p99 ms | reconfigs | "
        "down: scaled in after | reconfigs | at steady load | task-seconds | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    missed = []
    for name in policies:
        x = summary[name]
        up, down = x["steps"]["up"], x["steps"]["down"]
        scaled = "no scale-out" if x["scaled_in_s"] == 0 else _seconds(x["scaled_in_s"])
        short = _autoscaler_missed(x)
        if name != "static" and short:
            missed.append(AUTOSCALER_NAMES[name].split(" ")[0])
        met = "-" if name == "static" else f"no: {', '.join(short)}" if short else "yes"
        out.append(
            f"| {AUTOSCALER_NAMES[name]} | {_seconds(up['recovery_s'], 'at the step down')}"
            f" | {fmt(up['seconds_over'])} | {fmt(up['peak_p99_ms'])} | "
            f"{up['reconfigurations']} | {scaled if name != 'static' else '-'} | "
            f"{down['reconfigurations']} | {x['steady_reconfigurations']} | "
            f"{fmt(x['task_seconds']['total'])} | {met} |"
        )
    return [
        *out,
        "",
        *verdict(
            f"p99 under the limit within {UP_WITHIN_S:g} s of the step up, at most "
            f"{RECONFIGS_PER_STEP} reconfigurations a step, scaled in within "
            f"{DOWN_WITHIN_S:g} s of the step down, none at steady load",
            [f"by {', '.join(missed)}"] if missed else [],
            "the met column says what",
        ),
    ]


def hotkeys_section(d: dict) -> list[str]:
    summary = d["summary"]
    one, two = (summary[w]["words_per_s"]["median"] for w in ("1 way", "2 ways"))
    out = [
        *opening(
            HOTKEYS_TITLE,
            f"`{d['job']}` with `aggregate`, {fmt(d['params']['work_us'])} µs per word "
            "counted, Zipf 2.0 over 10,000 words (the top one ~61%), 3 count tasks on "
            f'{d["workers"]} workers, {fmt(d["duration_s"])} s runs. "N ways": unthrottled, '
            'the top word split over N tasks first; "static", "balancer" '
            f"(`load_balancer`): {fmt((one + two) / 2)} words/s offered.",
            d["command"],
            level=3,
        ),
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
    missed = hotkeys_missed(d)
    return [*out, "", *verdict(HOTKEYS_TARGET, missed, "" if not missed else HOTKEYS_WHY)]


HOTKEYS_TARGET = "with splitting, throughput grows with the number of tasks for the hot key"
HOTKEYS_WHY = "three CPU-bound count tasks share two cores"


def hotkeys_missed(d: dict) -> list[str]:
    """The unthrottled runs whose words/s did not grow over the run with one way fewer."""
    ways = [(w, x["words_per_s"]["median"]) for w, x in d["summary"].items() if "way" in w]
    return [f"{w} ({fmt(b)} <= {fmt(a)})" for (_, a), (w, b) in itertools.pairwise(ways) if b <= a]


def hotkeys_verdict(d: dict) -> str:
    missed = hotkeys_missed(d)
    return "met" if not missed else f"missed: {', '.join(missed)}"


def balancer_section(d: dict) -> list[str]:
    a, s = d["summary"]["balancer"], d["summary"]["static"]
    threshold = d["controller"]["config"]["threshold"]
    out = _controller_header(d, BALANCER_TITLE, "Static keeps the initial even split.")
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
        "Balancer / static: mean imbalance "
        f"{_ratio(a['imbalance']['mean'], s['imbalance']['mean'])}, p99 median "
        f"{_ratio(a['p99_ms']['median'], s['p99_ms']['median'])}; "
        + _reconfigurations(d["runs"]["balancer"])
        + ". No task is saturated here, so even load does not lower latency; the p99 bursts "
        f"(to {fmt(a['p99_ms']['max'])} ms) are unexplained."
    )
    return out + _table("load_balancer", "static", rows, a, closing)


def placement_section(d: dict) -> list[str]:
    a, s = d["summary"]["dsc"], d["summary"]["round-robin"]
    out = _controller_header(
        d,
        PLACEMENT_TITLE,
        "Both start round-robin (task k on worker k mod n), unthrottled.",
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
        "DSC / round-robin: crossing share "
        f"{_ratio(a['cross_fraction'], s['cross_fraction'])}, mean throughput "
        f"{_ratio(a['words_per_s']['mean'], s['words_per_s']['mean'])}"
    )
    if a.get("words_per_s_before_and_after"):
        before, after = a["words_per_s_before_and_after"]
        closing += (
            "; within the DSC run (runs vary), after / before its re-placement "
            f"{_ratio(after['mean'], before['mean'])}"
        )
    closing += "; " + _reconfigurations(d["runs"]["dsc"]) + "."
    return out + _table("dsc_placement", "round-robin", rows, a, closing)


# Each scenario: its section, its title and its verdict for the page's index.
CONTROLLER_SECTIONS = {
    "autoscaler": autoscaler_section,
    "balancer": balancer_section,
    "placement": placement_section,
    "hotkeys": hotkeys_section,
}
CONTROLLER_INDEX: dict[str, tuple[str, Callable[[dict], str]]] = {
    "autoscaler": (AUTOSCALER_TITLE, autoscaler_verdict),
    "balancer": (BALANCER_TITLE, lambda d: "no target"),
    "placement": (PLACEMENT_TITLE, lambda d: "no target"),
    "hotkeys": (HOTKEYS_TITLE, hotkeys_verdict),
}


def controllers_found() -> dict[str, dict]:
    """The scenarios whose results are present, in the page's order."""
    return {name: d for name in CONTROLLER_SECTIONS if (d := load(f"controllers_{name}"))}


def controllers_section(found: dict[str, dict]) -> list[str]:
    if not found:
        return []
    out = [
        f"## {CONTROLLERS_TITLE}",
        "",
        "Each run on its own `streampilot server`, through REST, with built-in controllers "
        "and without (static). Plots need the `bench` extra.",
        "",
    ]
    for name, d in found.items():
        out += CONTROLLER_SECTIONS[name](d)
    return out
