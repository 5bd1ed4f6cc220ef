"""The ``streampilot`` command line.

``streampilot run JOBREF --param k=v ... --workers N`` runs a job on local workers and
prints a summary; ``streampilot demo`` runs the word count on a skewed, shifting key
distribution with a live view. ``streampilot server`` runs the StreamManager (REST under
``/api/v1``); ``streampilot db upgrade`` migrates its database and ``streampilot token
create --scope admin`` prints a new bearer token. Errors in what the user typed (a job reference that does
not resolve, a parameter of the wrong type, an invalid graph) print one clear line and
exit with status 2; a job that fails exits with status 1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from runtime.dataflow import DataflowError, JobGraph, JobRefError, load_job
from runtime.params import ParamError

from .config import Settings
from .coordinator import Job, RuntimeConfig
from .runner import RunResult, run_local

__all__ = ["app"]

app = typer.Typer(
    name="streampilot",
    help="A control plane for Python stream jobs.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _parse_params(items: list[str]) -> dict[str, str]:
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


def _tasks_table(job: Job, window_s: float = 2.0) -> Group:
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

        def tick(job: Job) -> None:
            view.update(_tasks_table(job))

        result = asyncio.run(
            run_local(graph, workers=workers, config=config, timeout=timeout, on_tick=tick)
        )
    console.print()  # the summary goes below the last view, not after its caption
    return result


@app.command()
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
    graph = _load(job_ref, _parse_params(param))
    config = RuntimeConfig(batch_size=batch_size, linger_s=linger_ms / 1000.0)
    result = _run(graph, workers, config, timeout, live)
    _print_summary(result)
    if result.status == "failed":
        raise typer.Exit(1)


@app.command()
def demo(
    duration: Annotated[float, typer.Option(min=1, help="seconds to run")] = 60.0,
    workers: Annotated[int, typer.Option(min=1, help="local worker processes")] = 2,
    rate: Annotated[
        float, typer.Option(min=1, help="sentences per second (8 words each)")
    ] = 10_000,
    omega: Annotated[float, typer.Option(min=0, help="key popularity reshuffles per minute")] = 6.0,
) -> None:
    """Word count on a skewed (Zipf 1.0), shifting key distribution, with a live view."""
    logging.basicConfig(level="WARNING")
    params = {
        "records": 0,
        "rate": rate,
        "zipf": 1.0,
        "omega": omega,
        "keys": 10_000,
        "parallelism": workers,
    }
    graph = _load("examples.wordcount:build", params)
    console.print(
        f"[bold]streampilot demo[/bold]: word count, {rate:,.0f} sentences/s x 8 words, "
        f"Zipf 1.0 over 10,000 words reshuffled {omega:g}x/min, {workers} workers, {duration:g}s"
    )
    started = time.monotonic()
    result = _run(graph, workers, RuntimeConfig(), duration, live=True)
    if result.status == "stopped" and time.monotonic() - started >= duration - 1:
        result.summary["status"] = f"ran {duration:g}s, stopped"
    _print_summary(result)
    if result.status == "failed":
        raise typer.Exit(1)


# -- the StreamManager: server, database, tokens ---------------------------------------------

db_app = typer.Typer(help="The StreamManager's database.", no_args_is_help=True)
token_app = typer.Typer(help="Bearer tokens for the REST API.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="database URL (sqlite:///path.db or postgresql+psycopg://user@host/db); "
        "default STREAMPILOT_DATABASE_URL or sqlite:///./streampilot.db",
    ),
]


def _settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the options that were given on top."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        err.print(f"[red]error:[/red] {problems}")
        raise typer.Exit(2) from None


@app.command()
def server(
    host: Annotated[str | None, typer.Option(help="address to bind [default: 127.0.0.1]")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port [default: 8420]")] = None,
    db: DbOption = None,
    local_workers: Annotated[
        int | None, typer.Option(help="local worker processes to start [default: 2]")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="log level [default: INFO]")] = None,
) -> None:
    """Run the StreamManager: the REST API (/api/v1, console at /docs) with a coordinator
    and local workers. Options override STREAMPILOT_* environment variables."""
    import uvicorn

    from .app import create_app

    settings = _settings(
        host=host, port=port, database_url=db, local_workers=local_workers, log_level=log_level
    )
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    err.print(
        f"streampilot server on http://{settings.host}:{settings.port} "
        f"(database {settings.redacted_database_url()}, {settings.local_workers} local workers)"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        lifespan="on",
    )


@db_app.command("upgrade")
def db_upgrade(
    db: DbOption = None,
    revision: Annotated[str, typer.Option(help="target revision")] = "head",
) -> None:
    """Create or upgrade the database schema (the server also does this at start)."""
    from . import db as database

    settings = _settings(database_url=db)
    try:
        database.upgrade(settings.database_url, revision)
        current = database.current_revision(settings.database_url)
    except SQLAlchemyError as exc:
        err.print(f"[red]error:[/red] database {settings.redacted_database_url()}: {exc}")
        raise typer.Exit(1) from None
    console.print(f"database {settings.redacted_database_url()} is at revision {current}")


@token_app.command("create")
def token_create(
    scope: Annotated[
        str, typer.Option(help="read, operate (also reconfigure and stop) or admin (everything)")
    ] = "read",
    name: Annotated[str | None, typer.Option(help="what the token is for")] = None,
    db: DbOption = None,
) -> None:
    """Create a bearer token and print it (only now: it is stored hashed)."""
    from . import db as database
    from .auth import service as auth
    from .errors import InvalidRequest

    settings = _settings(database_url=db)
    try:
        if settings.migrate_on_start:
            database.upgrade(settings.database_url)
        engine = database.make_engine(settings.database_url)
        try:
            with database.unit_of_work(database.session_factory(engine)) as session:
                _, secret = auth.create_token(
                    session=session, name=name or f"{scope} token", scopes=[scope]
                )
        finally:
            engine.dispose()
    except InvalidRequest as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except SQLAlchemyError as exc:
        err.print(f"[red]error:[/red] database {settings.redacted_database_url()}: {exc}")
        raise typer.Exit(1) from None
    print(secret)


if __name__ == "__main__":
    app()
