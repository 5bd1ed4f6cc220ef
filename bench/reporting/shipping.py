"""Shipping state: the CPU a copy of state costs on each end, and copying state ahead on
the worker's thread against from a forked child."""

from __future__ import annotations

from .common import fmt, rerun


def state_transfer_section(d: dict) -> list[str]:
    out = [
        "## State shipping: CPU on each end",
        "",
        f"A sender process copies {fmt(d['mb'])} MB of word-count state (64 key groups) "
        "ahead to a receiver process through the workers' code, with nothing else running; "
        "medians of the rounds. `no pool` is the receiver without its reused buffers, "
        f"which faults in every payload's memory afresh. {rerun(d['command'])}",
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
        f"changes, so it was left out. {rerun(d['command'])}",
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
