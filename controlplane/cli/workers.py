"""``streampilot workers list|add|drain``: the cluster's worker processes."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .client import Client
from .output import console, table
from .remote import rest_command

__all__ = ["app"]

app = typer.Typer(help="List, add and drain workers.", no_args_is_help=True)


def _print_workers(workers: list[dict[str, Any]]) -> None:
    rows = [
        (
            w["id"],
            w["host"],
            w["pid"],
            w["status"],
            f"{w['cpu_percent']:.0f}%",
            f"{w['rss_mb']:.0f} MB",
            ", ".join(w["tasks"]) or "-",
        )
        for w in workers
    ]
    console.print(table(None, ("id", "host", "pid", "status", "cpu", "rss", "tasks"), rows))


@rest_command(app, "list", _print_workers)
def list_workers(api: Client) -> list[dict[str, Any]]:
    """Every worker that registered (lost ones too), with the tasks it hosts."""
    return api.get("/workers")


@rest_command(app, "add", _print_workers)
def add(
    api: Client,
    count: Annotated[int, typer.Argument(min=1, max=16, help="workers to start")] = 1,
) -> list[dict[str, Any]]:
    """Start COUNT workers with the server's backend; returns once they have registered."""
    return api.post("/workers", {"count": count})


@rest_command(app, "drain", lambda worker: _print_workers([worker]))
def drain(
    api: Client, worker_id: Annotated[str, typer.Argument(help="worker id, e.g. w2")]
) -> dict[str, Any]:
    """Stop a worker that hosts no task of a running job.

    Refused, naming the tasks, if it does: migrate them first."""
    return api.delete(f"/workers/{worker_id}")
