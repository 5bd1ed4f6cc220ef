"""What travels on a channel, in order: batches of records, barriers, end of stream.

Records travel in columnar batches: ``values[i]`` was emitted by a source at wall-clock
time ``timestamps[i]`` (seconds since the epoch, float), which every operator carries over
to what it derives from the record, so sinks can measure end-to-end latency per record.

A source with event time (:mod:`runtime.eventtime`) stamps records with their event time
instead, and its tasks send :class:`Watermark` s in band.

Barriers carry a kind (``checkpoint`` or ``reconfig``) and an id from the start, so the
checkpoint and reconfiguration protocols share one in-band mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Barrier", "BarrierKind", "Batch", "EndOfStream", "Watermark"]


class Batch:
    """A batch of records and their source timestamps (parallel lists, same length)."""

    __slots__ = ("timestamps", "values")

    def __init__(self, values: list, timestamps: list[float]) -> None:
        self.values = values
        self.timestamps = timestamps

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"Batch({len(self.values)} records)"


class BarrierKind(StrEnum):
    CHECKPOINT = "checkpoint"
    RECONFIG = "reconfig"


@dataclass(frozen=True, slots=True)
class Barrier:
    """A marker injected at the sources; ``id`` grows across both kinds within a job."""

    kind: BarrierKind
    id: int


@dataclass(frozen=True, slots=True)
class EndOfStream:
    """The upstream task has emitted its last record on this channel."""


@dataclass(frozen=True, slots=True)
class Watermark:
    """No record stamped at or before ``time`` follows on this channel (event time,
    seconds since the epoch; ``inf`` at the end). ``idle``: the sender has nothing to
    send for now and does not hold the receiver's watermark back until its next mark."""

    time: float
    idle: bool = False
