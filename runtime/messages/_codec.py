"""The machinery of :mod:`runtime.messages`: its exceptions, the base classes, the
registry of message types, and how fields are checked and encoded (from their
annotations). The protocol itself is documented in :mod:`runtime.messages`."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from ..errors import StreamRuntimeError
from ..layout import Layout

__all__ = [
    "MESSAGES",
    "STRUCTS",
    "MalformedMessage",
    "Message",
    "MessageError",
    "ToCoordinator",
    "ToWorker",
    "UnknownMessage",
    "check_annotations",
    "decode",
    "encode",
    "message",
    "struct",
]


class MessageError(StreamRuntimeError, ValueError):
    """A frame from ``peer`` that is not a control message; says what is wrong."""

    def __init__(self, peer: str, problem: str) -> None:
        super().__init__(f"{peer}: {problem}")
        self.peer = peer
        self.problem = problem


class UnknownMessage(MessageError):
    """No ``type``, or a type this protocol does not have (in the direction expected)."""


class MalformedMessage(MessageError):
    """A known type whose fields are missing, extra or of the wrong type."""


class Message:
    """Base of every control message; ``TYPE`` is its name on the wire."""

    __slots__ = ()
    TYPE: ClassVar[str]


class ToWorker(Message):
    """A message the coordinator sends a worker."""

    __slots__ = ()


class ToCoordinator(Message):
    """A message a worker sends the coordinator."""

    __slots__ = ()


MESSAGES: dict[str, type[Message]] = {}  # wire type -> class, every message
STRUCTS: set[type] = set()  # frozen dataclasses that travel inside messages, as maps
_M = TypeVar("_M", bound=type)


def message(name: str) -> Callable[[_M], _M]:
    """Class decorator: a frozen dataclass (slots) that travels as message ``name``."""

    def register(cls: _M) -> _M:
        if name in MESSAGES:
            raise TypeError(f"two messages named {name!r}")
        made = dataclasses.dataclass(frozen=True, slots=True)(cls)
        made.TYPE = name
        MESSAGES[name] = made
        return made

    return register


def struct(cls: _M) -> _M:
    """Class decorator: a frozen dataclass (slots) that travels inside messages, as a map."""
    made = dataclasses.dataclass(frozen=True, slots=True)(cls)
    STRUCTS.add(made)
    return made


# -- encoding and decoding ----------------------------------------------------------------------


class _Bad(Exception):
    """A field's value is not of its type (the message says how)."""


_Check = Callable[[Any], Any]  # a wire value -> the field's value; raises _Bad
_Wire = Callable[[Any], Any] | None  # a field's value -> its wire value (None: as it is)


