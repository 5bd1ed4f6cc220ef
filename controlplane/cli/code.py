"""``streampilot code upload|list|show``: Python modules uploaded to the StreamManager, whose
callables jobs and ``reconfigure logic`` refer to as ``code:<id>:<callable>``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.syntax import Syntax

from .client import Client
from .output import console, record_table, table, when
from .remote import LimitOpt, OffsetOpt, page_footer, rest_command

__all__ = ["app"]

app = typer.Typer(help="Upload Python modules for jobs and logic swaps.", no_args_is_help=True)


def _refs(code: dict[str, Any]) -> str:
    return ", ".join(f"code:{code['id']}:{c}" for c in code["callables"]) or "-"


def _print_code(code: dict[str, Any]) -> None:
    console.print(
        record_table(
            [
                ("id", code["id"]),
                ("name", code["name"]),
                ("sha256", code["sha256"]),
                ("refs", _refs(code)),
                ("created", when(code["created_at"])),
            ]
        )
    )


def _print_list(page: dict[str, Any]) -> None:
    rows = [
        (c["id"], c["name"], c["sha256"][:12], _refs(c), when(c["created_at"]))
        for c in page["items"]
    ]
    console.print(table(None, ("id", "name", "sha256", "refs", "created"), rows))
    page_footer(page, "modules")


@rest_command(app, "upload", _print_code)
def upload(
    api: Client,
    file: Annotated[
        Path,
        typer.Argument(help="a Python module (.py)", exists=True, dir_okay=False, readable=True),
    ],
    name: Annotated[
        str | None, typer.Option(help="a name for people (default: the file's)")
    ] = None,
) -> dict[str, Any]:
    """Upload a module; prints the references of its callables (code:<id>:<callable>)."""
    return api.upload("/code", file, name=name)


@rest_command(app, "list", _print_list)
def list_code(api: Client, limit: LimitOpt = 50, offset: OffsetOpt = 0) -> dict[str, Any]:
    """Uploaded modules, newest first."""
    return api.get("/code", limit=limit, offset=offset)


def _print_source(code: dict[str, Any]) -> None:
    _print_code(code)
    console.print(Syntax(code["source"], "python", line_numbers=True))


@rest_command(app, "show", _print_source)
def show(
    api: Client, code_id: Annotated[int, typer.Argument(min=1, help="uploaded module id")]
) -> dict[str, Any]:
    """One uploaded module with its source."""
    return api.get(f"/code/{code_id}")
