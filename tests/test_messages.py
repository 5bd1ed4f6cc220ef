"""The control protocol's contract (:mod:`runtime.messages`): every message survives the
wire unchanged, every message is documented once with its direction and fields, and
what is not a message is refused naming the peer."""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.messages as messages
from runtime.codec import packb, unpackb
from runtime.layout import Layout
from runtime.messages import (
    MESSAGES,
    MalformedMessage,
    MessageError,
    ToCoordinator,
    ToWorker,
    UnknownMessage,
    decode,
    encode,
)
from runtime.messages._codec import STRUCTS

names = st.text(max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False)
# What msgpack carries unchanged (arrays come back as tuples).
plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | floats
    | names
    | st.binary(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=3).map(tuple) | st.dictionaries(names, inner, max_size=3)
    ),
    max_leaves=8,
)
layouts = st.builds(
    Layout,
    placement=st.dictionaries(names, names, max_size=4),
    assignment=st.dictionaries(
        names, st.lists(st.integers(0, 127), max_size=4).map(tuple), max_size=3
    ),
    weights=st.dictionaries(names, floats, max_size=3),
    logic=st.dictionaries(names, st.binary(max_size=16), max_size=2),
)
SCALARS: dict[Any, st.SearchStrategy] = {
    str: names,
    int: st.integers(-(2**40), 2**40),
    float: floats,
    bool: st.booleans(),
    bytes: st.binary(max_size=64),
    Any: plain,
    Layout: layouts,
}


def strategy(tp: Any) -> st.SearchStrategy:
    """Values of a field's type ``tp``, as a sender could put in it."""
    if tp in SCALARS:
        return SCALARS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([st.none() if a is type(None) else strategy(a) for a in args])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if tp in STRUCTS:
        return instances(tp)
    if origin is tuple and args[1:] == (Ellipsis,):
        return st.lists(strategy(args[0]), max_size=4).map(tuple)
    if origin is tuple:
        return st.tuples(*map(strategy, args))
    if origin is dict:
        return st.dictionaries(strategy(args[0]), strategy(args[1]), max_size=3)
    raise AssertionError(f"no strategy for {tp!r}")


def instances(cls: type) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


@pytest.mark.parametrize(
    "cls", sorted(MESSAGES.values(), key=lambda c: c.TYPE), ids=lambda c: c.TYPE
)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_message_survives_the_wire_unchanged(cls: type, data: st.DataObject) -> None:
    msg = data.draw(instances(cls))
    wire = unpackb(packb(encode(msg)))
    assert wire["type"] == cls.TYPE
    assert decode(wire, "worker w1") == msg
    direction = ToWorker if issubclass(cls, ToWorker) else ToCoordinator
    assert decode(wire, "worker w1", direction) == msg


def documented(section: str) -> dict[str, tuple[str, list[str]]]:
    """Class -> (wire type, fields) for each ``- ``type`` (:class:`Class`) {fields}``."""
    text = " ".join(section.split())
    found = re.findall(r"- ``(\w+)`` \(:class:`(\w+)`\) \{([^}]*)\}", text)
    return {
        cls: (kind, [f.strip() for f in fields.split(",") if f.strip()])
        for kind, cls, fields in found
    }


def test_every_message_is_documented_once_with_its_direction_and_fields() -> None:
    doc = messages.__doc__ or ""
    to_worker = doc.split("Coordinator -> worker (")[1].split("Worker -> coordinator (")[0]
    to_coordinator = doc.split("Worker -> coordinator (")[1].split("Refusals.")[0]
    for section, direction in ((to_worker, ToWorker), (to_coordinator, ToCoordinator)):
        listed = documented(section)
        classes = {c.__name__: c for c in MESSAGES.values() if issubclass(c, direction)}
        assert sorted(listed) == sorted(classes), f"{direction.__name__} messages documented"
        for name, (kind, fields) in listed.items():
            cls = classes[name]
            assert kind == cls.TYPE, name
            assert fields == [f.name for f in dataclasses.fields(cls)], name


def test_the_framing_module_points_to_the_messages_instead_of_listing_them() -> None:
    from runtime import protocol

    assert "runtime.messages" in (protocol.__doc__ or "")
    for kind in MESSAGES:
        assert f"``{kind}``" not in (protocol.__doc__ or ""), kind


DEPLOY = {  # a deploy as it travels; the cases below spoil one field each
    "type": "deploy",
    "job_id": "j",
    "graph": b"",
    "code": {},
    "layout": {"placement": {}},
    "workers": {},
    "config": {"batch_size": 1, "linger_s": 0.0, "credits": 1},
    "attempt": 1,
}


@pytest.mark.parametrize(
    ("obj", "error", "fragment"),
    [
        ([1, 2], UnknownMessage, "expected a message"),
        ({"job_id": "j"}, UnknownMessage, "unknown message type None"),
        ({"type": "teleport"}, UnknownMessage, "unknown message type 'teleport'"),
        ({"type": "stop"}, MalformedMessage, "lacks fields ['job_id']"),
        (
            {"type": "stop", "job_id": "j", "force": True},
            MalformedMessage,
            "unknown fields ['force']",
        ),
        ({"type": "stop", "job_id": 7}, MalformedMessage, "stop.job_id: expected str"),
        ({"type": "update", "job_id": "j", "rid": True}, MalformedMessage, "expected int"),
        ({"type": "update", "job_id": "j", "rid": "1"}, MalformedMessage, "update.rid"),
        (
            {"type": "inject_barrier", "job_id": "j", "kind": "nap", "barrier_id": 1},
            MalformedMessage,
            "inject_barrier.kind",
        ),
        ({**DEPLOY, "layout": {"weights": {}}}, MalformedMessage, "deploy.layout: not a layout"),
        ({**DEPLOY, "workers": {"w1": ("h",)}}, MalformedMessage, "deploy.workers"),
        ({**DEPLOY, "config": {"batch_size": 1}}, MalformedMessage, "ChannelConfig lacks fields"),
        (  # it names its attempt, which its data connections are fenced by
            {k: v for k, v in DEPLOY.items() if k != "attempt"},
            MalformedMessage,
            "deploy lacks fields ['attempt']",
        ),
    ],
)
def test_what_is_not_a_message_is_refused_naming_the_peer(
    obj: object, error: type[MessageError], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        decode(obj, "worker w7")
    assert caught.value.peer == "worker w7"
    assert str(caught.value).startswith("worker w7: ")
    assert fragment in str(caught.value)


def test_the_deploy_the_cases_spoil_is_one() -> None:
    assert decode(DEPLOY, "coordinator", ToWorker).attempt == 1  # type: ignore[attr-defined]


def test_a_message_of_the_other_direction_is_refused() -> None:
    with pytest.raises(UnknownMessage, match="worker w7: a 'stop' message is not a ToCoordinator"):
        decode(encode(messages.Stop("j")), "worker w7", ToCoordinator)
    with pytest.raises(UnknownMessage, match="coordinator: a 'paused' message is not a ToWorker"):
        decode(encode(messages.Paused("j", 1, "count-0")), "coordinator", ToWorker)


def test_wire_names_are_the_field_names() -> None:
    """One name per field from wire to code: the fixed drifts stay fixed."""
    prepare = encode(messages.Prepare("j", 1, 2, Layout({}), (), {}, {}))
    assert {"precopy_budget_s", "precopy_pause_s"} <= prepare.keys()
    assert "precopy_s" not in prepare
    assert "started" not in MESSAGES and "aborted" not in MESSAGES
