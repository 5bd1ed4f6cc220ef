"""One reconfiguration as this worker holds it between its prepare and its end.

:class:`Change` is the record the modules that carry a reconfiguration out share:
:mod:`runtime.reconfigure` makes it at the prepare and applies it at the update,
:mod:`runtime.copyahead` notes what it copied ahead in it, :mod:`runtime.stages` follows
its fluid stages in it, and :mod:`runtime.shipping` reads what state goes where. It does
no I/O; the job's runtime (:class:`~runtime.jobruntime.JobRuntime`) holds the one pending.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .channels import InputChannel
from .errors import StreamRuntimeError
from .layout import Layout
from .operators import KeyedProcessor
from .task import BaseTask, StreamTask

__all__ = ["Change", "WorkerReconfigurationError", "group_owners", "keyed_processor"]


class WorkerReconfigurationError(StreamRuntimeError, RuntimeError):
    """A step of a reconfiguration that cannot be carried out on this worker (the
    coordinator's side raises :class:`ReconfigurationError`; the worker reports this one
    in its ``prepare_failed`` or ``update_failed``)."""


@dataclass
class Change:
    """A prepared reconfiguration on this worker."""

    rid: int
    barrier_id: int
    layout: Layout
    affected: set[str]
    new_tasks: dict[str, BaseTask] = field(default_factory=dict)
    new_inputs: dict[str, InputChannel] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    fluid: bool = False
    in_place: set[str] = field(default_factory=set)  # keyed tasks that do not pause (fluid)
    sync_only: set[str] = field(default_factory=set)  # tasks that only align the barrier
    updating: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    # Fluid stages (see runtime.stages): the layout after each (the last is ``layout``),
    # each later stage's barrier id, the tasks here each stage involves and, per task, the
    # last stage it has a part in (it reports then).
    stages: list[Layout] = field(default_factory=list)
    stage_of: dict[int, int] = field(default_factory=dict)  # barrier id -> stage
    involved: list[set[str]] = field(default_factory=list)
    last_stage: dict[str, int] = field(default_factory=dict)
    announced: set[int] = field(default_factory=set)  # later stages started here
    done: dict[int, set[str]] = field(default_factory=dict)  # stage -> tasks whose part began
    completed: dict[int, set[str]] = field(default_factory=dict)  # ... and ended
    reported: set[int] = field(default_factory=set)  # stages reported done from here
    pause_s: dict[str, float] = field(default_factory=dict)
    t_update: float = 0.0
    # Pre-copy: the key groups copied ahead, by (task, group), with what their delta needs
    # (see runtime.precopy); the copying under way, and a flag that stops it after a group.
    precopied: dict[tuple[str, int], dict | None] = field(default_factory=dict)
    precopy: asyncio.Task | None = None
    precopy_stop: bool = False

    @property
    def first(self) -> Layout:
        """The layout the update (stage 0) makes: the whole change unless staged."""
        return self.stages[0] if self.stages else self.layout


def group_owners(layout: Layout, operator: str) -> dict[int, str]:
    """Key group -> the task of ``operator`` that owns it in ``layout``."""
    return {g: t for t in layout.tasks_of(operator) for g in layout.assignment.get(t, ())}


def keyed_processor(task: BaseTask | None) -> KeyedProcessor | None:
    """The keyed processor of ``task``, if it has one."""
    if isinstance(task, StreamTask) and isinstance(task.processor, KeyedProcessor):
        return task.processor
    return None
