"""Typed controller configs: a frozen dataclass read from the JSON object a user uploads.

:func:`parse_config` checks every field against its annotation and names the culprit::

    @dataclass(frozen=True)
    class Config:
        threshold: float = 0.2
        operators: tuple[str, ...] = ()

    parse_config(Config, {"threshold": 0.3})       # Config(threshold=0.3, operators=())
    parse_config(Config, {"treshold": 0.3})        # ConfigError: config.treshold: unknown ...

Supported annotations: ``bool``, ``int``, ``float`` (ints accepted), ``str``, ``X | None``,
``tuple[X, ...]`` (from a JSON array), ``Mapping[str, X]`` / ``dict[str, X]`` (stored as a
read-only mapping) and ``Literal[...]``. Range checks belong in the dataclass's
``__post_init__``, raising :class:`ConfigError` (or ValueError, which is wrapped).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["check", "config_to_dict", "parse_config"]

C = TypeVar("C")


def parse_config(cls: type[C], data: Mapping[str, Any] | C | None) -> C:
    """An instance of the dataclass ``cls`` from ``data`` (None: all defaults; an instance
    of ``cls`` is returned as is). Raises :class:`ConfigError` for an unknown field, a
    missing required one, a value of the wrong type or one ``__post_init__`` refuses."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise ConfigError(
            f"config.{unknown[0]}: unknown field; {cls.__name__} has {', '.join(fields)}"
        )
    values = {name: _coerce(hints[name], data[name], f"config.{name}") for name in data}
    missing = [
        n
        for n, f in fields.items()
        if n not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"config.{missing[0]}: required")
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config: {exc}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """The JSON form of a config dataclass (tuples as lists, mappings as objects)."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def check(condition: bool, field: str, requirement: str, value: Any) -> None:
    """Raise ``ConfigError("config.<field>: <requirement>, got <value>")`` unless ``condition``
    (for ``__post_init__`` range checks)."""
    if not condition:
        raise ConfigError(f"config.{field}: {requirement}, got {value!r}")


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(option, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits no type")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"{path}: expected one of {', '.join(map(repr, args))}, got {value!r}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected an array, got {value!r}")
        item = args[0] if args else Any
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected an object, got {value!r}")
        item = args[1] if len(args) == 2 else Any
        return types.MappingProxyType(
            {str(k): _coerce(item, v, f"{path}.{k}") for k, v in value.items()}
        )
    return _scalar(hint, value, path)


def _scalar(hint: Any, value: Any, path: str) -> Any:
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if hint in (int, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: expected a finite number, got {value!r}")
        if hint is int:
            if value != int(value):
                raise ConfigError(f"{path}: expected an integer, got {value!r}")
            return int(value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported config type {hint!r}")
