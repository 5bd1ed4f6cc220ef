"""``streampilot dataset prepare``: run the preparation job on Spark (see :mod:`.prepare`).

Spark comes from the settings (``STREAMPILOT_SPARK_MASTER``, ``STREAMPILOT_SPARK_CONF``),
``--spark-master`` on top. Exit status 2 for an input that cannot be prepared or a Spark
that cannot start, with the reason on one line. The ``streampilot`` app mounts :data:`app`
with ``app.add_typer(datasets_cli.app, name="dataset")``.
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from controlplane.backends import BackendError
from controlplane.config import Settings

from .prepare import FORMATS, DatasetError, prepare

__all__ = ["app"]

app = typer.Typer(help="Replay datasets prepared on Spark.", no_args_is_help=True)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def dataset() -> None:
    """Replay datasets prepared on Spark."""


@app.command("prepare")
def prepare_command(
    source: Annotated[str, typer.Argument(help="raw input: a CSV, JSON-lines or Parquet path")],
    out: Annotated[str, typer.Argument(help="new directory for the replay files")],
    time_field: Annotated[
        str, typer.Option(help="field with each record's event time (epoch seconds or timestamp)")
    ],
    key_field: Annotated[
        str | None, typer.Option(help="field to partition by (default: one file)")
    ] = None,
    format: Annotated[
        str | None, typer.Option(help=f"{', '.join(FORMATS)} (default: from the extension)")
    ] = None,
    partitions: Annotated[int, typer.Option(min=1, help="files with --key-field")] = 4,
    spark_master: Annotated[
        str | None, typer.Option(help="Spark master URL (default: STREAMPILOT_SPARK_MASTER)")
    ] = None,
) -> None:
    """Turn a raw input into event-time-ordered, key-partitioned Parquet replay files and a
    manifest.json, with a Spark job (replay them with runtime.parquet_replay.ParquetReplay)."""
    from controlplane.backends.spark import spark_session

    try:
        settings = Settings(**({"spark_master": spark_master} if spark_master else {}))
    except ValidationError as exc:
        err.print(f"[red]error:[/red] {exc.errors()[0]['msg']}")
        raise typer.Exit(2) from None
    try:
        spark = spark_session(settings.spark_master, settings.spark_conf)
        manifest = prepare(
            spark,
            source,
            out,
            time_field=time_field,
            key_field=key_field,
            format=format,
            partitions=partitions,
        )
    except (DatasetError, BackendError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    span = (manifest["end_time"] or 0.0) - (manifest["start_time"] or 0.0)
    console.print(
        f"prepared {manifest['records']:,} records of {source} into {out}: "
        f"{len(manifest['files'])} files, {span:.1f}s of event time"
    )
