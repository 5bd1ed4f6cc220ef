"""The runtime's speed: the word count's throughput and latency against its targets, the
Spark backend against local, and the Nexmark queries (with where their time goes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import day, fmt, opening, rounds_of, spread, verdict

# The runtime's targets for the word count.
TARGET_WORDS_PER_S = 400_000
TARGET_P99_MS = 50.0


THROUGHPUT_TITLE = "Throughput and latency"


def _throughput_missed(d: dict) -> list[str]:
    peak, p99 = d["max_throughput"]["steady_words_per_s"], d["latency_at_half"]["latency_ms"]
    return [
        name
        for name, ok in (
            ("throughput", peak >= TARGET_WORDS_PER_S),
            ("p99", p99["p99_ms"] is not None and p99["p99_ms"] < TARGET_P99_MS),
        )
        if not ok
    ]


def throughput_verdict(d: dict) -> str:
    missed = _throughput_missed(d)
    return "met" if not missed else f"missed: {', '.join(missed)}"


def throughput_section(d: dict) -> list[str]:
    peak, half = d["max_throughput"], d["latency_at_half"]
    lat, w = half["latency_ms"], d["workload"]
    return [
        *opening(
            THROUGHPUT_TITLE,
            f"Word count on {d['workers']} local workers (Zipf {w['zipf']} over "
            f"{w['keys']:,} words, {w['words_per_sentence']} per sentence, batches of "
            f"{d['config']['batch_size']} or {d['config']['linger_s'] * 1000:g} ms), "
            "unthrottled, then at half rate.",
            d["command"],
        ),
        "| measure | result |",
        "|---|---|",
        f"| max sustained throughput (median of per-second rates) | "
        f"{fmt(peak['steady_words_per_s'])} words/s |",
        f"| overall rate of the bounded run ({fmt(peak['words'])} words) | "
        f"{fmt(peak['overall_words_per_s'])} words/s |",
        f"| p50 / p99 / max latency at {fmt(half['measured_words_per_s'])} words/s | "
        f"{fmt(lat['p50_ms'])} / {fmt(lat['p99_ms'])} / {fmt(lat['max_ms'])} ms |",
        "",
        *verdict(
            f">= {TARGET_WORDS_PER_S:,} words/s, p99 < {TARGET_P99_MS:g} ms",
            _throughput_missed(d),
        ),
    ]


SPARK_TITLE = "Spark backend"
NEXMARK_TITLE = "Nexmark"


def spark_section(d: dict) -> list[str]:
    local, spark = d["backends"]["local"], d["backends"]["spark"]

    def row(name: str, get: Callable[[dict], Any], unit: str) -> str:
        a, b = get(local), get(spark)
        ratio = f"{b / a:.2f}" if a and b is not None else "n/a"
        return f"| {name} | {fmt(a)}{unit} | {fmt(b)}{unit} | {ratio} |"

    def plan(kind: str, field: str) -> Callable[[dict], Any]:
        return lambda b: b["plans"][kind][field]

    return [
        *opening(
            SPARK_TITLE,
            f"Word count on {d['workers']} workers each, Spark `{d['spark_master']}` (session "
            f"start {fmt(d['spark_session_start_s'])} s), medians of "
            f"{len(local['max_throughput']['steady_words_per_s_rounds'])} interleaved runs; "
            f"latency and plans at {d.get('load', 0.5):.0%} of the local maximum.",
            d["command"],
        ),
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


def _nexmark_row(r: dict, flink: dict) -> str:
    peak = flink.get(r["query"]) if r["workers"] == 1 else None
    rescale = r.get("rescale_completion_ms")
    return (
        f"| {r['query']} | {r['workers']} | {spread({**r['events_per_s'], 'n': 3}, 0)} | "
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
    days = sorted({day(r.get("date", d["date"])) for r in results})
    prof = d.get("profile") or {}
    where = (
        "Own time (cProfile, one pipeline, one process): "
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
        *opening(
            NEXMARK_TITLE,
            f"Nexmark queries on local workers ({d['workload']['partitions']} source "
            f"partitions, {d['workload']['events']:,} events a run, "
            f"{rounds_of(d['workload']['rounds'])}, {', '.join(days)}): events/s unthrottled; "
            "at half that, p50 / p99 from event time and a live rescale of the stateful "
            "operator (completion / max latency). Flink 1.13's figures are per core.",
            d["command"],
        ),
        "| query | workers | events/s [range] | p50 / p99 ms | rescale / max ms | Flink |",
        "|---|---|---|---|---|---|",
        *(_nexmark_row(r, flink) for r in results),
        "",
        *([where, ""] if where else []),
    ]
