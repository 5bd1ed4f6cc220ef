"""``streampilot job submit|list|show|stop``: jobs on a StreamManager, over REST
(``submit --from-savepoint``, ``stop --savepoint``: see :mod:`.savepoints`)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer

from .checkpoints import describe_policy, describe_restart
from .client import Client
from .local import parse_params
from .output import console, fail, record_table, table, when
from .remote import JobArg, LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app", "print_job"]

app = typer.Typer(help="Submit, list, show and stop jobs.", no_args_is_help=True)


def print_job(job: dict[str, Any]) -> None:
    console.print(
        record_table(
            [
                ("id", job["id"]),
                ("name", job["name"]),
                ("job", job["job"]),
                ("params", json.dumps(job["params"])),
                ("status", job["status"]),
                ("version", job["version"]),
                ("checkpoints", describe_policy(job.get("checkpoints"))),
                ("restarts", describe_restart(job.get("restart"))),
                ("from savepoint", job.get("from_savepoint") or "-"),
                *([("savepoint", job["savepoint"]["ref"])] if "savepoint" in job else []),
                ("error", job["error"]),
                ("created", when(job["created_at"])),
                ("updated", when(job["updated_at"])),
            ]
        )
    )


def parse_interval(value: str | None) -> dict[str, Any]:
    """``--checkpoint-interval`` as the submission's ``checkpoints`` object: seconds, or
    ``0`` / ``off`` for none; nothing when not given (the server's default)."""
    if value is None:
        return {}
    if value.strip().lower() == "off":
        return {"interval_s": None}
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds == 0:
        return {"interval_s": None}
    if not 0 < seconds < math.inf:  # also refuses nan
        raise typer.BadParameter(
            f"expected seconds above 0, or 0 / off for no checkpoints; got {value!r}",
            param_hint="--checkpoint-interval",
        )
    return {"interval_s": seconds}


def _failed(job: dict[str, Any]) -> None:
    if job["status"] == "failed":
        fail(f"job {job['id']} failed: {job['error']}", 1)


@rest_command(app, "submit", print_job, check=_failed)
def submit(
    api: Client,
    job_ref: Annotated[str, typer.Argument(help="package.module:callable (or code:<id>:callable)")],
    param: Annotated[
        list[str], typer.Option("--param", "-p", help="job parameter NAME=VALUE")
    ] = [],  # noqa: B006
    name: Annotated[
        str | None, typer.Option(help="a name for people (default: the module's name)")
    ] = None,
    checkpoint_interval: Annotated[
        str | None,
        typer.Option(
            metavar="SECONDS",
            help="checkpoint the job every SECONDS (0 or off: never; default: the server's)",
        ),
    ] = None,
    max_failures: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            min=0,
            help=(
                "the job recovers from its last checkpoint at most N times within the "
                "server's restart window (0: it fails at its first failure; default: the "
                "server's)"
            ),
        ),
    ] = None,
    from_savepoint: Annotated[
        str | None,
        typer.Option(
            metavar="JOB/SAVEPOINT",
            help="start from this savepoint (its ref, e.g. 3/14: see savepoints list)",
        ),
    ] = None,
) -> dict[str, Any]:
    """Submit a job: the server builds, deploys and starts it.

    Exits 1 if the job failed to deploy."""
    params = parse_params(param)
    checkpoints = parse_interval(checkpoint_interval)
    name = name or job_ref.partition(":")[0].rsplit(".", 1)[-1] or job_ref
    body: dict[str, Any] = {"name": name, "job": job_ref, "params": params}
    if checkpoints:
        body["checkpoints"] = checkpoints
    if max_failures is not None:
        body["restart"] = {"max_failures": max_failures}
    if from_savepoint is not None:
        body["from_savepoint"] = from_savepoint
    return api.post("/jobs", body)


def _print_jobs(page: dict[str, Any]) -> None:
    rows = [
        (j["id"], j["name"], j["job"], j["status"], j["version"], when(j["created_at"]))
        for j in page["items"]
    ]
    console.print(table(None, ("id", "name", "job", "status", "version", "created"), rows))
    page_footer(page, "jobs")


@rest_command(app, "list", _print_jobs)
def list_jobs(
    api: Client,
    status: Annotated[
        str | None,
        typer.Option(help="only jobs in this status (running, finished, failed, stopped, ...)"),
    ] = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
) -> dict[str, Any]:
    """Jobs, newest first."""
    return api.get("/jobs", status=status, limit=limit, offset=offset)


@rest_command(app, "show", print_job)
def show(api: Client, job_id: JobArg) -> dict[str, Any]:
    """One job: its reference, params, status, current abstraction version and error."""
    return api.get(f"/jobs/{job_id}")


@rest_command(app, "stop", print_job)
def stop(
    api: Client,
    job_id: JobArg,
    savepoint: Annotated[
        bool,
        typer.Option(
            "--savepoint",
            help="stop with a savepoint: the job stops once it is complete, its sinks having "
            "committed everything up to it (its ref is printed)",
        ),
    ] = False,
) -> dict[str, Any]:
    """Stop a job (its records stay; stopping a job that has ended changes nothing).

    With --savepoint, exits 1 (the job runs on) if the savepoint could not be taken."""
    if not savepoint:
        return api.delete(f"/jobs/{job_id}")
    taken = api.post(f"/jobs/{job_id}/savepoints", {"stop": True})
    return {**api.get(f"/jobs/{job_id}"), "savepoint": taken}
