"""Replay data prepared on Spark: the round trip raw file -> ``prepare`` -> ParquetReplay
gives the records, and the results, of replaying the raw file directly."""

from __future__ import annotations

import filecmp
import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.datasets import DatasetError, prepare
from controlplane.testing import BackgroundCluster
from examples import replay_jobs
from examples.datasets import sample
from runtime.dataflow import load_job
from runtime.parquet_replay import ParquetReplay, read_manifest
from runtime.replay import FileReplay

SAMPLES = Path(sample.__file__).parent
ORDERS = str(SAMPLES / "orders.csv")
TEXT = str(SAMPLES / "text.jsonl")


def drain(reader, now: float = float("inf")) -> list:
    out = []
    while (polled := reader.poll(now, 1000)) is not None and polled[0]:
        out.extend(polled[0])
    return out


def test_the_shipped_sample_is_what_the_script_writes(tmp_path: Path) -> None:
    sample.main([str(tmp_path)])
    for name in ("orders.csv", "text.jsonl"):
        assert filecmp.cmp(tmp_path / name, SAMPLES / name, shallow=False), name


def test_prepared_orders_replay_the_raw_records_in_time_order_per_key(
    spark, tmp_path: Path
) -> None:
    out = str(tmp_path / "orders")
    manifest = prepare(spark, ORDERS, out, time_field="time", key_field="symbol", partitions=4)
    assert manifest == read_manifest(out)
    raw = drain(FileReplay(ORDERS).open(0, 1, 0.0))
    assert manifest["records"] == len(raw) == sum(f["records"] for f in manifest["files"])
    assert manifest["columns"] == ["time", "order_id", "symbol", "side", "price", "qty"]
    replayed = []
    for index in range(2):
        mine = drain(ParquetReplay(out).open(index, 2, 0.0))
        times = [float(r["time"]) for r in mine]
        assert times == sorted(times)  # each task replays in event-time order
        replayed.append(mine)
    key = lambda r: int(r["order_id"])  # noqa: E731
    assert sorted(replayed[0] + replayed[1], key=key) == sorted(raw, key=key)
    # Key-partitioned: a symbol's orders live in one task's files, in their raw order.
    by_symbol = defaultdict(list)
    for r in raw:
        by_symbol[r["symbol"]].append(r)
    for symbol, orders in by_symbol.items():
        owners = [i for i in range(2) if any(r["symbol"] == symbol for r in replayed[i])]
        assert len(owners) == 1, symbol
        assert [r for r in replayed[owners[0]] if r["symbol"] == symbol] == orders


def test_replay_keeps_the_recorded_pace_scaled_by_speed(spark, tmp_path: Path) -> None:
    out = str(tmp_path / "text")
    manifest = prepare(spark, TEXT, out, time_field="time")
    start = 1000.0
    reader = ParquetReplay(out, speed=10).open(0, 1, start)
    values, stamps = reader.poll(start + 1.0, 10_000)  # 1 s of wall time = 10 s recorded
    origin = manifest["start_time"]
    assert values and all(r["time"] - origin <= 10.0 for r in values)
    assert stamps == [start + (r["time"] - origin) / 10 for r in values]
    due = reader.next_due(start + 1.0)
    assert due > start + 1.0
    position = reader.position()
    rest = drain(reader)
    again = ParquetReplay(out, speed=10).open(0, 1, start)
    again.seek(position)
    assert drain(again) == rest
    assert len(values) + len(rest) == manifest["records"]


def test_replayed_dataset_gives_the_results_of_the_raw_file(
    spark, cluster: BackgroundCluster, tmp_path: Path
) -> None:
    out = str(tmp_path / "text")
    prepare(spark, TEXT, out, time_field="time", key_field="text", partitions=3)
    results = {}
    for source, path in (("file", TEXT), ("parquet", out)):
        output = tmp_path / f"out-{source}"
        params = {"path": path, "source": source, "output": str(output)}
        job = cluster.run(load_job("examples.replay_jobs:build_word_count", params))
        assert job.status == "finished", job.error
        results[source] = replay_jobs.read_results(str(output))
    assert results["parquet"] == results["file"]
    with open(TEXT, encoding="utf-8") as f:
        words = sum(len(json.loads(line)["text"].split()) for line in f)
    assert sum(results["file"].values()) == words


def test_inputs_that_cannot_be_prepared_say_why(spark, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no time field 'when'; its fields: time, order_id"):
        prepare(spark, ORDERS, str(tmp_path / "a"), time_field="when")
    with pytest.raises(DatasetError, match="have no readable time in 'symbol'"):
        prepare(spark, ORDERS, str(tmp_path / "b"), time_field="symbol")
    with pytest.raises(DatasetError, match="cannot tell the format"):
        prepare(spark, str(tmp_path / "raw.txt"), str(tmp_path / "c"), time_field="time")
    (tmp_path / "d").mkdir()
    with pytest.raises(DatasetError, match="exists"):
        prepare(spark, ORDERS, str(tmp_path / "d"), time_field="time")


def test_dataset_prepare_command(spark, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "orders"
    args = ["dataset", "prepare", ORDERS, str(out), "--time-field", "time", "--key-field", "symbol"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "prepared 2,000 records" in result.output
    assert read_manifest(str(out))["key_field"] == "symbol"
    result = runner.invoke(app, [*args[:3], str(tmp_path / "x"), "--time-field", "nope"])
    assert result.exit_code == 2
    assert "no time field 'nope'" in result.output