def _what(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _scalar(tp: type) -> _Check:
    def check(v: Any) -> Any:
        if isinstance(v, tp) and not (isinstance(v, bool) and tp is not bool):
            return v
        if tp is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        raise _Bad(f"expected {tp.__name__}, got {_what(v)}")

    return check


def _checker(tp: Any) -> _Check:
    """How a wire value becomes a value of type ``tp`` (a field's annotation)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return lambda v: v
    if origin in (typing.Union, types.UnionType):
        checks = [_checker(a) for a in args if a is not type(None)]
        optional = type(None) in args

        def union(v: Any) -> Any:
            if v is None and optional:
                return None
            errors = []
            for check in checks:
                try:
                    return check(v)
                except _Bad as exc:
                    errors.append(str(exc))
            raise _Bad(" or ".join(errors))

        return union
    if tp is Layout:

        def layout(v: Any) -> Layout:
            if not isinstance(v, dict):
                raise _Bad(f"expected a layout (a map), got {_what(v)}")
            try:
                return Layout.from_wire(v)
            except (KeyError, TypeError, ValueError) as exc:
                raise _Bad(f"not a layout: {type(exc).__name__}: {exc}") from None

        return layout
    if isinstance(tp, type) and issubclass(tp, enum.Enum):

        def member(v: Any) -> Any:
            try:
                return tp(v)
            except ValueError:
                raise _Bad(f"expected one of {[m.value for m in tp]}, got {_what(v)}") from None

        return member
    if tp in STRUCTS:
        fields = _fields(tp)

        def struct(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _Bad(f"expected a {tp.__name__} (a map), got {_what(v)}")
            return tp(**_check_fields(fields, v, tp.__name__))

        return struct
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _checker(args[0])

            def seq(v: Any) -> tuple:
                if not isinstance(v, tuple | list):
                    raise _Bad(f"expected an array, got {_what(v)}")
                return tuple(item(x) for x in v)

            return seq
        items = [_checker(a) for a in args]

        def fixed(v: Any) -> tuple:
            if not isinstance(v, tuple | list) or len(v) != len(items):
                raise _Bad(f"expected an array of {len(items)}, got {_what(v)}")
            return tuple(check(x) for check, x in zip(items, v, strict=True))

        return fixed
    if origin is dict:
        key, val = _checker(args[0]), _checker(args[1])

        def mapping(v: Any) -> dict:
            if not isinstance(v, dict):
                raise _Bad(f"expected a map, got {_what(v)}")
            return {key(k): val(x) for k, x in v.items()}

        return mapping
    if tp in (str, int, float, bool, bytes):
        return _scalar(tp)
    raise TypeError(f"no wire form for {tp!r}")  # a bug in a message class


def _wire(tp: Any) -> _Wire:
    """How a value of type ``tp`` becomes what msgpack sends (None: as it is)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Layout:
        return Layout.to_wire
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return lambda v: v.value
    if tp in STRUCTS:
        return lambda v: _encode_fields(_fields(tp), v)
    if origin in (typing.Union, types.UnionType):
        inner = [_wire(a) for a in args if a is not type(None)]
        if len(inner) == 1 and inner[0] is not None:
            convert = inner[0]
            return lambda v: None if v is None else convert(v)
        return None
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        convert_item = _wire(args[0])
        if convert_item is not None:
            return lambda v: [convert_item(x) for x in v]
    if origin is dict:
        convert_val = _wire(args[1])
        if convert_val is not None:
            return lambda v: {k: convert_val(x) for k, x in v.items()}
    return None


_FieldSpec = tuple[str, _Check, _Wire, bool]  # name, check, wire, required
_specs: dict[type, list[_FieldSpec]] = {}


def _fields(cls: type) -> list[_FieldSpec]:
    spec = _specs.get(cls)
    if spec is None:
        hints = typing.get_type_hints(cls)
        spec = _specs[cls] = [
            (
                f.name,
                _checker(hints[f.name]),
                _wire(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        ]
    return spec


def _encode_fields(spec: list[_FieldSpec], obj: Any) -> dict[str, Any]:
    out = {}
    for name, _check, wire, _required in spec:
        value = getattr(obj, name)
        out[name] = value if wire is None else wire(value)
    return out


def _check_fields(spec: list[_FieldSpec], obj: dict, what: str) -> dict[str, Any]:
    known = {name for name, *_ in spec}
    extra = sorted(str(k) for k in obj if k not in known)
    if extra:
        raise _Bad(f"{what} has unknown fields {extra}")
    missing = [name for name, _c, _w, required in spec if required and name not in obj]
    if missing:
        raise _Bad(f"{what} lacks fields {missing}")
    values = {}
    for name, check, _wire, _required in spec:
        if name in obj:
            try:
                values[name] = check(obj[name])
            except _Bad as exc:
                raise _Bad(f"{what}.{name}: {exc}") from None
    return values


def encode(msg: Message) -> dict[str, Any]:
    """``msg`` as the map that travels: ``{"type": ..., <field>: <value>, ...}``."""
    return {"type": msg.TYPE, **_encode_fields(_fields(type(msg)), msg)}


def decode(obj: Any, peer: str, expect: type[Message] = Message) -> Message:
    """The message in ``obj`` (a decoded frame from ``peer``), which must be an ``expect``
    (:class:`ToWorker`, :class:`ToCoordinator`, or any message).

    Raises :class:`UnknownMessage` for a frame that is not a map with a known ``type`` of
    that direction, :class:`MalformedMessage` for a missing, extra or mistyped field; both
    name ``peer``."""
    if not isinstance(obj, dict):
        raise UnknownMessage(peer, f"expected a message (a map), got {_what(obj)}")
    kind = obj.get("type")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownMessage(peer, f"unknown message type {kind!r}")
    if not issubclass(cls, expect):
        raise UnknownMessage(peer, f"a {kind!r} message is not a {expect.__name__} message")
    body = {k: v for k, v in obj.items() if k != "type"}
    try:
        return cls(**_check_fields(_fields(cls), body, kind))
    except _Bad as exc:
        raise MalformedMessage(peer, str(exc)) from None


def check_annotations() -> None:
    """Build every message's and structure's field codecs now; TypeError for a field whose
    annotation has no wire form."""
    for cls in (*STRUCTS, *MESSAGES.values()):
        _fields(cls)
