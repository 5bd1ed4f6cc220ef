"""File replay: a JSON-lines or CSV file as a replayable source.

Record ``i`` (blank lines do not count, the CSV header is not a record) goes to task
``i % parallelism`` and is due ``(i + 1) / rate`` seconds after ``start_time`` (``rate=0``:
as fast as polled). Only a task's own lines are parsed. A reader's position is the global
index of the next record; :meth:`FileReplayReader.seek` moves to the first record the task
owns at or after it. A missing file or an unparsable line raises :class:`ValueError`
naming the file and line.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .io import Source, SourceReader
from .sources import _MANY, _check_number

__all__ = ["FileReplay", "FileReplayReader"]


def _file_format(path: str) -> str | None:
    ext = os.path.splitext(path)[1].lower()
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}.get(ext)


@dataclass(frozen=True)
class FileReplay(Source):
    """Replays a JSON-lines file (records are parsed JSON) or a CSV file with a header
    (records are dicts of strings). ``format`` is ``"jsonl"`` or ``"csv"``, by default
    from the extension (``.jsonl``/``.ndjson``/``.json``, ``.csv``). ``rate``: records per
    second over all tasks, 0 = as fast as possible. The file is opened by the readers,
    so it must exist where the tasks run.
    """

    path: str
    format: Literal["jsonl", "csv"] | None = None
    rate: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike):
            raise ValueError(f"FileReplay.path must be a file path, got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))
        fmt = self.format if self.format is not None else _file_format(self.path)
        if fmt not in ("jsonl", "csv"):
            raise ValueError(
                f"FileReplay.format must be 'jsonl' or 'csv' (or a path ending in .jsonl, "
                f".ndjson, .json or .csv), got {self.format!r} for {self.path!r}"
            )
        object.__setattr__(self, "format", fmt)
        rate = _check_number("FileReplay", "rate", self.rate, hint="0 = as fast as possible")
        object.__setattr__(self, "rate", rate)

    def open(self, index: int, parallelism: int, start_time: float) -> FileReplayReader:
        return FileReplayReader(self, index, parallelism, start_time)


class FileReplayReader(SourceReader):
    """Task ``index``'s share of a :class:`FileReplay`: records ``i`` with ``i % n == index``."""

    def __init__(self, src: FileReplay, index: int, parallelism: int, start_time: float) -> None:
        if not 0 <= index < parallelism:
            raise ValueError(f"task index {index} is outside parallelism {parallelism}")
        self._src = src
        self._index = index
        self._n = parallelism
        self._start = start_time
        self._file = None
        self._next = index  # global index of the next record this task emits
        self._records = self._open(index)
        self._done = False

    def _open(self, first: int) -> Iterator[Any]:
        self.close()
        try:
            self._file = open(self._src.path, encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as exc:
            raise ValueError(f"FileReplay cannot open {self._src.path}: {exc.strerror}") from exc
        if self._src.format == "csv":
            return self._csv_records(self._file, first)
        return self._jsonl_records(self._file, first)

    def _mine(self, i: int, first: int) -> bool:
        return i >= first and i % self._n == self._index

    def _jsonl_records(self, file: Any, first: int) -> Iterator[Any]:
        i = 0
        for line_no, line in enumerate(file, 1):
            if not line.strip():
                continue
            if self._mine(i, first):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(
                        f"{self._src.path}, line {line_no}: not valid JSON ({exc.msg})"
                    ) from None
            i += 1

    def _csv_records(self, file: Any, first: int) -> Iterator[dict[str, str]]:
        reader = csv.reader(file, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                return
            i = 0
            for row in reader:
                if not row:
                    continue
                if self._mine(i, first):
                    if len(row) != len(header):
                        raise ValueError(
                            f"{self._src.path}, line {reader.line_num}: {len(row)} fields, "
                            f"the header has {len(header)}"
                        )
                    yield dict(zip(header, row, strict=True))
                i += 1
        except csv.Error as exc:
            raise ValueError(f"{self._src.path}, line {reader.line_num}: {exc}") from None

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        if self._done:
            return None
        want = max_records
        rate = self._src.rate
        if rate > 0:
            due_total = math.floor(min((now - self._start) * rate, _MANY))  # 0 .. due_total-1
            if due_total <= self._next and now >= self._start + (self._next + 1) / rate:
                due_total = self._next + 1  # rounding must not starve a poll at next_due()
            want = min(want, -(-(due_total - self._next) // self._n))
        values = []
        for _ in range(max(want, 0)):
            value = next(self._records, _END)
            if value is _END:
                self._done = True
                self.close()
                break
            values.append(value)
        if self._done and not values:
            return None
        first = self._next
        self._next += len(values) * self._n
        if rate <= 0:
            return values, [now] * len(values)
        start, n = self._start, self._n
        return values, [start + (first + k * n + 1) / rate for k in range(len(values))]

    def next_due(self, now: float) -> float:
        if self._done or self._src.rate <= 0:
            return now
        return max(now, self._start + (self._next + 1) / self._src.rate)

    def position(self) -> int:
        return self._next

    def seek(self, position: Any) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"file replay position must be an int >= 0, got {position!r}")
        first = position + (self._index - position) % self._n
        self._records = self._open(first)
        self._next = first
        self._done = False

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_END = object()
