"""The per-controller safety limits, enforced by the host and not trusted to the script (pure).

The host calls :func:`check` with each plan a controller decides, before submitting it::

    safety = SafetyConfig.from_dict({"cooldown_s": 120, "scale_out_cooldown_s": 5,
                                     "max_parallelism": {"*": 8},
                                     "max_moves_per_hour": 256, "dry_run": False})
    verdict = check(plan, view.abstraction, safety, view.history, now=view.now,
                    sizes=state_sizes(view))
    verdict.action     # "apply" | "dry_run" | "refuse"
    verdict.reason     # why it was refused (every limit broken, "; "-joined), else None
    verdict.moves      # key groups the plan moves: record it in the plan's Outcome

Steps of :func:`check`, each adding a reason when its limit is broken:

1. The plan must apply to the abstraction (:func:`controllers.plans.preview`; logic refs
   are resolved later by the control plane's own validation).
2. Cooldown: no reconfiguration of this controller ended less than ``cooldown_s`` ago,
   or less than ``scale_out_cooldown_s`` ago for a plan that only scales out
   (:func:`only_scales_out`: it adds tasks and moves work to them, and removes, moves or
   changes the logic of no task, nor splits a key). An overloaded job hurts at once while
   tasks added too many only cost resources, so a scale-out may follow the last
   reconfiguration sooner (Kubernetes HPA's separate scale-up and scale-down behaviors);
   every other plan, a scale-in among them, waits the full ``cooldown_s``, so no scale-in
   follows a scale-out sooner. The outcomes that count
   are the applied ones (completed, failed, aborted) and dry-run decisions (so a dry run
   records what would really happen); refusals do not.
3. Parallelism: an operator whose number of tasks the plan changes must end within its
   ``[min, max]`` (keys are operator names; ``"*"`` is the default for the others).
4. Moves: the key-group moves of the plan (:func:`controlplane.abstraction.diff`) plus
   those of the outcomes counted in step 2 over the last hour stay within
   ``max_moves_per_hour``.
5. State: no step of the plan (the whole plan in pause mode, each step in fluid mode)
   ships more than ``max_state_bytes_per_step`` of keyed state between workers, estimated
   from the measured state sizes (``sizes``: :func:`state_sizes` of the view;
   :func:`controlplane.abstraction.largest_step`). A plan moving a key group whose size
   was not measured is refused while the limit is set.

Then a plan with no reason is ``dry_run`` when the config says so, else ``apply``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.abstraction import (
    Abstraction,
    Diff,
    GroupBytes,
    Plan,
    PlanError,
    diff,
    key_group_bytes,
    largest_step,
)

from .config import check as require
from .config import config_to_dict, parse_config
from .plans import accept_any_ref, preview
from .view import Outcome, View

__all__ = [
    "MOVES_WINDOW_S",
    "SafetyConfig",
    "Verdict",
    "check",
    "count_moves",
    "only_scales_out",
    "state_sizes",
]

MOVES_WINDOW_S = 3600.0  # max_moves_per_hour counts the moves of the last hour
DEFAULT = "*"  # the key of min_parallelism / max_parallelism that applies to other operators


@dataclass(frozen=True)
class SafetyConfig:
    """A controller's safety limits; the defaults: a minute of cooldown (scale-outs too),
    no parallelism bounds beyond 1 task, no move limit, applied for real.
    ``scale_out_cooldown_s`` None means ``cooldown_s`` (:attr:`scale_out_wait_s`)."""

    cooldown_s: float = 60.0
    scale_out_cooldown_s: float | None = None
    min_parallelism: Mapping[str, int] = field(default_factory=dict)
    max_parallelism: Mapping[str, int] = field(default_factory=dict)
    max_moves_per_hour: int | None = None
    max_state_bytes_per_step: int | None = None
    dry_run: bool = False

    def __post_init__(self) -> None:
        require(self.cooldown_s >= 0, "cooldown_s", "must be >= 0 seconds", self.cooldown_s)
        if self.scale_out_cooldown_s is not None:
            require(
                0 <= self.scale_out_cooldown_s <= self.cooldown_s,
                "scale_out_cooldown_s",
                f"must be in [0, cooldown_s ({self.cooldown_s:g})] seconds (or null: cooldown_s)",
                self.scale_out_cooldown_s,
            )
        for name in ("min_parallelism", "max_parallelism"):
            for op, n in getattr(self, name).items():
                require(n >= 1, f"{name}.{op}", "must be >= 1", n)
        for op, n in self.min_parallelism.items():
            hi = self.bounds(op)[1]
            require(n <= hi, f"min_parallelism.{op}", f"must be <= max_parallelism {hi}", n)
        if self.max_moves_per_hour is not None:
            require(
                self.max_moves_per_hour >= 0,
                "max_moves_per_hour",
                "must be >= 0 (or null: no limit)",
                self.max_moves_per_hour,
            )
        if self.max_state_bytes_per_step is not None:
            require(
                self.max_state_bytes_per_step >= 1,
                "max_state_bytes_per_step",
                "must be >= 1 byte (or null: no limit)",
                self.max_state_bytes_per_step,
            )

    @property
    def scale_out_wait_s(self) -> float:
        """The cooldown of a plan that only scales out."""
        return self.cooldown_s if self.scale_out_cooldown_s is None else self.scale_out_cooldown_s

    def bounds(self, operator: str) -> tuple[int, float]:
        """``(min, max)`` tasks of ``operator`` (max is ``inf`` when unbounded)."""
        lo = self.min_parallelism.get(operator, self.min_parallelism.get(DEFAULT, 1))
        hi = self.max_parallelism.get(operator, self.max_parallelism.get(DEFAULT, float("inf")))
        return lo, hi

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SafetyConfig:
        """Parse the JSON object; :class:`ConfigError` names a bad field."""
        return parse_config(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)


@dataclass(frozen=True)
class Verdict:
    """The host's decision on one plan: ``action`` and, for ``refuse``, every ``reasons``."""

    action: Literal["apply", "dry_run", "refuse"]
    reasons: tuple[str, ...] = ()
    moves: int = 0

    @property
    def allowed(self) -> bool:
        return self.action != "refuse"

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) or None


