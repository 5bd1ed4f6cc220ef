"""``streampilot abstraction show|diff``: a job's task-centric abstraction (docs/design.md,
section 2) and what changed between two of its versions."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

import typer

from .client import Client
from .output import console, group_ranges, table
from .remote import JobArg, rest_command

__all__ = ["app"]

app = typer.Typer(
    help="A job's abstraction: tasks, key groups, logic, workers.", no_args_is_help=True
)


def _workload(workload: dict[str, Any]) -> str:
    groups = workload.get("key_groups")
    if groups is None:
        return f"weight {workload.get('weight', 0):g}"
    return f"{len(groups)} groups: {group_ranges(groups)}"


def _print_abstraction(a: dict[str, Any]) -> None:
    job = a["job"]
    console.print(
        f"job {job['id']} [bold]{job['name']}[/bold], version {job['version']} ({job['status']})",
        highlight=False,
    )
    rows = [
        (
            op["name"],
            t["id"],
            f"{t['logic']['ref']} v{t['logic']['version']}",
            _workload(t["workload"]),
            t["resources"]["worker"],
        )
        for op in a["operators"]
        for t in op["tasks"]
    ]
    console.print(table("tasks", ("operator", "task", "logic", "workload", "worker"), rows))
    workers = [
        (w["id"], w["host"], w["status"], w["slots"], f"{w['cpus']:g}", w["memory_mb"])
        for w in a["workers"]
    ]
    console.print(table("workers", ("id", "host", "status", "slots", "cpus", "MB"), workers))


def _diff_rows(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for op in d["operators"]:
        name = op["operator"]
        moves: dict[tuple[str, str], list[int]] = defaultdict(list)
        for group, old, new in op["key_group_moves"]:
            moves[(old, new)].append(group)
        for (old, new), groups in sorted(moves.items()):
            rows.append((name, "key groups", f"{old} -> {new}: {group_ranges(groups)}"))
        for partition, old, new in op.get("partition_moves", ()):
            rows.append((name, "partition", f"{partition}: {old} -> {new}"))
        for task, old_w, new_w in op["weight_changes"]:
            rows.append((name, "weight", f"{task}: {old_w:g} -> {new_w:g}"))
        rows += [(name, "new task", t) for t in op["new_tasks"]]
        rows += [(name, "removed task", t) for t in op["removed_tasks"]]
        for task, old, new in op["moved_tasks"]:
            rows.append((name, "moved task", f"{task}: {old} -> {new}"))
        for task, old, new in op["logic_changes"]:
            rows.append(
                (
                    name,
                    "logic",
                    f"{task}: {old['ref']} v{old['version']} -> {new['ref']} v{new['version']}",
                )
            )
    rows += [("", "new worker", w) for w in d["new_workers"]]
    rows += [("", "removed worker", w) for w in d["removed_workers"]]
    return rows


def _print_diff(d: dict[str, Any]) -> None:
    console.print(
        f"job {d['job_id']}: version {d['old_version']} -> {d['new_version']}", highlight=False
    )
    rows = _diff_rows(d)
    if rows:
        console.print(table(None, ("operator", "change", "detail"), rows))
    else:
        console.print("no change")
    console.print(f"affected tasks: {', '.join(d['affected']) or '-'}", highlight=False)


@rest_command(app, "show", _print_abstraction)
def show(
    api: Client,
    job_id: JobArg,
    version: Annotated[int | None, typer.Option(min=1, help="an old version")] = None,
) -> dict[str, Any]:
    """A job's tasks (logic, key groups or weight, worker) and workers.

    The current version unless --version is given."""
    return api.get(f"/jobs/{job_id}/abstraction", version=version)


@rest_command(app, "diff", _print_diff)
def diff(
    api: Client,
    job_id: JobArg,
    old: Annotated[
        int | None, typer.Option("--from", min=1, help="default: the version before --to")
    ] = None,
    new: Annotated[int | None, typer.Option("--to", min=1, help="default: the current one")] = None,
) -> dict[str, Any]:
    """What changed between two versions of a job's abstraction.

    Key-group moves, weight changes, new, removed and moved tasks, logic changes, and the
    tasks a reconfiguration between them affects."""
    return api.get(f"/jobs/{job_id}/abstraction/diff", **{"from": old, "to": new})
