"""The task-centric abstraction of a job, its plans, their validation and diff (pure).

docs/design.md, sections 2 and 3 (step 1). No I/O, no asyncio: frozen dataclasses and plain
functions, shared by the StreamManager, the coordinator and the controllers::

    a1 = from_graph(job_id, graph, placement, workers)       # version 1
    plan = scale(a1, "count", 4)                              # or Plan(a1.version, ops)
    a2 = apply_plan(a1, plan)                                 # version 2, or a PlanError
    d = diff(a1, a2)                                          # moves, affected tasks

- :mod:`.model`: :class:`Abstraction` and :class:`Operator`, :func:`from_graph`; their
  parts (tasks, workers...) are in :mod:`.parts`; all round-trip through JSON.
- :mod:`.ops`: :class:`AssignWorkload`, :class:`AssignResource`, :class:`AssignLogic`,
  :class:`Plan`.
- :mod:`.validate`: :func:`apply_plan`, :func:`check_abstraction`.
- :mod:`.diff`: :func:`diff`, :class:`Diff`.
- :mod:`.fluid`: :func:`fluid_steps` (a plan in small steps, for ``mode: fluid``).
- :mod:`.cost`: :func:`bytes_shipped`, :func:`largest_step` (keyed state a change ships).
- :mod:`.helpers`: :func:`scale`, :func:`rebalance`, :func:`migrate`, :func:`update_logic`
  (on the algorithms of :mod:`.balance`).

Exception tree::

    AbstractionError (ValueError)   anything raised by this package
    ├── SchemaError                 a JSON document of the wrong shape (names the field path)
    └── PlanError                   a plan refused by validation (.op_index: the culprit op)
        ├── StaleVersion            base_version is not current (HTTP 409)
        ├── UnknownOperator
        ├── UnknownTask
        ├── UnknownWorker
        ├── KeyGroupConflict        a key group owned twice, by nobody, or out of range
        ├── PartitionConflict       a partition read twice, by nobody, or not the source's
        ├── WorkerOverCapacity      more tasks than the worker's slots
        ├── TaskStillOwnsWork       a task removed while it owns key groups or weight
        ├── BadLogic                a logic ref that does not resolve to a callable
        └── InvalidPlan             everything else (empty plan, wrong kind of op, ...)
            └── NoChange            a valid plan whose result equals the current version

Every PlanError but StaleVersion maps to HTTP 422; the mapping lives in the REST layer.
"""

from .balance import even_split, greedy_balance, imbalance, inverse_weights
from .cost import GroupBytes, bytes_shipped, key_group_bytes, largest_step, step_bytes
from .diff import Diff, OperatorDiff, diff
from .errors import (
    AbstractionError,
    BadLogic,
    InvalidPlan,
    KeyGroupConflict,
    NoChange,
    PartitionConflict,
    PlanError,
    SchemaError,
    StaleVersion,
    TaskStillOwnsWork,
    UnknownOperator,
    UnknownTask,
    UnknownWorker,
    WorkerOverCapacity,
)
from .fluid import fluid_steps
from .helpers import add_partitions, migrate, rebalance, scale, split_key, update_logic
from .model import Abstraction, Operator, from_graph
from .ops import AssignLogic, AssignResource, AssignWorkload, Op, Plan, SplitKey, op_from_dict
from .parts import (
    DEFAULT_SLOTS,
    NEW_WORKER,
    PLACEABLE_STATUSES,
    PLACEHOLDER_STATUS,
    Input,
    Logic,
    Resources,
    Task,
    Worker,
    Workload,
)
from .validate import Resolver, apply_plan, check_abstraction, resolve_importable

__all__ = [
    "DEFAULT_SLOTS",
    "NEW_WORKER",
    "PLACEABLE_STATUSES",
    "PLACEHOLDER_STATUS",
    "Abstraction",
    "AbstractionError",
    "AssignLogic",
    "AssignResource",
    "AssignWorkload",
    "BadLogic",
    "Diff",
    "GroupBytes",
    "Input",
    "InvalidPlan",
    "KeyGroupConflict",
    "Logic",
    "NoChange",
    "Op",
    "Operator",
    "OperatorDiff",
    "PartitionConflict",
    "Plan",
    "PlanError",
    "Resolver",
    "Resources",
    "SchemaError",
    "SplitKey",
    "StaleVersion",
    "Task",
    "TaskStillOwnsWork",
    "UnknownOperator",
    "UnknownTask",
    "UnknownWorker",
    "Worker",
    "WorkerOverCapacity",
    "Workload",
    "add_partitions",
    "apply_plan",
    "bytes_shipped",
    "check_abstraction",
    "diff",
    "even_split",
    "fluid_steps",
    "from_graph",
    "greedy_balance",
    "imbalance",
    "inverse_weights",
    "key_group_bytes",
    "largest_step",
    "migrate",
    "op_from_dict",
    "rebalance",
    "resolve_importable",
    "scale",
    "split_key",
    "step_bytes",
    "update_logic",
]
