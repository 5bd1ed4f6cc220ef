"""The built-in controllers, attached by name (``{"builtin": "load_balancer"}``).

- ``load_balancer``: Trisk's load balancer with TAG's time-aware weighting
  (:mod:`.load_balancer`).
- ``latency_autoscaler``: eSault's overload/underload detection with Elasticutor's M/M/k
  sizing (:mod:`.latency_autoscaler`).
- ``ds2_autoscaler``: DS2's one-step sizing of every operator from rates per busy second,
  refined by the M/M/k model (:mod:`.ds2_autoscaler`).
- ``flink_autoscaler``: the Flink Kubernetes operator autoscaler's decision rule with its
  documented defaults, for comparison (:mod:`.flink_autoscaler`).
- ``dsc_placement``: DSC-Heron's traffic-class placement (:mod:`.dsc_placement`).
- ``logic_updater``: change of logic driven by the config (:mod:`.logic_updater`).

Each takes its paper's parameters as a typed config (``<Name>Config``, a frozen dataclass
with defaults) and is unit-tested on recorded views.
"""

from __future__ import annotations

from ..base import Controller
from .ds2_autoscaler import Ds2Autoscaler, Ds2AutoscalerConfig
from .dsc_placement import DscPlacement, DscPlacementConfig
from .flink_autoscaler import FlinkAutoscaler, FlinkAutoscalerConfig
from .latency_autoscaler import LatencyAutoscaler, LatencyAutoscalerConfig
from .load_balancer import LoadBalancer, LoadBalancerConfig
from .logic_updater import LogicUpdater, LogicUpdaterConfig

__all__ = [
    "BUILTINS",
    "Ds2Autoscaler",
    "Ds2AutoscalerConfig",
    "DscPlacement",
    "DscPlacementConfig",
    "FlinkAutoscaler",
    "FlinkAutoscalerConfig",
    "LatencyAutoscaler",
    "LatencyAutoscalerConfig",
    "LoadBalancer",
    "LoadBalancerConfig",
    "LogicUpdater",
    "LogicUpdaterConfig",
]

BUILTINS: dict[str, type[Controller]] = {
    "load_balancer": LoadBalancer,
    "latency_autoscaler": LatencyAutoscaler,
    "ds2_autoscaler": Ds2Autoscaler,
    "flink_autoscaler": FlinkAutoscaler,
    "dsc_placement": DscPlacement,
    "logic_updater": LogicUpdater,
}
