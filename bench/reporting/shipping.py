"""Shipping state: the CPU a copy of state costs on each end, and copying state ahead on
the worker's thread against from a forked child."""

from __future__ import annotations

from .common import fmt, opening

STATE_TRANSFER_TITLE = "State shipping"
FORK_COPY_TITLE = "Copy ahead: thread or fork"


def state_transfer_section(d: dict) -> list[str]:
    out = [
        *opening(
            STATE_TRANSFER_TITLE,
            f"A sender process copies {fmt(d['mb'])} MB of word-count state (64 key groups) "
            "ahead to a receiver process, nothing else running; medians. `no pool`: without "
            "the receiver's reused buffers.",
            d["command"],
        ),
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
        *opening(
            FORK_COPY_TITLE,
            f"A process with {fmt(d['state_mb'])} MB of word-count state applies "
            f"{fmt(d['updates'])} records while every key group is copied to a socket: not at "
            "all, on its thread between records (as workers do), or by a forked child; "
            "medians. The copy's CPU: the parent's over `none`.",
            d["command"],
        ),
        "| variant | parent CPU ms | of it, the copy's | parent page faults | fork ms | wall ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in d["medians"].items():
        out.append(
            f"| {name} | {fmt(v['parent_cpu_ms'])} | {fmt(v['copy_cpu_ms_on_parent'])} "
            f"| {fmt(v['parent_page_faults'])} | {fmt(v['fork_ms'])} | {fmt(v['wall_ms'])} |"
        )
    return [
        *out,
        "",
        "Forked copies, tried in the workers, did not shorten changes: left out.",
        "",
    ]
