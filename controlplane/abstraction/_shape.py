"""Reading JSON documents field by field, with errors that name the path (internal).

Every reader raises :class:`SchemaError` whose message starts with the path of the field
(``operators[1].tasks[0].workload``) and says what was expected and what was found.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from .errors import SchemaError


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def obj(
    value: Any, path: str, required: Collection[str], optional: Collection[str] = ()
) -> Mapping:
    """``value`` as an object holding every ``required`` field and nothing unexpected."""
    if not isinstance(value, Mapping):
        raise SchemaError(f"{path}: expected an object, got {json_type(value)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise SchemaError(f"{path}: missing field(s) {', '.join(map(repr, missing))}")
    unexpected = sorted(str(k) for k in value if k not in required and k not in optional)
    if unexpected:
        allowed = ", ".join(map(repr, [*required, *optional]))
        raise SchemaError(
            f"{path}: unexpected field(s) {', '.join(map(repr, unexpected))}; allowed: {allowed}"
        )
    return value


def mapping(value: Any, path: str) -> Mapping:
    """``value`` as an object with any string keys."""
    if not isinstance(value, Mapping):
        raise SchemaError(f"{path}: expected an object, got {json_type(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SchemaError(f"{path}: keys must be strings, got {json_type(key)}")
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{path}: expected a non-empty string, got {json_type(value)}")
    return value


def opt_string(value: Any, path: str) -> str | None:
    return None if value is None else string(value, path)


def integer(value: Any, path: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaError(f"{path}: expected an integer, got {json_type(value)}")
    if minimum is not None and value < minimum:
        raise SchemaError(f"{path}: expected an integer >= {minimum}, got {value}")
    return value


def opt_integer(value: Any, path: str, minimum: int | None = None) -> int | None:
    return None if value is None else integer(value, path, minimum)


def number(value: Any, path: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise SchemaError(f"{path}: expected a finite number, got {json_type(value)}")
    return float(value)


def array(value: Any, path: str) -> list | tuple:
    if not isinstance(value, list | tuple):
        raise SchemaError(f"{path}: expected an array, got {json_type(value)}")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise SchemaError(f"{path}: expected true or false, got {json_type(value)}")
    return value