def count_moves(before: Abstraction, after: Abstraction) -> int:
    """Key groups that change owner from ``before`` to ``after``, over all operators."""
    return _moves(diff(before, after))


def _moves(d: Diff) -> int:
    return sum(len(op.key_group_moves) for op in d.operators)


def only_scales_out(d: Diff) -> bool:
    """Whether the change ``d`` only scales out: some operator gains tasks, and no task is
    removed, moved to another worker or given other logic, and no key is split or merged
    back (key-group, partition and weight moves are allowed: they give the new tasks their
    work). The parallelism of every operator it changes grows."""
    ops = d.operators
    return any(op.new_tasks for op in ops) and not any(
        op.removed_tasks or op.moved_tasks or op.logic_changes or op.split_changes for op in ops
    )


def state_sizes(view: View) -> GroupBytes:
    """Each key group's estimated state in bytes, by keyed operator, from the view's
    metrics: the share its task last reported for it, else the task's size over its key
    groups (:func:`controlplane.abstraction.key_group_bytes`)."""
    tasks = view.metrics.tasks if view.metrics is not None else ()
    task_bytes = {t.task: float(t.state_bytes) for t in tasks if t.state_bytes is not None}
    shares = {t.task: dict(t.state_key_groups) for t in tasks if t.state_key_groups}
    return key_group_bytes(view.abstraction, task_bytes, shares)


def _cooldown(safety: SafetyConfig, scale_out: bool, age: float) -> str | None:
    """Why the cooldown that applies to the plan (step 2) holds it ``age`` seconds after
    the last counted reconfiguration, or None when it does not."""
    wait = safety.scale_out_wait_s if scale_out else safety.cooldown_s
    if wait <= 0 or age >= wait:
        return None
    if safety.scale_out_cooldown_s is None:
        which = f"the cooldown is {wait:g} s (cooldown_s)"
    elif scale_out:
        which = f"the cooldown of a plan that only scales out is {wait:g} s (scale_out_cooldown_s)"
    else:
        which = (
            f"the cooldown is {wait:g} s (cooldown_s: the plan does more than scale out, "
            f"which waits scale_out_cooldown_s, {safety.scale_out_cooldown_s:g} s)"
        )
    return (
        f"cooldown: the last reconfiguration was {age:.1f} s ago and {which} (next plan "
        f"allowed in {wait - age:.1f} s)"
    )


def _size(n: float) -> str:
    """Bytes as people read them: 8.0 MB, 512.0 kB, 20 B."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def check(
    plan: Plan,
    abstraction: Abstraction,
    safety: SafetyConfig,
    history: Iterable[Outcome],
    *,
    now: float,
    sizes: GroupBytes | None = None,
) -> Verdict:
    """Apply the safety limits to ``plan`` (module docstring); ``history`` holds the
    controller's earlier outcomes, ``now`` the host's clock in seconds since the epoch,
    ``sizes`` each key group's measured state (see :func:`state_sizes`)."""
    # Step 1.
    try:
        result = preview(abstraction, plan)
    except PlanError as exc:
        return Verdict("refuse", (f"invalid plan: {exc}",))
    change = diff(abstraction, result)
    moves = _moves(change)
    counted = [o for o in history if o.applied]
    reasons: list[str] = []
    # Step 2.
    if counted:
        held = _cooldown(safety, only_scales_out(change), now - max(o.time for o in counted))
        if held is not None:
            reasons.append(held)
    # Step 3.
    for op in result.operators:
        n, before = op.parallelism, abstraction.operator(op.name).parallelism
        if n == before:
            continue
        lo, hi = safety.bounds(op.name)
        if n < lo:
            reasons.append(
                f"min parallelism: operator {op.name!r} would have {n} task(s), below its "
                f"minimum of {lo}"
            )
        elif n > hi:
            reasons.append(
                f"max parallelism: operator {op.name!r} would have {n} task(s), above its "
                f"maximum of {hi:g}"
            )
    # Step 4.
    limit = safety.max_moves_per_hour
    if limit is not None and moves:
        recent = sum(o.moves for o in counted if now - o.time < MOVES_WINDOW_S)
        if recent + moves > limit:
            reasons.append(
                f"max key-group moves per hour: the plan moves {moves} key group(s) and "
                f"{recent} moved in the last hour; the limit is {limit}"
            )
    # Step 5.
    cap = safety.max_state_bytes_per_step
    if cap is not None:
        step = largest_step(abstraction, plan, sizes or {}, resolve_logic=accept_any_ref)
        if step is None:
            reasons.append(
                "max state per step: the plan moves key groups of a task whose state size "
                "was not measured yet (wait for its metrics, or lift the limit)"
            )
        elif step > cap:
            how = "a step of the plan" if plan.mode == "fluid" else "the plan"
            reasons.append(
                f"max state per step: {how} would ship about {_size(step)} of keyed state "
                f"between workers; the limit is {_size(cap)} (make it fluid with fewer key "
                "groups per step)"
            )
    if reasons:
        return Verdict("refuse", tuple(reasons), moves)
    return Verdict("dry_run" if safety.dry_run else "apply", (), moves)
