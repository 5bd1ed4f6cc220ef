"""``streampilot reconfigure scale|rebalance|migrate|logic|plan``: change a running job.

Each command posts one request (a helper, or a plan file of Trisk's operations), then,
unless ``--no-wait``, follows the reconfiguration it created: its phases are printed on
stderr as they change, until it ends or ``--timeout`` passes, and the record ends with its
timings (prepare, sync, update, total; the pause of each affected task). Exit status: 0
when it completed, 1 when it was refused, failed, was aborted or cancelled or did not end
in time, 2 for a plan file that cannot be read. With ``--dry-run`` nothing changes: the
request is validated as if made and what it would do is printed (exit status 0, or 1 when
it would be refused).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from .client import Client
from .output import emit, err, fail
from .reconfigs import print_preview, print_reconfiguration
from .remote import CONNECTION_OPTIONS, JobArg, command_with, connect, keyword_option

__all__ = ["DEFAULT_TIMEOUT_S", "app", "follow"]

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    help="Scale, rebalance, migrate or change the logic of a running job (live).",
    no_args_is_help=True,
)

DEFAULT_TIMEOUT_S = 60.0  # a scale-out with a fresh worker and 100 MB of state ends well within
FOLLOW_OPTIONS = (
    keyword_option(
        "wait",
        Annotated[
            bool,
            typer.Option(help="follow the reconfiguration until it ends and print its timings"),
        ],
        True,
    ),
    keyword_option(
        "timeout",
        Annotated[float, typer.Option(min=0.1, help="seconds to follow it at most")],
        DEFAULT_TIMEOUT_S,
    ),
)


def follow(api: Client, rec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Poll the reconfiguration ``rec`` until it ends or ``timeout`` seconds pass, printing
    each new phase on stderr; returns its last record."""
    started = time.monotonic()
    err.print(
        f"reconfiguration {rec['id']} of job {rec['job_id']} ({rec['origin']}): "
        f"affects {', '.join(rec['affected_tasks']) or 'no task'}",
        highlight=False,
    )

    def progress(r: dict[str, Any]) -> None:
        err.print(f"  {time.monotonic() - started:6.2f}s  {r['status']}", highlight=False)

    return api.wait_reconfiguration(rec["job_id"], rec["id"], timeout, progress)


DryRunOpt = keyword_option(
    "dry_run",
    Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="only say what it would do (the plan, the versions, the key groups and "
            "state it would move), validated as if made; nothing changes",
        ),
    ],
    False,
)

Request = tuple[str, dict[str, Any]]  # (endpoint under /jobs/{id}/, body)


def _command(name: str) -> Callable[[F], F]:
    """Register ``request(api, job_id, ...) -> (endpoint, body)`` as the command ``name``:
    it posts the body to the endpoint (or, with ``--dry-run``, asks for a preview of it)
    and, with ``--wait/--no-wait`` and ``--timeout``, follows the reconfiguration; see the
    module docstring for what it prints and its exit status."""

    def register(request: F) -> F:
        def run(
            *,
            server: str | None,
            token: str | None,
            as_json: bool,
            wait: bool,
            timeout: float,
            dry_run: bool,
            **arguments: Any,
        ) -> None:
            job_id = arguments["job_id"]
            with connect(server, token) as api:
                endpoint, body = request(api, **arguments)
                if dry_run:
                    preview = api.post(
                        f"/jobs/{job_id}/reconfigurations/preview", {"origin": name, **body}
                    )
                    emit(preview, as_json, print_preview)
                    return
                rec = api.post(f"/jobs/{job_id}/{endpoint}", body)
                if wait:
                    rec = follow(api, rec, timeout)
            emit(rec, as_json, print_reconfiguration)
            if rec["status"] in ("failed", "aborted", "cancelled"):
                fail(f"reconfiguration {rec['id']} {rec['status']}: {rec['error']}", 1)
            if wait and rec["status"] != "completed":
                fail(
                    f"reconfiguration {rec['id']} is still {rec['status']} after {timeout:g}s; "
                    f"follow it with: streampilot reconfig show {rec['job_id']} {rec['id']}",
                    1,
                )

        options = (*FOLLOW_OPTIONS, DryRunOpt, *CONNECTION_OPTIONS)
        app.command(name)(command_with(request, options, run))
        return request

    return register


