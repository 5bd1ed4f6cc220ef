"""``prepare``: the PySpark job that turns a raw input into replay files.

Steps:

1. Read the input (CSV with a header: every field a string, as :class:`FileReplay` reads
   it; JSON lines; Parquet) and number its records in input order.
2. Derive ``_time`` (seconds since the epoch) from ``time_field``: a number, a timestamp,
   or a string holding either; a record without a readable time fails the whole job.
3. Partition by ``key_field`` (hash, ``partitions`` files; no key: one file), sort each
   partition by ``_time`` then input order, and write Parquet.
4. Write ``manifest.json`` (see :mod:`runtime.parquet_replay`) with each file's record
   count and the dataset's time span.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from runtime.parquet_replay import MANIFEST, REPLAY_FORMAT, TIME_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMATS", "DatasetError", "prepare"]

logger = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl", "parquet")
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_SEQ = "_seq"


class DatasetError(ValueError):
    """The input cannot be prepared: unknown format, missing field, unreadable time."""


def input_format(path: str, given: str | None = None) -> str:
    """``given``, or the format ``path``'s extension names (a directory is Parquet)."""
    if given is not None:
        if given not in FORMATS:
            raise DatasetError(f"format must be one of {', '.join(FORMATS)}, got {given!r}")
        return given
    ext = os.path.splitext(path.rstrip("/"))[1].lower()
    if ext == ".parquet" or os.path.isdir(path):
        return "parquet"
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    raise DatasetError(
        f"cannot tell the format of {path!r} from its extension: pass csv, jsonl or parquet"
    )


def prepare(
    spark: SparkSession,
    source: str,
    out_dir: str,
    *,
    time_field: str,
    key_field: str | None = None,
    format: str | None = None,
    partitions: int = 4,
) -> dict[str, Any]:
    """Run the job (module docstring) from ``source`` into the new directory ``out_dir``;
    returns the manifest. Raises :class:`DatasetError` for an input it cannot prepare and
    when ``out_dir`` exists."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    fmt = input_format(source, format)
    if partitions < 1:
        raise DatasetError(f"partitions must be >= 1, got {partitions}")
    if os.path.exists(out_dir):
        raise DatasetError(f"{out_dir} exists: choose a new directory")
    # Step 1.
    try:
        df = _read(spark, fmt, source)
    except AnalysisException as exc:
        raise DatasetError(f"cannot read {source} as {fmt}: {exc.getMessage()}") from None
    for name, field in (("time", time_field), ("key", key_field)):
        if field is not None and field not in df.columns:
            raise DatasetError(
                f"{source} has no {name} field {field!r}; its fields: {', '.join(df.columns)}"
            )
    columns = list(df.columns)
    df = df.withColumn(_SEQ, F.monotonically_increasing_id())
    # Step 2.
    raw = F.col(time_field)
    as_time = F.coalesce(
        raw.try_cast("double"), F.unix_micros(F.try_to_timestamp(raw.cast("string"))) / 1e6
    )
    df = df.withColumn(TIME_COLUMN, as_time).cache()
    stats = df.agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.col(TIME_COLUMN).isNull().cast("long")).alias("untimed"),
        F.min(TIME_COLUMN).alias("start"),
        F.max(TIME_COLUMN).alias("end"),
    ).first()
    if stats["untimed"]:
        raise DatasetError(
            f"{stats['untimed']} of {stats['records']} records of {source} have no readable "
            f"time in {time_field!r} (expected seconds since the epoch or a timestamp)"
        )
    # Step 3.
    parts = (
        df.repartition(partitions, F.col(key_field)) if key_field else df.coalesce(1)
    ).sortWithinPartitions(TIME_COLUMN, _SEQ)
    parts.drop(_SEQ).write.parquet(out_dir)
    df.unpersist()
    # Step 4.
    manifest = {
        "format": REPLAY_FORMAT,
        "source": os.path.abspath(source),
        "input_format": fmt,
        "time_field": time_field,
        "key_field": key_field,
        "columns": columns,
        "records": int(stats["records"]),
        "start_time": stats["start"],
        "end_time": stats["end"],
        "files": _files(out_dir),
    }
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    logger.info("prepared %d records of %s into %s", manifest["records"], source, out_dir)
    return manifest


def _read(spark: SparkSession, fmt: str, source: str) -> DataFrame:
    if fmt == "csv":
        return spark.read.option("header", True).csv(source)
    if fmt == "jsonl":
        return spark.read.option("mode", "FAILFAST").json(source)
    return spark.read.parquet(source)


def _files(out_dir: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    names = sorted(n for n in os.listdir(out_dir) if n.endswith(".parquet"))
    return [
        {"path": n, "records": pq.read_metadata(os.path.join(out_dir, n)).num_rows} for n in names
    ]
