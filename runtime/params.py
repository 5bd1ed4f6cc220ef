"""Typed job parameters.

A job's ``build(params)`` takes a plain dict (from the CLI, ``k=v`` strings; from Python or
JSON, typed values). Each job declares its parameters as a frozen dataclass and calls
:func:`parse_params`, which converts strings, checks types and refuses unknown names with
a message that says what to fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from .errors import StreamRuntimeError

__all__ = ["ParamError", "describe_params", "parse_params"]

P = TypeVar("P")


class ParamError(StreamRuntimeError, ValueError):
    """A job parameter is unknown or has a value of the wrong type."""


def _convert(name: str, raw: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw is None or (isinstance(raw, str) and raw.lower() in ("", "none", "null")):
            return None
        return _convert(name, raw, args[0])
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ParamError(f"param {name!r} must be a bool (true/false), got {raw!r}")
    if hint is int:
        if isinstance(raw, bool):
            raise ParamError(f"param {name!r} must be an int, got {raw!r}")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                pass
        raise ParamError(f"param {name!r} must be an int, got {raw!r}")
    if hint is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                pass
        raise ParamError(f"param {name!r} must be a number, got {raw!r}")
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise ParamError(f"param {name!r} must be a string, got {raw!r}")
    return raw


def parse_params(cls: type[P], params: Mapping[str, Any] | None) -> P:
    """Build the dataclass ``cls`` from ``params``, converting and checking each value.

    Raises :class:`ParamError` naming the parameter and the expected type, or listing the
    known parameters when a name is unknown.
    """
    params = dict(params or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ParamError(
            f"unknown param(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    values = {name: _convert(name, raw, hints[name]) for name, raw in params.items()}
    try:
        obj = cls(**values)
    except ParamError:
        raise
    except (TypeError, ValueError) as exc:
        raise ParamError(str(exc)) from exc
    return obj


def describe_params(cls: type) -> dict[str, str]:
    """``{name: "type = default"}`` for help texts."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else "required"
        out[f.name] = f"{getattr(hints[f.name], '__name__', hints[f.name])} = {default!r}"
    return out
