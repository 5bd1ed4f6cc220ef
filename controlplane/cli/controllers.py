"""``streampilot controller upload|list|show|start|stop|logs|decisions``: controllers
attached to running jobs (a script defining one ``controllers.Controller`` subclass, or a
built-in by name), run by the server in their own processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from .client import Client
from .output import console, fail, record_table, table, when
from .remote import LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app"]

app = typer.Typer(help="Attach and follow controllers of running jobs.", no_args_is_help=True)

ControllerArg = Annotated[int, typer.Argument(min=1, help="controller id")]


def _print_controller(c: dict[str, Any]) -> None:
    console.print(
        record_table(
            [
                ("id", c["id"]),
                ("name", c["name"]),
                ("job", c["job_id"]),
                ("runs", c["builtin"] or f"{c['filename']} ({c['class_name']})"),
                ("status", c["status"]),
                ("error", c["error"] or "-"),
                ("every", f"{c['interval_s']:g} s"),
                ("config", json.dumps(c["config"]) if c["config"] else "-"),
                ("safety", json.dumps(c["safety"])),
                ("failures / restarts", f"{c['failures']} / {c['restarts']}"),
                ("decisions without a plan", c["decisions_without_plan"]),
                ("last decision", when(c["last_decision_at"]) or "-"),
            ]
        )
    )


def _print_list(page: dict[str, Any]) -> None:
    rows = [
        (
            c["id"],
            c["name"],
            c["job_id"],
            c["builtin"] or c["class_name"],
            c["status"],
            c["error"] or "",
        )
        for c in page["items"]
    ]
    console.print(table(None, ("id", "name", "job", "runs", "status", "error"), rows))
    page_footer(page, "controllers")


def _json_option(text: str | None, what: str) -> str | None:
    """``text`` if it is a JSON object (or a file holding one: ``@path``); exits 2 if not."""
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            fail(f"cannot read {what} file {text[1:]}: {exc.strerror}", 2)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not JSON: {exc.msg} at character {exc.pos}", 2)
    if not isinstance(value, dict):
        fail(f"{what} must be a JSON object", 2)
    return text


@rest_command(app, "upload", _print_controller)
def upload(
    api: Client,
    job_id: Annotated[int, typer.Argument(min=1, help="the job it controls")],
    file: Annotated[
        Path | None,
        typer.Argument(help="a .py file defining one Controller subclass", dir_okay=False),
    ] = None,
    builtin: Annotated[
        str | None,
        typer.Option(
            help="a built-in instead of a file: load_balancer, latency_autoscaler, "
            "dsc_placement, logic_updater"
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="default: the file's or built-in's")] = None,
    config: Annotated[
        str | None, typer.Option(help="JSON object for the controller, or @file")
    ] = None,
    safety: Annotated[
        str | None,
        typer.Option(
            help='JSON limits, or @file: {"cooldown_s", "scale_out_cooldown_s", '
            '"min_parallelism", "max_parallelism", "max_moves_per_hour", '
            '"max_state_bytes_per_step"}'
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="record its plans without applying them")
    ] = False,
) -> dict[str, Any]:
    """Attach a controller to a running job and start it (422 names the line and the
    reason when the script cannot be loaded)."""
    if (file is None) == (builtin is None):
        fail("give a .py file or --builtin NAME (one of them)", 2)
    fields = {
        "job_id": str(job_id),
        "name": name or (file.stem if file is not None else builtin),
        "config": _json_option(config, "--config"),
        "safety": _json_option(safety, "--safety"),
        "dry_run": "true" if dry_run else "false",
    }
    if file is not None:
        if not file.is_file():
            fail(f"no such file: {file}", 2)
        return api.upload("/controllers", file, **fields)
    data = {k: v for k, v in {**fields, "builtin": builtin}.items() if v is not None}
    return api.request("POST", "/controllers", data=data)


@rest_command(app, "list", _print_list)
def list_controllers(
    api: Client,
    job: Annotated[int | None, typer.Option(min=1, help="only this job's")] = None,
    limit: LimitOpt = 50,
    offset: OffsetOpt = 0,
) -> dict[str, Any]:
    """Controllers, newest first."""
    return api.get("/controllers", job_id=job, limit=limit, offset=offset)


@rest_command(app, "show", _print_controller)
def show(api: Client, controller_id: ControllerArg) -> dict[str, Any]:
    """One controller: status, last error, failures and restarts."""
    return api.get(f"/controllers/{controller_id}")


@rest_command(app, "start", _print_controller)
def start(api: Client, controller_id: ControllerArg) -> dict[str, Any]:
    """Run a stopped or failed controller again (its failure count starts over)."""
    return api.post(f"/controllers/{controller_id}/start")


@rest_command(app, "stop", _print_controller)
def stop(api: Client, controller_id: ControllerArg) -> dict[str, Any]:
    """Stop a controller (a plan it already submitted goes on)."""
    return api.post(f"/controllers/{controller_id}/stop")


def _print_logs(page: dict[str, Any]) -> None:
    for line in reversed(page["items"]):
        console.print(f"{when(line['time'])}  {line['source']:<6} {line['message']}", markup=False)
    page_footer(page, "lines")


@rest_command(app, "logs", _print_logs)
def logs(
    api: Client, controller_id: ControllerArg, limit: LimitOpt = 50, offset: OffsetOpt = 0
) -> dict[str, Any]:
    """What the controller printed and what the host noted (oldest of the page first)."""
    return api.get(f"/controllers/{controller_id}/logs", limit=limit, offset=offset)


def _print_decisions(page: dict[str, Any]) -> None:
    rows = [
        (
            d["id"],
            when(d["time"]),
            ", ".join(sorted({op["op"] for op in d["plan"].get("ops", [])})),
            d["moves"],
            d["status"],
            d["reconfiguration_id"] or "-",
            d["error"] or "",
        )
        for d in page["items"]
    ]
    console.print(
        table(None, ("id", "time", "ops", "moves", "outcome", "reconfiguration", "error"), rows)
    )
    page_footer(page, "decisions")


@rest_command(app, "decisions", _print_decisions)
def decisions(
    api: Client, controller_id: ControllerArg, limit: LimitOpt = 50, offset: OffsetOpt = 0
) -> dict[str, Any]:
    """Every plan the controller returned, newest first, and what became of it."""
    return api.get(f"/controllers/{controller_id}/decisions", limit=limit, offset=offset)
