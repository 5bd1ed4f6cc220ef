"""``streampilot checkpoints list|show``: a job's checkpoints as the server recorded them,
and :func:`describe_policy` and :func:`describe_restart`, which ``job`` prints a job's
checkpoint and restart policies with."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.statuses import CheckpointStatus

from .client import Client
from .output import console, fmt_ms, record_table, table, when
from .reconfigs import fmt_bytes
from .remote import JobArg, LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app", "describe_policy", "describe_restart", "print_checkpoint"]

app = typer.Typer(help="A job's checkpoints: status, sizes, timings.", no_args_is_help=True)

CheckpointArg = Annotated[int, typer.Argument(help="checkpoint id (the coordinator's)", min=1)]


def describe_policy(policy: dict[str, Any] | None) -> str:
    """A job's checkpoint policy in a few words (``off`` when it has none)."""
    if policy is None:
        return "off"
    return (
        f"every {policy['interval_s']:g} s, timeout {policy['timeout_s']:g} s, "
        f"{policy['retained']} kept"
    )


def describe_restart(policy: dict[str, Any] | None) -> str:
    """A job's restart policy in a few words (``-`` when it has none recorded)."""
    if policy is None:
        return "-"
    delay = f"{policy['delay_s']:g} s after each" if policy["delay_s"] else "no delay"
    return f"recovers at most {policy['max_failures']} times in {policy['window_s']:g} s, {delay}"


def print_checkpoint(cp: dict[str, Any]) -> None:
    console.print(
        record_table(
            [
                ("checkpoint", cp["checkpoint_id"]),
                ("job", cp["job_id"]),
                ("status", cp["status"]),
                ("version", cp["version"]),
                ("tasks", cp["tasks"]),
                ("written", fmt_bytes(cp["bytes"])),
                ("state", fmt_bytes(cp["full_bytes"])),
                ("started", when(cp["started_at"])),
                ("took", fmt_ms(cp["duration_ms"])),
                ("path", cp["path"]),
                ("error", cp["error"]),
            ]
        )
    )


def _print_list(page: dict[str, Any]) -> None:
    rows = [
        (
            c["checkpoint_id"],
            c["status"],
            c["version"],
            c["tasks"],
            fmt_bytes(c["bytes"]),
            fmt_bytes(c["full_bytes"]),
            when(c["started_at"]),
            fmt_ms(c["duration_ms"]),
        )
        for c in page["items"]
    ]
    columns = ("id", "status", "version", "tasks", "written", "state", "started", "took")
    console.print(table(None, columns, rows))
    page_footer(page, "checkpoints")


@rest_command(app, "list", _print_list)
def list_checkpoints(
    api: Client,
    job_id: JobArg,
    status: Annotated[
        CheckpointStatus | None, typer.Option(help="only checkpoints in this status")
    ] = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
) -> dict[str, Any]:
    """The job's checkpoints, newest first."""
    return api.get(f"/jobs/{job_id}/checkpoints", status=status, limit=limit, offset=offset)


@rest_command(app, "show", print_checkpoint)
def show(api: Client, job_id: JobArg, checkpoint_id: CheckpointArg) -> dict[str, Any]:
    """One checkpoint: status, version, what it wrote, the state it restores, its path.

    And, if it was abandoned, why."""
    return api.get(f"/jobs/{job_id}/checkpoints/{checkpoint_id}")
