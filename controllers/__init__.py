"""Controllers: the SDK (a Controller base, view and plan types) and the built-in policies.

Pure code: no I/O, no clock, no threads. Imports only itself, the standard library, numpy
and :mod:`controlplane.abstraction` (docs/design.md, section 9). The controller host runs each
controller in its own subprocess and talks JSON with it; this package is what runs on
the controller's side of that pipe, plus the safety checks the host applies. A user
controller::

    from controllers import Controller, View, scale

    class DoubleCount(Controller):
        interval_s = 30.0

        def decide(self, view: View):
            if view.metrics.latency.p99_ms > self.config.get("max_ms", 500):
                n = view.abstraction.operator("count").parallelism
                return scale(view.abstraction, "count", n * 2)
            return None

- :mod:`.base`: :class:`Controller` (the lifecycle: ``__init__(config)``, ``on_start(view)``,
  ``decide(view) -> Plan | None`` every ``interval_s``, ``on_result(outcome)``) and
  :func:`decision_of` (what the host makes of a return value).
- :mod:`.view`: :class:`View` (``job_id``, ``abstraction``, ``metrics``, ``workers``,
  ``history``, ``now``) and :class:`Outcome`; their JSON form is drawn in that module.
- :mod:`.metrics`: :class:`MetricsWindow`, the ``GET /jobs/{id}/metrics`` response with
  accessors (key-group loads, processing speeds, traffic matrix, latency...).
- :mod:`.plans`: :class:`PlanBuilder` and :func:`preview`; the helpers :func:`scale`,
  :func:`rebalance`, :func:`migrate`, :func:`update_logic` and the operations are
  re-exported from :mod:`controlplane.abstraction`.
- :mod:`.config`: typed configs (:func:`parse_config`).
- :mod:`.safety`: :class:`SafetyConfig` and :func:`~.safety.check` (re-exported as
  ``check_safety``): cooldown, min/max parallelism, key-group moves per hour, keyed state
  shipped per step, dry run;
  applied by the host.
- :mod:`.queueing`: the M/M/k model (:func:`sojourn_s`, :func:`erlang_c`).
- :mod:`.builtin`: the built-in controllers and :data:`BUILTINS`, their registry by name.

Exception tree (the abstraction's :class:`PlanError` tree propagates unchanged from the
plan helpers)::

    ControllerError (ValueError)   anything raised by this package itself
    ├── ConfigError                a config field unknown, mistyped or out of range
    ├── ViewError                  a view / metrics / outcome document of the wrong shape
    └── DecisionError              decide returned something that is not a decision
"""

from controlplane.abstraction import (
    AssignLogic,
    AssignResource,
    AssignWorkload,
    Plan,
    PlanError,
    SplitKey,
    migrate,
    rebalance,
    scale,
    split_key,
    update_logic,
)

from .base import DEFAULT_INTERVAL_S, Controller, decision_of
from .builtin import (
    BUILTINS,
    Ds2Autoscaler,
    Ds2AutoscalerConfig,
    DscPlacement,
    DscPlacementConfig,
    FlinkAutoscaler,
    FlinkAutoscalerConfig,
    LatencyAutoscaler,
    LatencyAutoscalerConfig,
    LoadBalancer,
    LoadBalancerConfig,
    LogicUpdater,
    LogicUpdaterConfig,
)
from .config import parse_config
from .errors import ConfigError, ControllerError, DecisionError, ViewError
from .metrics import (
    Channel,
    HotKey,
    Latency,
    MetricsWindow,
    OperatorSample,
    TaskSample,
    WorkerUsage,
)
from .plans import PlanBuilder, preview
from .safety import SafetyConfig, Verdict, count_moves, state_sizes
from .safety import check as check_safety
from .view import APPLIED_STATUSES, OUTCOME_STATUSES, Outcome, View

__all__ = [
    "APPLIED_STATUSES",
    "BUILTINS",
    "DEFAULT_INTERVAL_S",
    "OUTCOME_STATUSES",
    "AssignLogic",
    "AssignResource",
    "AssignWorkload",
    "Channel",
    "ConfigError",
    "Controller",
    "ControllerError",
    "DecisionError",
    "Ds2Autoscaler",
    "Ds2AutoscalerConfig",
    "DscPlacement",
    "DscPlacementConfig",
    "FlinkAutoscaler",
    "FlinkAutoscalerConfig",
    "HotKey",
    "Latency",
    "LatencyAutoscaler",
    "LatencyAutoscalerConfig",
    "LoadBalancer",
    "LoadBalancerConfig",
    "LogicUpdater",
    "LogicUpdaterConfig",
    "MetricsWindow",
    "OperatorSample",
    "Outcome",
    "Plan",
    "PlanBuilder",
    "PlanError",
    "SafetyConfig",
    "SplitKey",
    "TaskSample",
    "Verdict",
    "View",
    "ViewError",
    "WorkerUsage",
    "check_safety",
    "count_moves",
    "decision_of",
    "migrate",
    "parse_config",
    "preview",
    "rebalance",
    "scale",
    "split_key",
    "state_sizes",
    "update_logic",
]
