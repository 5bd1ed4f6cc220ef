"""Parquet replay: the event-time-ordered, key-partitioned files of a prepared dataset.

``streampilot dataset prepare`` (a Spark job, :mod:`controlplane.datasets`) writes a
directory of Parquet files, each holding the records of some keys sorted by event time,
and a ``manifest.json`` naming them::

    {"format": "streampilot-replay/1", "time_field": "ts", "key_field": "symbol",
     "columns": [...], "records": 1000, "start_time": 1.7e9, "end_time": 1.7e9 + 60,
     "files": [{"path": "part-00000.parquet", "records": 480}, ...]}

Every file has a ``_time`` column (event time, seconds since the epoch) besides the
record's own columns. Task ``index`` of ``parallelism`` replays the files ``j`` with
``j % parallelism == index``, merged by event time (ties: file, then row order), so each
key's records keep their order. A record is due ``(_time - start_time) / speed`` seconds
after the job's start (``speed`` 1: as recorded; 10: ten times faster; 0: as fast as
polled). A reader's position is the number of records it has emitted.

Needs ``pyarrow`` (the ``spark`` extra), imported when a reader opens.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .io import Source, SourceReader
from .sources import _check_number

__all__ = ["MANIFEST", "REPLAY_FORMAT", "ParquetReplay", "ParquetReplayReader", "read_manifest"]

MANIFEST = "manifest.json"
REPLAY_FORMAT = "streampilot-replay/1"
TIME_COLUMN = "_time"
BATCH_ROWS = 4096  # rows read from a file at a time


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of a prepared dataset; :class:`ValueError` naming the file if it is
    missing, not JSON, or not of :data:`REPLAY_FORMAT`."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as exc:
        raise ValueError(f"ParquetReplay cannot open {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != REPLAY_FORMAT:
        raise ValueError(f"{path}: not a {REPLAY_FORMAT} manifest")
    return manifest


@dataclass(frozen=True)
class ParquetReplay(Source):
    """Replays a prepared dataset directory (see the module docstring) at ``speed`` times
    its recorded pace (0: as fast as possible). The directory is read by the readers, so it
    must exist where the tasks run."""

    directory: str
    speed: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str | os.PathLike):
            raise ValueError(f"ParquetReplay.directory must be a path, got {self.directory!r}")
        object.__setattr__(self, "directory", os.fspath(self.directory))
        speed = _check_number("ParquetReplay", "speed", self.speed, hint="0 = as fast as possible")
        object.__setattr__(self, "speed", speed)

    def open(self, index: int, parallelism: int, start_time: float) -> ParquetReplayReader:
        return ParquetReplayReader(self, index, parallelism, start_time)


class ParquetReplayReader(SourceReader):
    """Task ``index``'s share of a :class:`ParquetReplay`: its files, merged by event time."""

    def __init__(self, src: ParquetReplay, index: int, parallelism: int, start_time: float) -> None:
        if not 0 <= index < parallelism:
            raise ValueError(f"task index {index} is outside parallelism {parallelism}")
        manifest = read_manifest(src.directory)
        self._speed = src.speed
        self._start = start_time
        self._origin = float(manifest.get("start_time") or 0.0)
        self._paths = [
            os.path.join(src.directory, f["path"])
            for j, f in enumerate(manifest["files"])
            if j % parallelism == index
        ]
        self._emitted = 0
        self._records = self._merged()
        self._peek: tuple[float, Any] | None = None
        self._done = False

    def _merged(self) -> Iterator[tuple[float, int, int, dict[str, Any]]]:
        return heapq.merge(*(self._rows(j, p) for j, p in enumerate(self._paths)))

    @staticmethod
    def _rows(j: int, path: str) -> Iterator[tuple[float, int, int, dict[str, Any]]]:
        import pyarrow.parquet as pq

        try:
            file = pq.ParquetFile(path)
        except OSError as exc:
            raise ValueError(f"ParquetReplay cannot open {path}: {exc}") from exc
        row = 0
        for batch in file.iter_batches(batch_size=BATCH_ROWS):
            for record in batch.to_pylist():
                t = float(record.pop(TIME_COLUMN))
                yield t, j, row, record
                row += 1

    def _due(self, t: float) -> float:
        return self._start + (t - self._origin) / self._speed

    def _next(self) -> tuple[float, Any] | None:
        if self._peek is None and not self._done:
            item = next(self._records, None)
            if item is None:
                self._done = True
            else:
                self._peek = (item[0], item[3])
        return self._peek

    def poll(self, now: float, max_records: int) -> tuple[list, list[float]] | None:
        values: list[Any] = []
        times: list[float] = []
        while len(values) < max_records and (item := self._next()) is not None:
            due = self._due(item[0]) if self._speed > 0 else now
            if due > now:
                break
            values.append(item[1])
            times.append(due)
            self._peek = None
        if not values and self._next() is None:
            return None
        self._emitted += len(values)
        return values, times

    def next_due(self, now: float) -> float:
        item = self._next()
        if item is None or self._speed <= 0:
            return now
        return max(now, self._due(item[0]))

    def position(self) -> int:
        return self._emitted

    def seek(self, position: Any) -> None:
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"parquet replay position must be an int >= 0, got {position!r}")
        self._records = self._merged()
        self._peek = None
        self._done = False
        for _ in range(position):
            if next(self._records, None) is None:
                break
        self._emitted = position