def _read_plan(path: Path) -> dict[str, Any]:
    """The plan document in ``path`` (JSON: ``{"base_version"?, "ops": [...]}``); exits 2,
    naming the file and the problem, when it cannot be read."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read plan file {path}: {exc.strerror}", 2)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"plan file {path} is not JSON: {exc}", 2)
    if not isinstance(plan, dict):
        fail(f'plan file {path} must hold a JSON object {{"base_version", "ops": [...]}}', 2)
    return plan


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _fluid_pace(value: str | None) -> dict[str, Any] | None:
    """``--fluid``: key groups per step (0: one step) or a size of state per step."""
    if value is None:
        return None
    text = value.strip().lower().replace(" ", "")
    if text.isdigit():
        return {"mode": "fluid", "batch_size": int(text) or None}
    number = text.rstrip("bkmgi")
    unit = text[len(number) :]
    try:
        size = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise typer.BadParameter(
            f"give a number of key groups (e.g. 8; 0: one step) or a size of state with its "
            f"unit (e.g. 8MB, 512kB, 1GiB), not {value!r}"
        ) from None
    if size < 1:
        raise typer.BadParameter(f"a size of state per step must be at least 1 byte, not {value!r}")
    return {"mode": "fluid", "batch_bytes": int(size)}


FluidOpt = Annotated[
    dict[str, Any] | None,
    typer.Option(
        "--fluid",
        metavar="N|SIZE",
        parser=_fluid_pace,
        help="fluid mode: tasks that only give or gain key groups do not pause; each task "
        "gives or gains at most N key groups per step (0: all in one step), or about SIZE of "
        "state (e.g. 8MB: as many key groups as the measured state sizes make), the steps "
        "that only move key groups running as stages of one reconfiguration",
    ),
]


def _pace(fluid: dict[str, Any] | None) -> dict[str, Any]:
    return fluid or {}


@_command("scale")
def scale(
    api: Client,
    job_id: JobArg,
    operator: Annotated[str, typer.Argument(help="operator to scale")],
    parallelism: Annotated[int, typer.Argument(min=1, help="its number of tasks after")],
    worker: Annotated[
        list[str] | None,
        typer.Option(help='where new tasks go, in turn (repeat; "new" starts a fresh worker)'),
    ] = None,
    fluid: FluidOpt = None,
) -> Request:
    """Give an operator PARALLELISM tasks, moving as few key groups as possible.

    The operators forward-connected to it scale with it."""
    body = {"operator": operator, "parallelism": parallelism, "workers": worker or None}
    return "scale", {**body, **_pace(fluid)}


@_command("rebalance")
def rebalance(
    api: Client,
    job_id: JobArg,
    operator: Annotated[str, typer.Argument(help="operator to rebalance")],
    threshold: Annotated[
        float,
        typer.Option(min=0, help="do nothing unless the busiest task is this far above the mean"),
    ] = 0.1,
    window: Annotated[
        float, typer.Option(min=0.1, max=300, help="seconds of measured load to balance")
    ] = 10.0,
    fluid: FluidOpt = None,
) -> Request:
    """Even out an operator's measured load over its tasks (same tasks, same workers)."""
    body = {"operator": operator, "threshold": threshold, "window_s": window}
    return "rebalance", {**body, **_pace(fluid)}


@_command("migrate")
def migrate(
    api: Client,
    job_id: JobArg,
    task: Annotated[str, typer.Argument(help="task to move, e.g. count-0")],
    worker: Annotated[str, typer.Argument(help='worker id, or "new" for a fresh worker')],
    with_forward: Annotated[
        bool,
        typer.Option(
            "--with-forward",
            help="also move the tasks forward edges link to it (e.g. count-0 with sink-0)",
        ),
    ] = False,
    fluid: FluidOpt = None,
) -> Request:
    """Move one task, with its state, to another worker (with --fluid N, a keyed task hands
    its key groups over N at a time through a stand-in on that worker; with --fluid 0 its
    new instance starts at once and each key group's records wait for its state)."""
    body = {"task": task, "worker": worker, "with_forward": with_forward, **_pace(fluid)}
    return "migrate", body


@_command("logic")
def logic(
    api: Client,
    job_id: JobArg,
    operator: Annotated[str, typer.Argument(help="operator whose logic changes")],
    ref: Annotated[str, typer.Argument(help="package.module:callable or code:<id>:callable")],
    task: Annotated[
        list[str] | None, typer.Option(help="only this task (repeat); default: all of them")
    ] = None,
) -> Request:
    """Swap the callable of an operator's tasks, keeping their state."""
    body = {"operator": operator, "logic": ref, "tasks": task or None}
    return "logic", body


@_command("plan")
def plan(
    api: Client,
    job_id: JobArg,
    file: Annotated[
        Path,
        typer.Argument(
            help='JSON {"base_version", "ops": [...]} (base_version defaults to the current one)',
            dir_okay=False,
        ),
    ],
) -> Request:
    """Apply a plan of assignWorkload / assignResource / assignLogic operations.

    The plan is validated as a whole and carried out in one reconfiguration."""
    body = _read_plan(file)
    if "base_version" not in body:
        body["base_version"] = api.get(f"/jobs/{job_id}")["version"]
    return "reconfigurations", body
