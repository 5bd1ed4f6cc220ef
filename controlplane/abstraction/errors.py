"""The exceptions of the abstraction package (the tree is drawn in the package docstring).

Every exception carries a message a person can act on: it names the culprit (operator,
task, worker, key group, version) and, when there is one, the fix. HTTP status mapping is
not done here: the REST layer maps :class:`StaleVersion` to 409 and the others to 422 in
its one error handler.
"""

from __future__ import annotations

from typing import Any, Self

__all__ = [
    "AbstractionError",
    "BadLogic",
    "InvalidPlan",
    "KeyGroupConflict",
    "NoChange",
    "PartitionConflict",
    "PlanError",
    "SchemaError",
    "StaleVersion",
    "TaskStillOwnsWork",
    "UnknownOperator",
    "UnknownTask",
    "UnknownWorker",
    "WorkerOverCapacity",
]


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class AbstractionError(ValueError):
    """Base of every error raised by :mod:`controlplane.abstraction`.

    Pickles with its attributes (controllers run in subprocesses and report errors back).
    """

    def __reduce__(self) -> Any:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class SchemaError(AbstractionError):
    """A JSON document (abstraction, operation or plan) of the wrong shape, or a model
    object built with values of the wrong type. The message starts with the path of the
    offending field, e.g. ``ops[2].worker``."""


class PlanError(AbstractionError):
    """A plan refused by validation.

    ``op_index`` is the position in ``plan.ops`` of the operation at fault, or ``None``
    when the fault is in the plan's result as a whole (found after all operations).
    """

    def __init__(self, message: str, *, op_index: int | None = None) -> None:
        super().__init__(message)
        self.op_index = op_index

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def at(self, op_index: int, what: str) -> Self:
        """Locate this error at operation ``op_index`` (described by ``what``); returns self."""
        if self.op_index is None:
            self.op_index = op_index
            self.args = (f"operation {op_index} ({what}): {self.message}",)
        return self


class StaleVersion(PlanError):
    """The plan's ``base_version`` is not the abstraction's current version (HTTP 409)."""

    def __init__(self, base_version: int, current_version: int) -> None:
        super().__init__(
            f"the plan is based on version {base_version} but the abstraction is at version "
            f"{current_version}; fetch the current abstraction and build the plan again"
        )
        self.base_version = base_version
        self.current_version = current_version


class UnknownOperator(PlanError):
    """An operator name that is not in the job."""


class UnknownTask(PlanError):
    """A task id that is not in the operator (or not in the job)."""


class UnknownWorker(PlanError):
    """A worker id that is not in the abstraction's workers."""


class KeyGroupConflict(PlanError):
    """A key group owned by two tasks, by none, listed twice, or outside the operator's
    ``0..max_parallelism-1``."""


class PartitionConflict(PlanError):
    """A partition of a partitioned source read by two tasks, by none, listed twice, or
    not one of the source's."""


class WorkerOverCapacity(PlanError):
    """A worker that would host more of the job's tasks than its ``slots``."""


class TaskStillOwnsWork(PlanError):
    """A task removed while it still owns key groups or a non-zero weight."""


class BadLogic(PlanError):
    """A logic reference that does not resolve or resolves to something not callable."""


class InvalidPlan(PlanError):
    """Any other refusal: an empty plan, a bad weight, an operation of the wrong kind for
    its operator, live rescaling of a source, forward edges left with different task sets,
    a malformed new task id, a worker that cannot take tasks."""


class NoChange(InvalidPlan):
    """A non-empty plan whose result equals the current abstraction (nothing to apply)."""
