"""Word count: sentences -> split -> keyed count -> sink (the first workload of Trisk).

``build(params)`` parameters (all optional; ``streampilot run examples.wordcount:build
--param records=100000``):

- ``records`` (int, 200000): sentences to generate; 0 = unbounded.
- ``words`` (int, 8): words per sentence.
- ``rate`` (float, 0): sentences per second over all sources; 0 = as fast as possible.
- ``schedule`` (str, ""): rate steps/ramps, ``"time_s:rate, ..."`` (see Generator).
- ``keys`` (int, 10000): vocabulary size.
- ``zipf`` (float, 1.0): skew of word frequencies (0 = uniform).
- ``omega`` (float, 0): reshuffles of word popularity per minute (Elasticutor's omega).
- ``seed`` (int, 42): the stream's seed.
- ``parallelism`` (int, 2): tasks per operator.
- ``max_parallelism`` (int, 128): key groups of the count operator.
- ``output`` (str, ""): directory for final counts (``part-N.jsonl``); empty = discard.
- ``state_bytes`` (int, 0): extra bytes of state kept per word (to study state moves:
  10,000 words x 10 KB = 100 MB over the count tasks).
- ``aggregate`` (bool, false): count with ``key_by(word).aggregate("count", Count())``
  (:mod:`runtime.aggregate`: counts emitted once per word and batch, merged by
  ``count.merge``; a plan may split a hot word over several count tasks) instead of a
  keyed function emitting each word's count per record.
- ``work_us`` (float, 0): with ``aggregate``, simulated compute per word counted, in
  microseconds (busy-waited): makes one task's capacity small enough for a hot word to
  exceed it (the hot-key benchmark).

Final results (``read_results(output)``) map each word to its count; they are equal to
:func:`reference` for the same params, whatever the parallelism.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from runtime import Dataflow
from runtime.params import parse_params
from runtime.sinks import Collect, Null, read_parts
from runtime.sources import Generator
from runtime.windows import Count

__all__ = [
    "PaddedCount",
    "Params",
    "Sentences",
    "WorkedCount",
    "build",
    "count_word",
    "count_word_v2",
    "count_word_v3",
    "read_results",
    "reference",
    "split_words",
]


@dataclass(frozen=True)
class Params:
    records: int = 200_000
    words: int = 8
    rate: float = 0.0
    schedule: str = ""
    keys: int = 10_000
    zipf: float = 1.0
    omega: float = 0.0
    seed: int = 42
    parallelism: int = 2
    max_parallelism: int = 128
    output: str = ""
    state_bytes: int = 0
    aggregate: bool = False
    work_us: float = 0.0

    def __post_init__(self) -> None:
        for name in ("words", "keys", "parallelism", "max_parallelism"):
            if getattr(self, name) < 1:
                raise ValueError(f"param {name!r} must be >= 1, got {getattr(self, name)}")
        if self.work_us and not self.aggregate:
            raise ValueError("param 'work_us' needs 'aggregate'")
        if not (math.isfinite(self.work_us) and self.work_us >= 0):
            raise ValueError(f"param 'work_us' must be a number >= 0, got {self.work_us}")
        if self.aggregate and self.state_bytes:
            raise ValueError("params 'aggregate' and 'state_bytes' do not go together")
        if self.state_bytes < 0:
            raise ValueError(f"param 'state_bytes' must be >= 0, got {self.state_bytes}")
        if self.records < 0:
            raise ValueError(f"param 'records' must be >= 0 (0 = unbounded), got {self.records}")


@dataclass(frozen=True)
class Sentences(Generator):
    """Sentences of ``words`` words; word frequencies follow the generator's key skew.

    Sentence ``i`` of a chunk takes the chunk's sampled keys at ``i, i+s, i+2s, ...`` (mod
    the chunk size, ``s`` odd): each sampled key is used exactly ``words`` times per chunk,
    so word frequencies are ``words`` times the key frequencies.
    """

    words: int = 8

    def make_records(self, rng: random.Random, keys: list[str], start_index: int) -> list:
        n = len(keys)
        stride = 2 * (n // (2 * self.words)) + 1 if n > 2 * self.words else 1
        offsets = [j * stride for j in range(self.words)]
        doubled = keys + keys
        return [" ".join([doubled[(i + o) % n] for o in offsets]) for i in range(n)]


@dataclass(frozen=True)
class WorkedCount(Count):
    """``Count`` that busy-waits ``work_us`` microseconds per record (simulated compute)."""

    work_us: float = 0.0

    def add(self, acc: int, record: Any) -> int:
        deadline = time.perf_counter() + self.work_us / 1e6
        while time.perf_counter() < deadline:
            pass
        return acc + 1


def split_words(sentence: str) -> list[str]:
    return sentence.split()


def word_key(word: str) -> str:
    return word


def count_word(word: str, _value: str, state: Any) -> tuple[tuple[str, int]]:
    n = state.get(0) + 1
    state.set(n)
    return ((word, n),)


@dataclass(frozen=True)
class PaddedCount:
    """``count_word`` that also keeps ``pad`` bytes of state per word (``version`` is only
    there so that a new instance is a new piece of logic for change-of-logic tests)."""

    pad: int
    version: int = 1

    def __call__(self, word: str, _value: str, state: Any) -> tuple[tuple[str, int]]:
        entry = state.get()
        n = 1 if entry is None else entry[0] + 1
        state.set((n, entry[1] if entry is not None else bytes(self.pad)))
        return ((word, n),)


def count_word_v2(word: str, _value: str, state: Any) -> tuple[tuple[str, int]]:
    """The same count, as a new piece of logic (for change-of-logic runs); it also takes
    over the state of :class:`PaddedCount` (``(count, padding)``) and keeps its padding."""
    entry = state.get(0)
    if isinstance(entry, tuple):
        n = entry[0] + 1
        state.set((n, entry[1]))
    else:
        n = entry + 1
        state.set(n)
    return ((word, n),)


def count_word_v3(word: str, value: str, state: Any) -> tuple[tuple[str, int]]:
    """Another new piece of logic with :func:`count_word_v2`'s behaviour (to swap back and forth)."""
    return count_word_v2(word, value, state)


