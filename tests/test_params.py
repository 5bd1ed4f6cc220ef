"""Job parameters: strings from the CLI are converted, typed values checked, and every
refusal names the parameter (or lists the known ones)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jobs_for_tests import AllTypes, Positive, Required

from runtime.params import ParamError, describe_params, parse_params


def test_defaults_when_no_params() -> None:
    assert parse_params(AllTypes, None) == AllTypes()
    assert parse_params(AllTypes, {}) == AllTypes()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"count": "1_000"}, AllTypes(count=1000)),
        ({"count": "-7"}, AllTypes(count=-7)),
        ({"count": 12}, AllTypes(count=12)),
        ({"count": 3.0}, AllTypes(count=3)),
        ({"ratio": "0.5"}, AllTypes(ratio=0.5)),
        ({"ratio": "1e-3"}, AllTypes(ratio=0.001)),
        ({"ratio": 2}, AllTypes(ratio=2.0)),
        ({"verbose": "true"}, AllTypes(verbose=True)),
        ({"verbose": "Yes"}, AllTypes(verbose=True)),
        ({"verbose": "on"}, AllTypes(verbose=True)),
        ({"verbose": "1"}, AllTypes(verbose=True)),
        ({"verbose": "FALSE"}, AllTypes(verbose=False)),
        ({"verbose": "off"}, AllTypes(verbose=False)),
        ({"verbose": True}, AllTypes(verbose=True)),
        ({"name": "wordcount"}, AllTypes(name="wordcount")),
        ({"limit": "10"}, AllTypes(limit=10)),
        ({"limit": 10}, AllTypes(limit=10)),
        ({"limit": None}, AllTypes(limit=None)),
        ({"limit": "none"}, AllTypes(limit=None)),
        ({"limit": "null"}, AllTypes(limit=None)),
        ({"limit": ""}, AllTypes(limit=None)),
        ({"label": "y"}, AllTypes(label="y")),
        ({"label": None}, AllTypes(label=None)),
    ],
)
def test_conversions(params: dict, expected: AllTypes) -> None:
    parsed = parse_params(AllTypes, params)
    assert parsed == expected
    for name in params:
        assert type(getattr(parsed, name)) is type(getattr(expected, name))


def test_optional_str_treats_none_words_as_none() -> None:
    """Documented behaviour: for an optional string, "", "none" and "null" mean None."""
    assert parse_params(AllTypes, {"label": ""}).label is None
    assert parse_params(AllTypes, {"label": "None"}).label is None


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"count": "ten"}, "param 'count' must be an int, got 'ten'"),
        ({"count": "1.5"}, "param 'count' must be an int, got '1.5'"),
        ({"count": 1.5}, "param 'count' must be an int, got 1.5"),
        ({"count": True}, "param 'count' must be an int, got True"),
        ({"count": None}, "param 'count' must be an int, got None"),
        ({"ratio": "half"}, "param 'ratio' must be a number, got 'half'"),
        ({"ratio": False}, "param 'ratio' must be a number, got False"),
        ({"verbose": "maybe"}, "param 'verbose' must be a bool (true/false), got 'maybe'"),
        ({"verbose": 1}, "param 'verbose' must be a bool (true/false), got 1"),
        ({"name": 5}, "param 'name' must be a string, got 5"),
        ({"limit": "lots"}, "param 'limit' must be an int, got 'lots'"),
    ],
)
def test_wrong_types_name_the_param(params: dict, fragment: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_params(AllTypes, params)
    assert fragment in str(info.value)


def test_unknown_params_list_the_known_ones() -> None:
    with pytest.raises(ParamError) as info:
        parse_params(AllTypes, {"cuont": 1, "zzz": 2, "count": 1})
    assert str(info.value) == (
        "unknown param(s) cuont, zzz; known: count, label, limit, name, ratio, verbose"
    )


def test_missing_required_param_is_a_param_error() -> None:
    with pytest.raises(ParamError, match="rate"):
        parse_params(Required, {})
    assert parse_params(Required, {"rate": "5"}) == Required(5)


def test_dataclass_validation_becomes_a_param_error() -> None:
    with pytest.raises(ParamError, match="workers must be >= 1, got 0"):
        parse_params(Positive, {"workers": "0"})


def test_param_error_is_a_value_error() -> None:
    assert issubclass(ParamError, ValueError)


def test_describe_params() -> None:
    assert describe_params(Required) == {"rate": "int = 'required'"}
    described = describe_params(AllTypes)
    assert described["count"] == "int = 1"
    assert described["verbose"] == "bool = False"
    assert described["name"] == "str = 'job'"


@given(st.integers())
def test_any_int_round_trips_through_its_string(n: int) -> None:
    assert parse_params(AllTypes, {"count": str(n)}).count == n
    assert parse_params(AllTypes, {"count": f"{n:_}"}).count == n


@given(st.floats(allow_nan=False))
def test_any_float_round_trips_through_its_string(x: float) -> None:
    assert parse_params(AllTypes, {"ratio": repr(x)}).ratio == x
