"""``streampilot run``: a job on local worker processes, without the StreamManager.

Errors in what the user typed (a job reference that does not resolve, a parameter of the
wrong type, an invalid graph) print one clear line and exit 2; a job that fails exits 1.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from controlplane.coordinator import RunningJob, RuntimeConfig
from controlplane.runner import RunResult, run_local
from runtime.dataflow import DataflowError, JobGraph, JobRefError, load_job
from runtime.params import ParamError

from .output import console, err

__all__ = ["parse_params", "run"]


def parse_params(items: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` options as a dict of strings (the job converts them to its types)."""
    params: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="--param")
        params[name.strip()] = value
    return params


def _load(job_ref: str, params: dict[str, Any]) -> JobGraph:
    try:
        return load_job(job_ref, params)
    except (JobRefError, DataflowError, ParamError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except (TypeError, ValueError) as exc:
        err.print(f"[red]error:[/red] job {job_ref!r} rejected its params: {exc}")
        raise typer.Exit(2) from None


def _tasks_table(job: RunningJob, window_s: float = 2.0) -> Group:
    """Per-task rates of the last ``window_s`` seconds, sink latency, worker CPU and RSS."""
    view = job.metrics.window(window_s)
    table = Table(title=f"{job.graph.name} ({job.id}) — {job.status}", expand=False)
    for col in ("task", "in/s", "out/s", "busy", "backpressure"):
        table.add_column(col, justify="right" if col != "task" else "left")
    for op in job.graph.operators:
        for tid in job.layout.tasks_of(op.name):
            r = view["tasks"].get(tid)
            if r is None:
                table.add_row(tid, "-", "-", "-", "-")
                continue
            table.add_row(
                tid,
                f"{r['in_per_s']:,.0f}",
                f"{r['out_per_s']:,.0f}",
                f"{r['busy']:.0%}",
                f"{r['backpressure']:.0%}",
            )
    lat = view["latency"]
    workers = "  ".join(
        f"{w} {m['cpu_percent']:.0f}% cpu {m['rss_mb']:.0f} MB"
        for w, m in sorted(job.metrics.workers.items())
    )
    return Group(
        table,
        f"sink latency p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  "
        f"max {lat['max_ms']:.1f} ms",
        f"workers: {workers or '-'}",
    )


def _print_summary(result: RunResult) -> None:
    s = result.summary
    lat = s["latency"]
    sink_rate = s["sink_records"] / s["duration_s"] if s["duration_s"] else 0.0
    console.print(
        f"[bold]{s['status']}[/bold] in {s['duration_s']:.2f}s: "
        f"{s['source_records']:,} source records ({s['source_rate_per_s']:,.0f}/s), "
        f"{s['sink_records']:,} sink records ({sink_rate:,.0f}/s); "
        f"latency p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms"
    )
    if result.error:
        console.print(f"[red]error:[/red] {result.error}")


def _run(
    graph: JobGraph, workers: int, config: RuntimeConfig, timeout: float | None, live: bool
) -> RunResult:
    if not live:
        return asyncio.run(run_local(graph, workers=workers, config=config, timeout=timeout))
    with Live(console=console, refresh_per_second=2, transient=False) as view:

        def tick(job: RunningJob) -> None:
            view.update(_tasks_table(job))

        result = asyncio.run(
            run_local(graph, workers=workers, config=config, timeout=timeout, on_tick=tick)
        )
    console.print()  # the summary goes below the last view, not after its caption
    return result


def run(
    job_ref: Annotated[str, typer.Argument(help="package.module:callable returning a Dataflow")],
    param: Annotated[
        list[str], typer.Option("--param", "-p", help="job parameter NAME=VALUE")
    ] = [],  # noqa: B006
    workers: Annotated[int, typer.Option(min=1, help="local worker processes")] = 2,
    timeout: Annotated[
        float | None, typer.Option(help="stop the job after this many seconds")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="records per batch on a channel")] = 512,
    linger_ms: Annotated[
        float, typer.Option(min=0, help="longest a record waits for its batch")
    ] = 5.0,
    live: Annotated[bool, typer.Option(help="show per-task rates while running")] = False,
    log_level: Annotated[str, typer.Option(help="log level")] = "WARNING",
) -> None:
    """Run a job on local workers and print a summary."""
    logging.basicConfig(level=log_level.upper())
    graph = _load(job_ref, parse_params(param))
    config = RuntimeConfig(batch_size=batch_size, linger_s=linger_ms / 1000.0)
    result = _run(graph, workers, config, timeout, live)
    _print_summary(result)
    if result.status == "failed":
        raise typer.Exit(1)
