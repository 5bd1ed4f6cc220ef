"""Reading the JSON documents the controller host sends, field by field (internal).

Every reader raises :class:`~controllers.errors.ViewError` whose message starts with the
field's path. Objects may carry fields beyond the ones read (the REST responses a view is
made of may grow); a missing field is an error unless the caller gives a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import ViewError

_MISSING = object()


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return repr(value)


def obj(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ViewError(f"{path}: expected an object, got {_kind(value)}")
    return value


def field(d: Mapping[str, Any], name: str, path: str, default: Any = _MISSING) -> Any:
    if name in d:
        return d[name]
    if default is _MISSING:
        raise ViewError(f"{path}: missing field {name!r}")
    return default


def array(value: Any, path: str) -> list | tuple:
    if not isinstance(value, list | tuple):
        raise ViewError(f"{path}: expected an array, got {_kind(value)}")
    return value


def number(value: Any, path: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ViewError(f"{path}: expected a finite number, got {_kind(value)}")
    return float(value)


def integer(value: Any, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ViewError(f"{path}: expected an integer, got {_kind(value)}")
    return value


def opt_integer(value: Any, path: str) -> int | None:
    return None if value is None else integer(value, path)


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ViewError(f"{path}: expected a string, got {_kind(value)}")
    return value


def opt_string(value: Any, path: str) -> str | None:
    return None if value is None else string(value, path)


def int_keys(value: Any, path: str) -> dict[int, int]:
    """An object of integer counts keyed by integers (JSON writes the keys as strings)."""
    result: dict[int, int] = {}
    for key, count in obj(value, path).items():
        try:
            group = int(key)
        except (TypeError, ValueError):
            raise ViewError(f"{path}: key {key!r} is not an integer") from None
        result[group] = integer(count, f"{path}[{key!r}]")
    return result


def opt_int_keys(value: Any, path: str) -> dict[int, int] | None:
    return None if value is None else int_keys(value, path)


def str_keys(value: Any, path: str) -> dict[str, int]:
    """An object of integer counts keyed by strings."""
    return {str(k): integer(v, f"{path}[{k!r}]") for k, v in obj(value, path).items()}


def opt_partitions(value: Any, path: str) -> dict[str, dict[str, Any]] | None:
    """A partitioned source task's partitions: name -> {lag: int | None, stalled: str | None}."""
    if value is None:
        return None
    return {
        str(name): {
            "lag": opt_integer(
                field(obj(h, f"{path}[{name!r}]"), "lag", path, None), f"{path}[{name!r}].lag"
            ),
            "stalled": opt_string(
                field(obj(h, f"{path}[{name!r}]"), "stalled", path, None),
                f"{path}[{name!r}].stalled",
            ),
        }
        for name, h in obj(value, path).items()
    }
