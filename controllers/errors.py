"""The exceptions of the controllers package (the tree is drawn in the package docstring).

Each carries a message that names what is wrong and where (a JSON path such as
``view.metrics.tasks[2].busy`` or a config field such as ``config.threshold``).
"""

from __future__ import annotations

__all__ = ["ConfigError", "ControllerError", "DecisionError", "ViewError"]


class ControllerError(ValueError):
    """Base of every error raised by :mod:`controllers` itself (the abstraction's
    :class:`~controlplane.abstraction.PlanError` propagates unchanged from the helpers)."""


class ConfigError(ControllerError):
    """A controller config with an unknown field, a value of the wrong type or out of range.
    The message starts with ``config.<field>``."""


class ViewError(ControllerError):
    """A view, metrics or outcome document of the wrong shape, or a view whose parts belong
    to different jobs. The message starts with the JSON path of the offending field."""


class DecisionError(ControllerError):
    """What ``decide`` returned is not a decision: not a :class:`Plan` or None, or a plan
    built against another version of the abstraction than the view's."""
