"""Replay datasets prepared on Spark: raw CSV, JSON lines or Parquet in, event-time-ordered,
key-partitioned Parquet replay files and a manifest out (read back by
:class:`runtime.parquet_replay.ParquetReplay`).

Exception tree::

    DatasetError (ValueError)   the input cannot be prepared (the message says why)
"""

from .prepare import DatasetError, prepare

__all__ = ["DatasetError", "prepare"]
