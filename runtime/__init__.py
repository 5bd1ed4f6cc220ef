"""The streampilot runtime: dataflow API, workers, channels, keyed state, sources, sinks.

``runtime`` never imports ``controlplane`` or ``controllers``.
"""

from .dataflow import Dataflow, DataflowError, JobGraph, KeyedStream, Stream, load_job
from .io import Sink, SinkWriter, Source, SourceReader
from .keygroups import key_group, stable_hash
from .records import Barrier, BarrierKind, Batch, EndOfStream

__all__ = [
    "Barrier",
    "BarrierKind",
    "Batch",
    "Dataflow",
    "DataflowError",
    "EndOfStream",
    "JobGraph",
    "KeyedStream",
    "Sink",
    "SinkWriter",
    "Source",
    "SourceReader",
    "Stream",
    "key_group",
    "load_job",
    "stable_hash",
]
