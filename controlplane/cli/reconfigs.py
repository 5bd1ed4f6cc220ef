"""``streampilot reconfig list|show|cancel``: a job's reconfigurations, with their timings,
and cancelling one under way; and :func:`print_reconfiguration`, which ``reconfigure`` and
the demo print them with."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .client import TERMINAL_RECONFIGURATION, Client
from .output import console, fail, fmt_ms, table, when
from .remote import JobArg, LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app", "describe_op", "print_preview", "print_reconfiguration", "print_timings"]

app = typer.Typer(
    help="A job's reconfigurations: status, operations, timings.", no_args_is_help=True
)

PHASES = ("prepare", "sync", "update", "total")
CANCEL_TIMEOUT_S = 30.0  # a cancelled change ends at its next safe point, well within this

ReconfigurationArg = Annotated[int, typer.Argument(help="reconfiguration id", min=1)]


def describe_op(op: dict[str, Any]) -> str:
    """One plan operation in a few words."""
    name = op["operator"]
    if op["op"] == "assignWorkload":
        parts = ", ".join(
            f"{task} {len(w)} groups" if isinstance(w, list) else f"{task} weight {w:g}"
            for task, w in op["workload"].items()
        )
        return f"assignWorkload {name}: {parts}"
    if op["op"] == "assignResource":
        where = "removed" if op["worker"] is None else f"-> {op['worker']}"
        return f"assignResource {name}: {op['task']} {where}"
    tasks = op["tasks"] if op["tasks"] == "all" else ", ".join(op["tasks"])
    return f"assignLogic {name} ({tasks}) -> {op['ref']}"


def print_timings(rec: dict[str, Any]) -> None:
    """The phase timings and each affected task's pause and update time."""
    timings = rec["timings_ms"]
    console.print(
        "timings: " + "  ".join(f"{p} {fmt_ms(timings.get(p))}" for p in PHASES),
        highlight=False,
    )
    stages = rec.get("stage_ms") or []
    if rec.get("runs") is not None and (rec["runs"] > 1 or stages):
        # Stages can overlap (a stage window above 1): their times need not add up.
        staged = f", then {len(stages)} stages of {fmt_ms(max(stages))} at most" if stages else ""
        console.print(f"live runs: {rec['runs']}{staged}", highlight=False)
    pauses, updates = rec["pause_ms"], rec.get("update_ms", {})
    rows = [(t, fmt_ms(pauses.get(t)), fmt_ms(updates.get(t))) for t in sorted({*pauses, *updates})]
    if rows:
        console.print(table("per task", ("task", "pause", "update"), rows))
    copied = rec.get("precopied") or {}
    if copied:
        rows = [
            (
                w,
                fmt_bytes(c["bytes"]),
                f"{c['groups']:g}",
                fmt_ms(c["ms"]),
                fmt_ms(c.get("waited_ms")),
                fmt_ms(c.get("room_ms")),
                fmt_ms(c.get("sending_ms")),
                fmt_bytes(c.get("left_bytes")),
            )
            for w, c in sorted(copied.items())
        ]
        head = ("worker", "copied", "groups", "took", "idle wait", "receiver", "sending", "left")
        console.print(table("copied ahead in the prepare", head, rows))


def _print_ops(doc: dict[str, Any]) -> None:
    """A reconfiguration's (or a preview's) operations and the tasks they affect."""
    for op in doc["ops"]:
        console.print(f"  {describe_op(op)}", highlight=False, markup=False)
    console.print(f"affected: {', '.join(doc['affected_tasks']) or '-'}", highlight=False)


def print_reconfiguration(rec: dict[str, Any]) -> None:
    versions = f"version {rec['base_version']}"
    if rec["result_version"] is not None:
        versions += f" -> {rec['result_version']}"
    console.print(
        f"reconfiguration {rec['id']} of job {rec['job_id']}: {rec['origin']}, "
        f"[bold]{rec['status']}[/bold] ({versions}, {rec['mode']} mode)",
        highlight=False,
    )
    _print_ops(rec)
    if rec["error"]:
        console.print(f"error: {rec['error']}", highlight=False, markup=False)
    print_timings(rec)


