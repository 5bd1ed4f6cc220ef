"""What the CLI prints: rich tables for people, ``--json`` for programs, errors on one line.

Results go to stdout (``console``); progress and errors go to stderr (``err``), so
``streampilot ... --json | jq`` sees only the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "console",
    "emit",
    "err",
    "fail",
    "fmt_ms",
    "group_ranges",
    "print_json",
    "record_table",
    "table",
    "when",
]

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` on one line of stderr and exit with ``code``."""
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (``--json``) or with ``render``, for people."""
    if as_json:
        print_json(data)
    else:
        render(data)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A table whose cells are shown as text (None as ``-``); markup in them is not read."""
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*(escape("-" if v is None else str(v)) for v in row))
    return t


def record_table(pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column field / value table for one record."""
    t = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    t.add_column(style="bold")
    t.add_column()
    for name, value in pairs:
        t.add_row(name, escape("-" if value is None else str(value)))
    return t


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def when(timestamp: str | None) -> str | None:
    """An API timestamp shortened to the second (``2026-11-22 04:51:07``)."""
    return timestamp.replace("T", " ")[:19] if timestamp else None


def group_ranges(groups: Iterable[int]) -> str:
    """Key groups as ranges: ``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``."""
    out: list[str] = []
    start = prev = None
    for g in sorted(groups):
        if prev is not None and g == prev + 1:
            prev = g
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = g
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)
