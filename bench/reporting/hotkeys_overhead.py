"""The hot-key sketch's cost: the word count with it on and off, its cost per batch against
the keyed processing, and the bytes the console reads for a keyed operator
(bench/hotkeys_overhead.py); "not measured yet" until its results file exists."""

from __future__ import annotations

from .common import fmt, opening, rounds_of, spread

HOTKEYS_OVERHEAD_TITLE = "Hot-key sketch cost"
COMMAND = "python bench/hotkeys_overhead.py"
SWITCH = "`STREAMPILOT_HOT_KEYS=false` turns it off ([operations](docs/operations.md#settings))"


def hotkeys_overhead_verdict(d: dict | None) -> str:
    return "not measured yet" if d is None else "no target"


def hotkeys_overhead_section(d: dict | None) -> list[str]:
    """The section from the results, or a note that there are none yet."""
    what = (
        "Keyed tasks sketch their heaviest keys (Space-Saving, 64 counters, 8 records "
        f"sampled per batch) for `hot_keys` and the hot-key split; {SWITCH}."
    )
    if d is None:
        return [
            *opening(HOTKEYS_OVERHEAD_TITLE, what, None),
            f"Not measured yet: `{COMMAND}`.",
            "",
        ]
    payload = d["payload"]
    out = [
        *opening(
            HOTKEYS_OVERHEAD_TITLE,
            f"{what} The word count (8 words per sentence over {d['workload']['keys']:,} "
            f"words) unthrottled on {d['workers']} local workers, sketch on and off in "
            f"{rounds_of(d['rounds'])} alternating which goes first; a round's ratio is on / "
            f"off. Per batch: the count's keyed processing of {d['batch_size']} words against "
            "the sketch's feed, in one process.",
            d["command"],
        ),
        "| keys | words/s on [range] | words/s off [range] | on / off [range] | keyed µs per "
        "batch | sketch µs per batch | sketch / keyed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in d["end_to_end"].items():
        m = d["per_batch"][name]
        out.append(
            f"| {name}, Zipf {e['zipf']:g} | {spread(e['on_words_per_s'], 0)} | {spread(e['off_words_per_s'], 0)} | "
            f"{spread(e['on_over_off'], 3)} | {spread(m['keyed_us_per_batch'], 1)} | "
            f"{spread(m['sketch_us_per_batch'], 1)} | {m['sketch_over_keyed']:.1%} |"
        )
    out += [
        "",
        f"What the console reads for the count operator (max_parallelism "
        f"{payload['max_parallelism']}, {fmt(round(payload['words_per_s']))} words/s): its heat map "
        f"(`GET /jobs/{{id}}/metrics/series`, {payload['series_window_s']:g} s in "
        f"{payload['series_step_s']:g} s steps) and its tasks' entries in `GET "
        f"/jobs/{{id}}/metrics` ({payload['metrics_window_s']:g} s window).",
        "",
        "| count tasks | heat map bytes (cells) | gzipped | metrics entries bytes | of them hot_keys |",
        "|---|---|---|---|---|",
        *(
            f"| {tasks} | {fmt(p['heat_map_bytes'])} ({fmt(p['heat_map_cells'])}) | "
            f"{fmt(p['heat_map_gzip_bytes'])} | "
            f"{fmt(p['metrics_tasks_bytes'])} | {fmt(p['hot_keys_bytes'])} |"
            for tasks, p in payload["by_tasks"].items()
        ),
        "",
    ]
    return out
