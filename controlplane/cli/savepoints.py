"""``streampilot savepoints trigger|list|show|delete``: a job's savepoints, over REST.

A savepoint's ``ref`` (``<job id>/<savepoint id>``) is what ``job submit
--from-savepoint`` takes; ``job stop --savepoint`` stops a job with one.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.statuses import CheckpointStatus

from .client import Client
from .output import console, fmt_ms, record_table, table, when
from .reconfigs import fmt_bytes
from .remote import JobArg, LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app", "print_savepoint"]

app = typer.Typer(help="A job's savepoints: take one, list, show, delete.", no_args_is_help=True)

SavepointArg = Annotated[int, typer.Argument(help="savepoint id (the coordinator's)", min=1)]


def print_savepoint(sp: dict[str, Any]) -> None:
    console.print(
        record_table(
            [
                ("savepoint", sp["savepoint_id"]),
                ("ref", sp["ref"]),
                ("job", sp["job_id"]),
                ("status", sp["status"]),
                ("version", sp["version"]),
                ("tasks", sp["tasks"]),
                ("state", fmt_bytes(sp["full_bytes"])),
                ("started", when(sp["started_at"])),
                ("took", fmt_ms(sp["duration_ms"])),
                ("path", sp["path"]),
                ("error", sp["error"]),
            ]
        )
    )


def _print_list(page: dict[str, Any]) -> None:
    rows = [
        (
            s["savepoint_id"],
            s["ref"],
            s["status"],
            s["version"],
            fmt_bytes(s["full_bytes"]),
            when(s["started_at"]),
            fmt_ms(s["duration_ms"]),
        )
        for s in page["items"]
    ]
    columns = ("id", "ref", "status", "version", "state", "started", "took")
    console.print(table(None, columns, rows))
    page_footer(page, "savepoints")


@rest_command(app, "trigger", print_savepoint)
def trigger(
    api: Client,
    job_id: JobArg,
    stop: Annotated[
        bool, typer.Option("--stop", help="stop the job once the savepoint is complete")
    ] = False,
) -> dict[str, Any]:
    """Take a savepoint of a running job; waits until it is complete.

    Exits 1 (the job runs on) if none could be taken."""
    return api.post(f"/jobs/{job_id}/savepoints", {"stop": stop})


@rest_command(app, "list", _print_list)
def list_savepoints(
    api: Client,
    job_id: JobArg,
    status: Annotated[
        CheckpointStatus | None, typer.Option(help="only savepoints in this status")
    ] = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
) -> dict[str, Any]:
    """The job's savepoints, newest first."""
    return api.get(f"/jobs/{job_id}/savepoints", status=status, limit=limit, offset=offset)


@rest_command(app, "show", print_savepoint)
def show(api: Client, job_id: JobArg, savepoint_id: SavepointArg) -> dict[str, Any]:
    """One savepoint: status, ref, the state it holds, its path."""
    return api.get(f"/jobs/{job_id}/savepoints/{savepoint_id}")


def _print_deleted(answer: dict[str, Any]) -> None:
    console.print(f"savepoint {answer['ref']} deleted", highlight=False)


@rest_command(app, "delete", _print_deleted)
def delete(api: Client, job_id: JobArg, savepoint_id: SavepointArg) -> dict[str, Any]:
    """Delete a savepoint and its files (jobs started from it are not affected)."""
    api.delete(f"/jobs/{job_id}/savepoints/{savepoint_id}")
    return {"ref": f"{job_id}/{savepoint_id}"}
