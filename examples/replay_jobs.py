"""Jobs over replayed data: the same job reads a raw file (:class:`FileReplay`) or the
files ``streampilot dataset prepare`` made of it (:class:`ParquetReplay`), and gives the
same results.

``build_word_count`` and ``build_order_volume`` parameters:

- ``path`` (str): the raw file (``source=file``) or the prepared directory (``parquet``).
- ``source`` (str, "parquet"): ``file`` or ``parquet``.
- ``speed`` (float, 0): parquet only: times the recorded pace; 0 = as fast as possible.
- ``parallelism`` (int, 2): tasks per operator.
- ``output`` (str, ""): directory for final results (``part-N.jsonl``); empty = discard.

Word count reads ``text`` from JSON-lines records; order volume sums ``qty`` per ``symbol``
of the orders. Final results: ``read_results(output)``, word or symbol -> total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.io import Source
from runtime.params import parse_params
from runtime.parquet_replay import ParquetReplay
from runtime.replay import FileReplay
from runtime.sinks import Collect, Null

from .wordcount import count_word, read_results, result_key, word_key

__all__ = ["build_order_volume", "build_word_count", "read_results"]


@dataclass(frozen=True)
class Params:
    path: str = ""
    source: str = "parquet"
    speed: float = 0.0
    parallelism: int = 2
    output: str = ""


def _source(p: Params) -> Source:
    if p.source == "file":
        return FileReplay(p.path)
    if p.source == "parquet":
        return ParquetReplay(p.path, speed=p.speed)
    raise ValueError(f"source must be 'file' or 'parquet', got {p.source!r}")


def text_words(record: dict[str, Any]) -> list[str]:
    return str(record["text"]).split()


def symbol_key(order: dict[str, Any]) -> str:
    return str(order["symbol"])


def add_qty(symbol: str, order: dict[str, Any], state: Any) -> tuple[tuple[str, int]]:
    total = state.get(0) + int(order["qty"])
    state.set(total)
    return ((symbol, total),)


def _job(name: str, params: dict[str, Any] | None, split: Any, key: Any, logic: Any) -> Dataflow:
    p = parse_params(Params, params)
    flow = Dataflow(name)
    records = flow.source("replay", _source(p), parallelism=p.parallelism)
    if split is not None:
        records = records.flat_map("split", split)
    totals = records.key_by(key).process("total", logic)
    totals.sink("sink", Collect(p.output, mode="last", key=result_key) if p.output else Null())
    return flow


def build_word_count(params: dict[str, Any] | None = None) -> Dataflow:
    return _job("replay-wordcount", params, text_words, word_key, count_word)


def build_order_volume(params: dict[str, Any] | None = None) -> Dataflow:
    return _job("replay-orders", params, None, symbol_key, add_qty)
