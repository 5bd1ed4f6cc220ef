"""Balancing algorithms on plain data (task -> key groups, key group -> load); pure.

- :func:`even_split` spreads key groups over tasks by count, moving the fewest groups.
- :func:`greedy_balance` lowers the most loaded task's load, one key group at a time.
- :func:`inverse_weights` gives stateless tasks weights inversely proportional to their
  per-record cost.

They know nothing of plans; :mod:`.helpers` turns their results into operations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["even_split", "even_targets", "greedy_balance", "imbalance", "inverse_weights"]


def imbalance(loads: Iterable[float]) -> float:
    """``max / mean - 1`` of ``loads`` (0.0 when perfectly even, empty or all zero)."""
    values = list(loads)
    total = sum(values)
    if not values or total <= 0:
        return 0.0
    return max(values) * len(values) / total - 1.0


def even_targets(counts: Sequence[tuple[str, int]], total: int) -> dict[str, int]:
    """How many key groups each task should own: ``total // n`` or one more, the extra
    ones going to the tasks that own the most now (ties: earlier first), which minimizes
    the number of groups that must move."""
    base, extra = divmod(total, len(counts))
    order = sorted(range(len(counts)), key=lambda i: (-counts[i][1], i))
    return {counts[i][0]: base + (1 if rank < extra else 0) for rank, i in enumerate(order)}


def even_split(
    current: Mapping[str, Sequence[int]], keep: Sequence[str]
) -> dict[str, tuple[int, ...]]:
    """Every key group of ``current`` (task -> groups) given to the tasks of ``keep`` so that
    their counts differ by at most one, moving as few groups as possible.

    Tasks of ``current`` not in ``keep`` give all their groups away; tasks of ``keep`` not
    in ``current`` start empty. Tasks above their target give their highest groups; the
    freed groups fill the least loaded tasks first, in ascending runs. The number of moves
    is ``sum(max(0, owned - target))`` over all tasks (target 0 for removed tasks), the
    minimum for an even split. Returns the groups of every task in ``keep``.
    """
    if not keep:
        raise ValueError("even_split needs at least one task to keep")
    groups = {t: sorted(current.get(t, ())) for t in keep}
    pool = sorted(g for t, gs in current.items() if t not in groups for g in gs)
    total = sum(len(gs) for gs in current.values())
    targets = even_targets([(t, len(groups[t])) for t in keep], total)
    for t in keep:
        excess = len(groups[t]) - targets[t]
        if excess > 0:
            pool.extend(groups[t][-excess:])
            groups[t] = groups[t][:-excess]
    pool.sort()
    position = {t: i for i, t in enumerate(keep)}
    for t in sorted(keep, key=lambda t: (len(groups[t]), position[t])):
        need = targets[t] - len(groups[t])
        if need > 0:
            groups[t].extend(pool[:need])
            del pool[:need]
    return {t: tuple(sorted(gs)) for t, gs in groups.items()}


def greedy_balance(
    current: Mapping[str, Sequence[int]], loads: Mapping[int, float], threshold: float = 0.0
) -> dict[str, tuple[int, ...]]:
    """Key groups moved one at a time from the most loaded task to the least loaded one,
    to lower the maximum task load with few moves.

    Each step takes the most loaded task ``hi`` and the least loaded ``lo`` (ties: earlier
    in ``current``) and moves the group of ``hi`` whose load is closest to half their gap,
    among those with ``0 < load < gap`` (a move that lowers ``hi`` without making ``lo`` the
    new ``hi``). It stops when :func:`imbalance` is at most ``threshold`` or no group
    qualifies; every step lowers the sum of squared task loads, so it always stops.
    Groups missing from ``loads`` weigh 0. Returns the groups of every task.
    """
    order = list(current)
    if not order:
        return {}
    owned = {t: set(current[t]) for t in order}
    task_load = {t: sum(loads.get(g, 0.0) for g in owned[t]) for t in order}
    for _ in range(sum(len(gs) for gs in owned.values()) * len(order) + 1):
        if imbalance(task_load.values()) <= threshold:
            break
        hi = max(order, key=lambda t: (task_load[t], -order.index(t)))
        lo = min(order, key=lambda t: (task_load[t], order.index(t)))
        gap = task_load[hi] - task_load[lo]
        candidates = [g for g in owned[hi] if 0 < loads.get(g, 0.0) < gap]
        if not candidates:
            break
        g = min(candidates, key=lambda g: (abs(gap / 2 - loads[g]), g))
        owned[hi].remove(g)
        owned[lo].add(g)
        task_load[hi] -= loads[g]
        task_load[lo] += loads[g]
    return {t: tuple(sorted(owned[t])) for t in order}


def inverse_weights(tasks: Sequence[str], costs: Mapping[str, float]) -> dict[str, float]:
    """Weights inversely proportional to each task's per-record cost, averaging 1.0.

    ``costs`` maps task ids to what one record costs the task (e.g. its measured busy
    seconds per record): a task twice as slow gets half the records. Tasks with no cost
    or a cost <= 0 (idle tasks were not measured) count as the mean of the positive
    costs; with no positive cost at all every weight is 1.0. Weights are rounded to 6
    decimals (at least 1e-6: every task keeps some records).
    """
    positive = [c for t, c in costs.items() if t in tasks and c > 0 and math.isfinite(c)]
    if not positive:
        return {t: 1.0 for t in tasks}
    fill = sum(positive) / len(positive)
    inverse = {t: 1.0 / (costs[t] if costs.get(t, 0) > 0 else fill) for t in tasks}
    scale = len(tasks) / sum(inverse.values())
    return {t: max(round(v * scale, 6), 1e-6) for t, v in inverse.items()}
