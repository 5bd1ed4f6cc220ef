"""Change of logic: roll an operator onto the logic its config names.

The example of a control policy that is not about load: a fraud or alert rule whose
threshold or code is replaced. The config maps operators to logic refs (an importable
``package.module:callable`` or uploaded code ``code:<id>:callable``); whenever some task
of such an operator runs another ref (the config changed, or an uploaded code version
was named), the controller returns ``update_logic`` for the tasks that differ (``"all"``
when every task differs). Several operators change in one plan.

A ref whose plans failed, were aborted or refused ``max_attempts`` times in a row is not
tried again by this instance (a ref that does not import would otherwise be retried every
period); the host starts a new instance when the config changes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.abstraction import AssignLogic, Plan

from ..base import Controller
from ..config import check
from ..errors import ConfigError
from ..plans import PlanBuilder
from ..view import Outcome, View

__all__ = ["LogicUpdater", "LogicUpdaterConfig"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogicUpdaterConfig:
    interval_s: float = 10.0
    logic: Mapping[str, str] = field(default_factory=dict)  # operator -> logic ref
    max_attempts: int = 3  # unsuccessful plans for one ref before giving up on it

    def __post_init__(self) -> None:
        check(self.max_attempts >= 1, "max_attempts", "must be >= 1", self.max_attempts)
        for op, ref in self.logic.items():
            check(bool(ref), f"logic.{op}", "must be a non-empty logic ref", ref)


class LogicUpdater(Controller):
    """Keeps the named operators on the configured logic (module docstring)."""

    config_class = LogicUpdaterConfig
    config: LogicUpdaterConfig

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._misses: Counter[tuple[str, str]] = Counter()

    def on_start(self, view: View) -> None:
        """Raises :class:`ConfigError` for an operator the job does not have."""
        names = {op.name for op in view.abstraction.operators}
        for op in self.config.logic:
            if op not in names:
                raise ConfigError(
                    f"config.logic.{op}: job {view.job_id!r} has no operator {op!r} "
                    f"(operators: {', '.join(sorted(names))})"
                )

    def decide(self, view: View) -> Plan | None:
        builder = PlanBuilder(view.abstraction)
        for name, ref in self.config.logic.items():
            if self._misses[name, ref] >= self.config.max_attempts:
                continue
            op = view.abstraction.operator(name)
            stale = [t.id for t in op.tasks if t.logic.ref != ref]
            if stale:
                logger.info("operator %r: %d task(s) to logic %r", name, len(stale), ref)
                builder.update_logic(name, ref, None if len(stale) == op.parallelism else stale)
        return builder.build()

    def on_result(self, outcome: Outcome) -> None:
        for op in outcome.plan.ops:
            if isinstance(op, AssignLogic):
                key = (op.operator, op.ref)
                if outcome.status == "completed":
                    self._misses.pop(key, None)
                elif outcome.status != "dry_run":
                    self._misses[key] += 1
