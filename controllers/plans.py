"""Building plans in a controller: the abstraction's helpers, and :class:`PlanBuilder` to
combine several of them into one plan (pure).

A single change is one helper call against the view's abstraction::

    return scale(view.abstraction, "count", 4)       # or rebalance / migrate / update_logic

Several changes in one reconfiguration go through a builder, which builds each step
against the abstraction as the earlier steps leave it, so the steps compose (a second
scale-out sees the tasks the first one placed)::

    b = PlanBuilder(view.abstraction)
    b.scale("split", 4)
    b.rebalance("count", loads)
    b.add(AssignResource("count", "count-0", "w2"))
    return b.build()                                 # None when no step changed anything

Logic refs are not resolved while building (that is validation's job, in the control
plane, where uploaded code can be loaded): :func:`preview` accepts any ref.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from controlplane.abstraction import (
    Abstraction,
    NoChange,
    Op,
    Plan,
    apply_plan,
    migrate,
    rebalance,
    scale,
    split_key,
    update_logic,
)

__all__ = ["PlanBuilder", "accept_any_ref", "preview"]

Mode = Literal["pause", "fluid"]


def accept_any_ref(ref: str) -> Any:
    """A ``resolve_logic`` for :func:`apply_plan` that accepts every ref (see :func:`preview`)."""
    return accept_any_ref


def preview(abstraction: Abstraction, plan: Plan) -> Abstraction:
    """The abstraction ``plan`` would make, validated like the control plane does except that
    logic refs are not resolved; raises the same :class:`PlanError` subclasses."""
    return apply_plan(abstraction, plan, resolve_logic=accept_any_ref)


class PlanBuilder:
    """Accumulates operations against ``base``; each step is validated on the way
    (:func:`preview`), so a step that cannot apply raises its :class:`PlanError` at once,
    naming the step; operations that change nothing are left out. :attr:`current` is the
    abstraction after the steps so far."""

    def __init__(self, base: Abstraction) -> None:
        self.base = base
        self.current = base
        self._ops: list[Op] = []

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(self._ops)

    def add(self, *ops: Op | Plan | Iterable[Op]) -> PlanBuilder:
        """Append operations (or a plan's operations, built against :attr:`current`)."""
        flat: list[Op] = []
        for item in ops:
            if isinstance(item, Plan):
                flat.extend(item.ops)
            elif isinstance(item, list | tuple):
                flat.extend(item)
            else:
                flat.append(item)  # type: ignore[arg-type]
        if not flat:
            return self
        try:
            self.current = preview(self.current, Plan(self.current.version, tuple(flat)))
        except NoChange:
            return self  # the operations change nothing: they are left out
        self._ops.extend(flat)
        return self

    def scale(self, operator: str, n: int, *, workers: Sequence[str] | None = None) -> PlanBuilder:
        return self.add(scale(self.current, operator, n, workers=workers))

    def rebalance(
        self,
        operator: str,
        loads: Mapping[int, float] | Mapping[str, float] | None = None,
        *,
        threshold: float = 0.0,
    ) -> PlanBuilder:
        return self.add(rebalance(self.current, operator, loads, threshold=threshold))

    def migrate(self, task: str, worker: str, *, with_forward: bool = False) -> PlanBuilder:
        return self.add(migrate(self.current, task, worker, with_forward=with_forward))

    def update_logic(
        self, operator: str, ref: str, tasks: Sequence[str] | None = None
    ) -> PlanBuilder:
        return self.add(update_logic(self.current, operator, ref, tasks))

    def split_key(self, operator: str, key: Any, tasks: Sequence[str] | int) -> PlanBuilder:
        return self.add(split_key(self.current, operator, key, tasks))

    def build(self, mode: Mode = "pause", batch_size: int | None = None) -> Plan | None:
        """The plan of every step against ``base``, or None when there is none or the steps
        undo each other."""
        if not self._ops or self.current.replace(version=self.base.version) == self.base:
            return None
        return Plan(self.base.version, tuple(self._ops), mode, batch_size)
