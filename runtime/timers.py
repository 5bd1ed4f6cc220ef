"""Timers of keyed process functions: per key, in event time or processing time.

A keyed operator whose logic is a :class:`KeyedProcessFunction` (anything with an
``on_timer`` method) gets a :class:`KeyContext` instead of a plain
:class:`~runtime.state.ValueState`: the key's state as before, plus the record's
timestamp, the task's watermark, and :attr:`KeyContext.timers` to register timers for the
current key. ``on_timer(key, time, ctx)`` is called once per registered (key, time):

- an **event-time** timer when the task's watermark reaches ``time`` (records stamped up
  to ``time`` have all been processed, unless late);
- a **processing-time** timer when the worker's wall clock reaches ``time``.

Timers are state: they live in their key group, in a :class:`TimerTable` under the
reserved key :data:`TIMERS` of the group's key -> value dict, so they move with the key
group in a live reconfiguration, are part of its checkpoints (incremental ones too: a
change to the table marks :data:`TIMERS` changed) and come back with it in a recovery.
Registering the same (key, time) twice fires it once. Timers of one time fire in the
order they were registered; what ``on_timer`` returns goes downstream stamped ``time``.
"""

from __future__ import annotations

from typing import Any

from .state import TIMERS, ValueState

__all__ = [
    "TIMERS",
    "KeyContext",
    "KeyedProcessFunction",
    "TimerService",
    "TimerTable",
    "has_timers",
]


class TimerTable:
    """The timers of one key group: time -> the keys to call then, in registration order,
    one dict per time domain."""

    __slots__ = ("event", "processing")

    def __init__(self) -> None:
        self.event: dict[float, dict[Any, None]] = {}
        self.processing: dict[float, dict[Any, None]] = {}

    def __getstate__(self) -> tuple:
        return self.event, self.processing

    def __setstate__(self, state: tuple) -> None:
        self.event, self.processing = state

    def __bool__(self) -> bool:
        return bool(self.event or self.processing)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TimerTable)
            and self.event == other.event
            and self.processing == other.processing
        )

    def __repr__(self) -> str:
        return f"TimerTable(event={self.event!r}, processing={self.processing!r})"


class TimerService:
    """The timers of the current key (see :attr:`KeyContext.timers`); the processor that
    owns it does the bookkeeping (:class:`runtime.operators.timed.TimedKeyedProcessor`)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Any) -> None:
        self._owner = owner

    def register_event_time(self, time: float) -> None:
        """Call ``on_timer`` for this key once the watermark reaches ``time``."""
        self._owner.register(False, float(time))

    def register_processing_time(self, time: float) -> None:
        """Call ``on_timer`` for this key once the wall clock reaches ``time``."""
        self._owner.register(True, float(time))

    def delete_event_time(self, time: float) -> None:
        """Forget this key's event-time timer at ``time`` (no-op if there is none)."""
        self._owner.delete(False, float(time))

    def delete_processing_time(self, time: float) -> None:
        """Forget this key's processing-time timer at ``time`` (no-op if there is none)."""
        self._owner.delete(True, float(time))


class KeyContext(ValueState):
    """What a keyed process function with timers sees of the current key: its state
    (``get`` / ``set`` / ``clear``), ``timestamp`` (the record's, or the timer's time in
    ``on_timer``), ``watermark`` (the task's event-time watermark), ``processing_time``
    (the wall clock when the call began), ``in_processing_time`` (in ``on_timer``: the
    timer is a processing-time one), ``side`` (of a connected stream: which input the
    record came from, see :mod:`runtime.joins`), ``group`` (the key group whose state the
    call sees) and ``timers``."""

    __slots__ = (
        "group",
        "in_processing_time",
        "late",
        "processing_time",
        "side",
        "timers",
        "timestamp",
        "watermark",
    )

    def __init__(self, timers: TimerService) -> None:
        super().__init__()
        self.timers = timers
        self.timestamp = 0.0
        self.watermark = float("-inf")
        self.processing_time = 0.0
        self.in_processing_time = False
        self.late = 0  # records the logic took as late (windows): counted in the metrics
        self.side = 0  # the input of a connected stream the record came from (runtime.joins)
        self.group = -1  # the key group of the current call


class KeyedProcessFunction:
    """Logic of a keyed operator with timers: ``self(key, record, ctx)`` per record and
    ``on_timer(key, time, ctx)`` per timer due; each returns an iterable of outputs or
    None. Subclasses must be picklable (module-level classes)."""

    def __call__(self, key: Any, record: Any, ctx: KeyContext) -> Any:
        raise NotImplementedError

    def on_timer(self, key: Any, time: float, ctx: KeyContext) -> Any:
        return None


def has_timers(logic: Any) -> bool:
    """Whether ``logic`` runs with a :class:`KeyContext` (it has ``on_timer``)."""
    return callable(getattr(logic, "on_timer", None))