def result_key(record: Any) -> str:
    return record[0]


def source_of(p: Params) -> Sentences:
    return Sentences(
        records=p.records or None,
        rate=p.rate,
        schedule=p.schedule,
        keys=p.keys,
        zipf=p.zipf,
        omega=p.omega,
        seed=p.seed,
        words=p.words,
    )


def build(params: dict[str, Any] | None = None) -> Dataflow:
    p = parse_params(Params, params)
    flow = Dataflow("wordcount")
    sentences = flow.source("sentences", source_of(p), parallelism=p.parallelism)
    words = sentences.flat_map("split", split_words)
    if p.aggregate:
        agg = WorkedCount(p.work_us) if p.work_us else Count()
        counts = words.key_by(word_key).aggregate("count", agg, max_parallelism=p.max_parallelism)
    else:
        logic = PaddedCount(p.state_bytes) if p.state_bytes else count_word
        counts = words.key_by(word_key).process("count", logic, max_parallelism=p.max_parallelism)
    counts.sink("sink", Collect(p.output, mode="last", key=result_key) if p.output else Null())
    return flow


def read_results(output: str) -> dict[str, int]:
    """Final count per word from a run's ``output`` directory (the latest count wins)."""
    counts: dict[str, int] = {}
    for word, n in read_parts(output):
        if n > counts.get(word, 0):
            counts[word] = n
    return counts


def reference(params: dict[str, Any] | None = None) -> dict[str, int]:
    """The counts computed in this process, without the runtime (bounded runs only)."""
    p = parse_params(Params, params)
    if not p.records:
        raise ValueError("reference() needs a bounded run (records > 0)")
    reader = source_of(p).open(0, 1, 0.0)
    counts: Counter[str] = Counter()
    while (polled := reader.poll(float("inf"), 65536)) is not None:
        for sentence in polled[0]:
            counts.update(sentence.split())
    return dict(counts)
