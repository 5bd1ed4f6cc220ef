"""Fluid mode: a plan carried out as a sequence of small steps (pure).

In ``pause`` mode a plan is one reconfiguration: every affected task pauses until all of
its state has moved, so a plan moving many key groups (or much state) pauses their tasks
for as long as the whole transfer takes. In ``fluid`` mode (after Megaphone's batched
migration) the plan becomes a sequence of plans, each its own version, in each of which
no task gives or gains more than ``batch_size`` key groups: a task's records wait only
while its few key groups move, and between steps the job runs on a valid intermediate
configuration. (The coordinator runs the steps that only move key groups as stages of
one live reconfiguration: :mod:`controlplane.coordinator.fluid`.)

:func:`fluid_steps` splits a plan; every step is validated as it is built
(:func:`~controlplane.abstraction.apply_plan`), and applying them in order gives the
plan's result (with a version per step). Steps, in order:

1. Setup: every operation of the plan except keyed workloads, removals and the moves of
   keyed tasks to other workers, in the plan's order (new tasks and workers, migrations
   of tasks without key groups, logic, weights). Omitted when there is none.
2. With a ``batch_size``, moves of keyed tasks that own key groups (``migrate``) go
   through a stand-in: a temporary task of the same operator on the target worker (with
   the operators forward-connected to it, as a scale-out would add), which takes the
   task's key groups in batches; then, in one step, the emptied task moves (nothing to
   ship) and takes its key groups back from the stand-in (a hand-over on one worker
   copies no state), and the stand-in is removed in that step too unless other moves of
   the plan come after it (then at the end). Without one, or when that is not
   possible (the operator's parallelism changes in the same plan, no slot for the
   stand-in, a task with its own logic), the task moves whole, in the setup step (in
   fluid mode its new instance starts at once, each key group's records waiting for that
   group's state).
3. One step per batch of the plan's other key-group moves (one batch when
   ``batch_size`` is None): ``(operator, from task, to task, group)`` in order, each in
   the first batch where neither its giver nor its gainer already moves ``batch_size``
   key groups. A step's cost to latency is per task (the groups it gives or gains wait
   while they move), so tasks that do not share groups move theirs in the same step: a
   change over many tasks takes as many steps as over two.
4. The removals (their tasks emptied by then) are part of the last step.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from .errors import NoChange, PlanError
from .model import Abstraction
from .ops import AssignResource, AssignWorkload, Op, Plan
from .validate import Resolver, apply_plan, resolve_importable

__all__ = ["fluid_steps"]

Move = tuple[str, str, str, int]  # operator, from task, to task, key group


class _Steps:
    """Steps applied as they are added, so each is validated against the one before."""

    def __init__(self, base: Abstraction, resolve_logic: Resolver) -> None:
        self.current = base
        self.steps: list[tuple[Op, ...]] = []
        self.resolve = resolve_logic

    def add(self, ops: Iterable[Op]) -> None:
        ops = tuple(ops)
        if not ops:
            return
        try:
            plan = Plan(self.current.version, ops)
            self.current = apply_plan(self.current, plan, resolve_logic=self.resolve)
        except NoChange:
            return
        self.steps.append(ops)

    def moves_to(self, owners: dict[str, dict[int, str]]) -> list[Move]:
        """The key groups whose owner differs from ``owners`` (operator -> group -> task)."""
        return sorted(
            (name, src, owners[name][g], g)
            for name in owners
            for g, src in self.current.owner_of(name).items()
            if owners[name][g] != src
        )

    def batches(self, moves: list[Move], size: int | None, last: Iterable[Op] = ()) -> None:
        """One step per round of moves in which no task gives, and none gains, more than
        ``size`` key groups (all at once when None); ``last`` joins the last step."""
        last = tuple(last)
        cuts = _rounds(moves, size) if size else [moves]
        for i, batch in enumerate(cuts):
            owned = {
                name: {
                    t.id: set(t.workload.key_groups or ())
                    for t in self.current.operator(name).tasks
                }
                for name in {m[0] for m in batch}
            }
            touched: dict[str, set[str]] = defaultdict(set)
            for name, src, dst, group in batch:
                owned[name][src].discard(group)
                owned[name][dst].add(group)
                touched[name] |= {src, dst}
            ops: list[Op] = [
                AssignWorkload(name, {t: tuple(sorted(owned[name][t])) for t in sorted(tasks)})
                for name, tasks in sorted(touched.items())
            ]
            self.add([*ops, *(last if i == len(cuts) - 1 else ())])


def _rounds(moves: list[Move], size: int) -> list[list[Move]]:
    """``moves`` (in order) in rounds, each move in the first round where its giver and
    its gainer still have room (``size`` groups out of, and into, each task): tasks on
    other workers move their groups in the same step, none more than ``size`` at a time.
    At least one round, possibly empty."""
    rounds: list[list[Move]] = []
    taken: list[Counter] = []
    for move in moves:
        name, src, dst, _ = move
        out, into = (name, src, "out"), (name, dst, "in")
        i = next((k for k, c in enumerate(taken) if c[out] < size and c[into] < size), len(rounds))
        if i == len(rounds):
            rounds.append([])
            taken.append(Counter())
        rounds[i].append(move)
        taken[i][out] += 1
        taken[i][into] += 1
    return rounds or [[]]


def _removal(op: Op) -> bool:
    return isinstance(op, AssignResource) and op.worker is None


def _keyed_workload(base: Abstraction, op: Op) -> bool:
    return isinstance(op, AssignWorkload) and base.operator(op.operator).keyed


def _owners(a: Abstraction) -> dict[str, dict[int, str]]:
    return {op.name: a.owner_of(op.name) for op in a.operators if op.keyed}


def _migrations(base: Abstraction, plan: Plan, result: Abstraction) -> list[AssignResource]:
    """The plan's moves of keyed tasks that own key groups to another worker, when a
    stand-in can carry them (module docstring, step 2)."""
    found: list[AssignResource] = []
    for op in plan.ops:
        if not isinstance(op, AssignResource) or op.worker is None:
            continue
        operator = base.operator(op.operator)
        if not (operator.keyed and base.has_task(op.task)):
            continue
        task = base.task(op.task)
        if task.worker == op.worker or not task.workload.key_groups:
            continue
        group = base.forward_group(op.operator)
        if any(result.operator(m).parallelism != base.operator(m).parallelism for m in group):
            continue
        if task.logic != operator.current_logic():
            continue
        if result.task(op.task).worker != op.worker:  # moved again later in the plan
            continue
        found.append(op)
    return found


def _through_stand_ins(
    base: Abstraction,
    plan: Plan,
    result: Abstraction,
    migrations: list[AssignResource],
    resolve_logic: Resolver,
) -> list[tuple[Op, ...]]:
    steps = _Steps(base, resolve_logic)
    # Step 1, with the stand-ins: index n, n+1... of each forward group, on the target.
    stand_in: dict[str, str] = {}
    created: list[AssignResource] = []
    next_index: dict[str, int] = {}
    for m in migrations:
        group = base.forward_group(m.operator)
        index = next_index.get(group[0], base.operator(m.operator).parallelism)
        next_index[group[0]] = index + 1
        stand_in[m.task] = f"{m.operator}-{index}"
        created += [AssignResource(name, f"{name}-{index}", m.worker) for name in group]
    setup = [
        op for op in plan.ops if not (_removal(op) or _keyed_workload(base, op) or op in migrations)
    ]
    steps.add([*setup, *created])
    # Step 2: the migrating tasks' key groups to their stand-ins, in batches...
    owners = _owners(steps.current)
    for m in migrations:
        for g in base.task(m.task).workload.key_groups or ():
            owners[m.operator][g] = stand_in[m.task]
    steps.batches(steps.moves_to(owners), plan.batch_size)
    # ... then, in one step, the emptied tasks move and take their key groups back (on one
    # worker: no copy); the stand-ins go with it unless other moves come after.
    handed = steps.current
    for m in migrations:
        for g in base.task(m.task).workload.key_groups or ():
            owners[m.operator][g] = m.task
    back = _Steps(handed, resolve_logic)
    back.batches(back.moves_to(owners), None)
    removals = [op for op in plan.ops if _removal(op)]
    removals += [AssignResource(op.operator, op.task, None) for op in created]
    rest = back.moves_to(_owners(result))
    hand_back = [*migrations, *(op for ops in back.steps for op in ops)]
    steps.add([*hand_back, *(() if rest else removals)])
    # Steps 3 and 4: the plan's other moves; removals, the stand-ins' last.
    if rest:
        steps.batches(steps.moves_to(_owners(result)), plan.batch_size, removals)
    return steps.steps


def fluid_steps(
    base: Abstraction, plan: Plan, *, resolve_logic: Resolver = resolve_importable
) -> list[tuple[Op, ...]]:
    """The operations of each step of ``plan`` (module docstring). Raises the plan's
    :class:`PlanError` if the plan itself is refused. Step ``i`` applies to the version
    the steps before it leave."""
    result = apply_plan(base, plan, resolve_logic=resolve_logic)
    migrations = _migrations(base, plan, result)
    if migrations and plan.batch_size is not None:
        try:
            return _through_stand_ins(base, plan, result, migrations, resolve_logic)
        except PlanError:  # e.g. no slot for a stand-in: the tasks move whole
            pass
    steps = _Steps(base, resolve_logic)
    steps.add(op for op in plan.ops if not (_removal(op) or _keyed_workload(base, op)))
    removals = [op for op in plan.ops if _removal(op)]
    steps.batches(steps.moves_to(_owners(result)), plan.batch_size, removals)
    return steps.steps