def fmt_bytes(value: float | None) -> str:
    """A size of state as people read it (decimal units, as the console shows them)."""
    if value is None:
        return "not measured"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} B"


def print_preview(seen: dict[str, Any]) -> None:
    """What a reconfiguration would do (``reconfigure ... --dry-run``)."""
    pace = f"{seen['mode']} mode"
    if seen["mode"] == "fluid":
        per_step = seen["batch_size"] or "all"
        pace += f", {per_step} key groups per step: {seen['steps']} versions"
    console.print(
        f"{seen['origin']} would take version {seen['base_version']} to "
        f"{seen['result_version']} ({pace}); nothing was changed",
        highlight=False,
    )
    _print_ops(seen)
    diff = seen["diff"]
    changes = [
        (label, ", ".join(str(x if isinstance(x, str) else x[0]) for x in items))
        for op in diff["operators"]
        for label, items in (
            (f"{op['operator']}: new tasks", op["new_tasks"]),
            (f"{op['operator']}: removed tasks", op["removed_tasks"]),
            (f"{op['operator']}: moved tasks", op["moved_tasks"]),
            (f"{op['operator']}: logic changes", op["logic_changes"]),
        )
        if items
    ]
    if diff["new_workers"]:
        changes.append(("new workers", ", ".join(diff["new_workers"])))
    for label, what in changes:
        console.print(f"{label}: {what}", highlight=False, markup=False)
    console.print(
        f"key groups changing task: {seen['key_group_moves']}; keyed state shipped between "
        f"workers: {fmt_bytes(seen['state_bytes_shipped'])}"
        + (
            f" ({fmt_bytes(seen['largest_step_bytes'])} in its largest step)"
            if seen["steps"] > 1
            else ""
        ),
        highlight=False,
    )


def _print_list(page: dict[str, Any]) -> None:
    rows = [
        (
            r["id"],
            r["origin"],
            r["status"],
            f"{r['base_version']} -> {r['result_version'] or '-'}",
            len(r["affected_tasks"]),
            fmt_ms(r["timings_ms"].get("total")),
            when(r["created_at"]),
        )
        for r in page["items"]
    ]
    columns = ("id", "origin", "status", "versions", "affected", "total", "created")
    console.print(table(None, columns, rows))
    page_footer(page, "reconfigurations")


@rest_command(app, "list", _print_list)
def list_reconfigurations(
    api: Client, job_id: JobArg, limit: LimitOpt = 50, offset: OffsetOpt = 0
) -> dict[str, Any]:
    """The job's reconfigurations, newest first."""
    return api.get(f"/jobs/{job_id}/reconfigurations", limit=limit, offset=offset)


@rest_command(app, "show", print_reconfiguration)
def show(api: Client, job_id: JobArg, reconfiguration_id: ReconfigurationArg) -> dict[str, Any]:
    """One reconfiguration: status, operations, timings, pause and update time per task.

    Also the tasks it affected and, if it failed, why."""
    return api.get(f"/jobs/{job_id}/reconfigurations/{reconfiguration_id}")


def _check_cancelled(rec: dict[str, Any]) -> None:
    if rec["status"] in TERMINAL_RECONFIGURATION and rec["status"] != "cancelled":
        fail(f"reconfiguration {rec['id']} {rec['status']} before the cancel took effect", 1)


@rest_command(app, "cancel", print_reconfiguration, check=_check_cancelled)
def cancel(
    api: Client,
    job_id: JobArg,
    reconfiguration_id: ReconfigurationArg,
    wait: Annotated[
        bool, typer.Option(help="wait until it has ended and print how it ended")
    ] = True,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait at most")] = (
        CANCEL_TIMEOUT_S
    ),
) -> dict[str, Any]:
    """Cancel a reconfiguration under way: it stops at its next safe point.

    Preparing or syncing, it aborts: the job goes on as before it.

    In fluid mode no further step or stage starts; those made stay applied.

    A change in pause mode that is already moving state cannot be stopped.

    Exit status 1 when refused, or when it ended otherwise (it completed first)."""
    rec = api.post(f"/jobs/{job_id}/reconfigurations/{reconfiguration_id}/cancel")
    if wait:
        rec = api.wait_reconfiguration(job_id, reconfiguration_id, timeout)
    return rec
