"""Per-kind record processing: the hot loops of map, flat_map, filter, keyed and sink tasks.

A :class:`Processor` is built once per task from its :class:`~runtime.dataflow.OperatorSpec`
and called by the task loop with each input batch; it routes its outputs into the task's
:class:`~runtime.partitioning.Outputs` (no I/O; the task loop flushes). A UDF that raises
becomes a :class:`UserCodeError` naming the task, the operator's logic, the record and,
for keyed operators, the key.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..aggregate import PartialAggregate
from ..dataflow import OperatorSpec
from ..metrics import TaskMetrics
from ..partitioning import Outputs
from ..state import TIMERS, KeyedState
from ..timers import has_timers
from .aggregate import AggregateProcessor
from .basic import (
    FilterProcessor,
    FlatMapProcessor,
    KeyedProcessor,
    MapProcessor,
    Processor,
    SinkProcessor,
    UserCodeError,
)
from .timed import TimedKeyedProcessor

__all__ = [
    "AggregateProcessor",
    "KeyedProcessor",
    "Processor",
    "SinkProcessor",
    "TimedKeyedProcessor",
    "UserCodeError",
    "make_processor",
    "swap_logic",
]


def swap_logic(processor: Processor, logic: Any, index: int) -> Processor:
    """``processor`` running ``logic`` from now on (a logic swap, between batches): the
    same processor, or, for a keyed operator whose new logic has timers and the old none
    (or the other way round), a new one over the same state, outputs and metrics, going
    on with the old one's change tracking. A swap to logic without timers forgets the
    key groups' timers (nothing would call them)."""
    if not isinstance(processor, KeyedProcessor) or has_timers(logic) == has_timers(processor.fn):
        processor.fn = logic
        return processor
    op = replace(processor.op, logic=logic)
    new = make_processor(
        processor.task_id, op, index, processor.outputs, processor.metrics, processor.state
    )
    assert isinstance(new, KeyedProcessor)
    new.changed, new.chains, new.touched = processor.changed, processor.chains, processor.touched
    if not has_timers(logic):
        for g, store in processor.state.groups().items():
            if store.pop(TIMERS, None) is not None and new.changed is not None:
                new.changed[g].add(TIMERS)
    return new


def make_processor(
    task_id: str,
    op: OperatorSpec,
    index: int,
    outputs: Outputs,
    metrics: TaskMetrics,
    state: KeyedState | None,
) -> Processor:
    if op.kind == "map":
        return MapProcessor(task_id, op, outputs, metrics)
    if op.kind == "flat_map":
        return FlatMapProcessor(task_id, op, outputs, metrics)
    if op.kind == "filter":
        return FilterProcessor(task_id, op, outputs, metrics)
    if op.kind == "keyed":
        assert state is not None
        if has_timers(op.logic):
            return TimedKeyedProcessor(task_id, op, outputs, metrics, state)
        if isinstance(op.logic, PartialAggregate):
            return AggregateProcessor(task_id, op, outputs, metrics, state)
        return KeyedProcessor(task_id, op, outputs, metrics, state)
    if op.kind == "sink":
        return SinkProcessor(task_id, op, outputs, metrics, index)
    raise ValueError(f"no processor for operator kind {op.kind!r}")
