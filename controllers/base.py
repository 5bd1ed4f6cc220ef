"""The :class:`Controller` base class: the contract between a controller and its host.

Lifecycle, as the controller host drives it (one instance per attached controller, kept
alive in the controller's own subprocess, so attributes carry state across calls):

1. ``Controller(config)``: ``config`` is the JSON object given at upload (or None). A
   subclass with ``config_class`` (a frozen dataclass) gets it parsed and checked
   (:func:`controllers.config.parse_config`, raising :class:`ConfigError`); otherwise
   ``self.config`` is a read-only mapping. A config field ``interval_s`` overrides the
   class's :attr:`Controller.interval_s`. A subclass that defines ``__init__`` takes the
   same argument and calls ``super().__init__(config)`` first.
2. ``on_start(view)`` once, with the first view, before any ``decide``.
3. ``decide(view)`` every ``interval_s`` seconds: return a
   :class:`~controlplane.abstraction.Plan` built against ``view.abstraction`` (see
   :mod:`controllers.plans`), or None to leave the job alone. The host passes the result
   through :func:`decision_of`, then the safety limits (:mod:`controllers.safety`), then the
   control plane's validation.
4. ``on_result(outcome)`` once per returned plan, when its :class:`Outcome` is known
   (completed, failed, aborted, refused or dry_run). The host does not call ``decide``
   while one of the controller's plans is in flight, so the outcome of a plan always
   arrives before the next ``decide``; it also appears in ``view.history``.

Everything a controller does is a pure function of the views it was given and its own
state: no I/O, no clock (use ``view.now``), so a recorded sequence of views replays to the
same plans. Exceptions a method raises are reported by the host and never reach the job.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any, ClassVar

from controlplane.abstraction import Plan

from .config import parse_config
from .errors import ConfigError, DecisionError
from .view import Outcome, View

__all__ = ["DEFAULT_INTERVAL_S", "Controller", "decision_of"]

DEFAULT_INTERVAL_S = 10.0  # metrics windows are a few seconds; deciding faster chases noise


class Controller:
    """Base class of every controller (built-in or uploaded); see the module docstring."""

    interval_s: float = DEFAULT_INTERVAL_S
    config_class: ClassVar[type | None] = None

    def __init__(self, config: Mapping[str, Any] | Any | None = None) -> None:
        if self.config_class is None:
            if config is not None and not isinstance(config, Mapping):
                raise ConfigError(f"config: expected an object, got {type(config).__name__}")
            self.config: Any = types.MappingProxyType(dict(config or {}))
            interval = self.config.get("interval_s")
        else:
            self.config = parse_config(self.config_class, config)
            interval = getattr(self.config, "interval_s", None)
        if interval is not None:
            if (
                not isinstance(interval, int | float)
                or isinstance(interval, bool)
                or not math.isfinite(interval)
                or interval <= 0
            ):
                raise ConfigError(f"config.interval_s: expected a number > 0, got {interval!r}")
            self.interval_s = float(interval)

    def on_start(self, view: View) -> None:
        """Called once with the first view, before the first :meth:`decide`."""

    def decide(self, view: View) -> Plan | None:
        """The plan to apply now (against ``view.abstraction``), or None."""
        raise NotImplementedError(f"{type(self).__name__} must define decide(view)")

    def on_result(self, outcome: Outcome) -> None:
        """Called with the outcome of each plan :meth:`decide` returned, before the next
        :meth:`decide`."""


def decision_of(result: object, view: View) -> Plan | None:
    """What the host makes of ``decide``'s return value: None or an empty plan mean no
    decision; a plan must be against ``view.abstraction``'s version. Raises
    :class:`DecisionError` for anything else (the controller returned garbage)."""
    if result is None:
        return None
    if not isinstance(result, Plan):
        raise DecisionError(
            f"decide returned {type(result).__name__}, expected a Plan or None "
            "(build plans with controllers.scale/rebalance/migrate/update_logic or PlanBuilder)"
        )
    if not result.ops:
        return None
    if result.base_version != view.abstraction.version:
        raise DecisionError(
            f"decide returned a plan against version {result.base_version}, but the view "
            f"holds version {view.abstraction.version}; build plans against view.abstraction"
        )
    return result
