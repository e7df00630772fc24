"""Spaces (fleet/space.py) and the constraint language (fleet/expr.py)."""

from __future__ import annotations

import itertools
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import SpecError
from fleet.expr import Expression
from fleet.space import Knob, Space, canonical_json, check_value, digest


def space(knobs: dict, constraints: list[str] | None = None, run_time: list[str] | None = None) -> Space:
    data: dict = {"knobs": knobs}
    if constraints is not None:
        data["constraints"] = constraints
    if run_time is not None:
        data["run_time"] = run_time
    return Space.from_dict(data)


# --- knobs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1tile", "tile-x", "tile x", "a.b", "{x}"])
def test_knob_name_must_be_an_identifier(name: str) -> None:
    with pytest.raises(SpecError, match="not an identifier"):
        Knob(name, (1, 2))


def test_knob_without_values_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"knob 'tile' has no values"):
        Knob("tile", ())


def test_knob_listing_a_value_twice_is_rejected() -> None:
    with pytest.raises(SpecError, match=r"knob 'tile' lists a value twice"):
        Knob("tile", (1, 2, 1))


def test_knob_values_that_look_alike_but_differ_in_type_are_distinct() -> None:
    # 1, 1.0, True and "1" are four different values once written as JSON.
    assert Knob("x", (1, 1.5, True, "1")).values == (1, 1.5, True, "1")


@pytest.mark.parametrize("bad", [[1, 2], {"a": 1}, None, math.nan, math.inf, -math.inf, (1,), b"x"])
def test_knob_value_that_is_not_bool_number_or_string_is_rejected_naming_the_knob(bad: object) -> None:
    with pytest.raises(SpecError, match=r"knob 'tile'.*is not a bool, number or string"):
        Knob("tile", (1, bad))


def test_check_value_accepts_the_four_kinds_and_returns_them_unchanged() -> None:
    for value in (True, 3, 2.5, "fast"):
        assert check_value("here", value) is value


def test_canonical_json_and_digest_do_not_depend_on_key_order() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})
    assert digest({"a": 1}) != digest({"a": 1.0})


# --- spaces --------------------------------------------------------------------------------------


def test_space_without_knobs_is_rejected() -> None:
    with pytest.raises(SpecError, match="no knobs"):
        Space(())


def test_space_naming_a_knob_twice_is_rejected() -> None:
    with pytest.raises(SpecError, match="twice"):
        Space((Knob("a", (1,)), Knob("a", (2,))))


def test_build_time_knobs_are_ordered_first_keeping_their_relative_order() -> None:
    s = Space((Knob("r1", (1, 2), build=False), Knob("b1", (1, 2)), Knob("r2", (1,), build=False), Knob("b2", (3,))))
    assert s.names == ["b1", "b2", "r1", "r2"]
    assert s.build_knobs == ["b1", "b2"]
    assert s.run_knobs == ["r1", "r2"]


def test_iteration_varies_the_last_knob_fastest() -> None:
    s = space({"a": [1, 2], "b": ["x", "y", "z"]})
    assert list(s) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 1, "b": "z"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
        {"a": 2, "b": "z"},
    ]


def test_iteration_keeps_each_build_part_in_one_consecutive_run() -> None:
    # A run-time knob listed first still varies fastest: configurations sharing an artifact sit together.
    s = space({"threads": [1, 2, 4], "tile": [8, 16], "unroll": [1, 2]}, run_time=["threads"])
    parts = [canonical_json(s.build_part(c)) for c in s]
    runs = [key for key, _ in itertools.groupby(parts)]
    assert len(runs) == len(set(runs)) == 4
    assert len(parts) == 12


def test_size_counts_the_unconstrained_product() -> None:
    s = space({"a": [1, 2, 3], "b": [1, 2]}, constraints=["a < 2"])
    assert s.size == 6
    assert len(list(s)) == 2


def test_decode_agrees_with_iteration_of_the_unconstrained_product() -> None:
    s = space({"r": [1, 2], "a": [1, 2, 3], "b": [True, False]}, run_time=["r"])
    assert [s.decode(i) for i in range(s.size)] == list(s)


def test_decode_returns_knobs_in_space_order() -> None:
    s = space({"r": [1, 2], "a": [1, 2, 3]}, run_time=["r"])
    assert list(s.decode(4)) == ["a", "r"]


def test_constraints_filter_configurations() -> None:
    s = space({"x": [1, 2, 4, 8], "y": [1, 2, 4, 8]}, constraints=["x * y <= 8", "x >= y"])
    assert list(s) == [
        {"x": 1, "y": 1},
        {"x": 2, "y": 1},
        {"x": 2, "y": 2},
        {"x": 4, "y": 1},
        {"x": 4, "y": 2},
        {"x": 8, "y": 1},
    ]


def test_a_space_sent_to_another_process_judges_as_it_did() -> None:
    """Constraints are compiled into nested functions, which pickle cannot take: a pickled space (``fleet bench
    search`` sends them to its spawned processes) carries each constraint's source and compiles it again."""
    s = space({"x": [1, 2, 4, 8], "y": [1, 2, 4, 8]}, constraints=["x * y <= 8", "x >= y if x > 1 else y == 1"])
    copy = pickle.loads(pickle.dumps(s))
    assert list(copy) == list(s) and copy.constraints[1].measure({"x": 2, "y": 2}) == (True, 7)


def test_predicate_sees_base_overlaid_with_the_configuration() -> None:
    seen: list[dict] = []

    def predicate(values: dict) -> bool:
        seen.append(values)
        return values["x"] < values["limit"]

    s = Space.from_dict({"knobs": {"x": [1, 2, 3]}, "base": {"limit": 3}}, predicate=predicate)
    assert list(s) == [{"x": 1}, {"x": 2}]
    assert seen[0] == {"limit": 3, "x": 1}


def test_constraints_may_name_base_values() -> None:
    s = Space.from_dict({"knobs": {"x": [1, 2, 3]}, "base": {"n": 2}, "constraints": ["x <= n"]})
    assert list(s) == [{"x": 1}, {"x": 2}]


def test_check_returns_config_in_space_order() -> None:
    s = space({"b": [1, 2], "a": [3, 4]})
    assert list(s.check({"a": 3, "b": 2})) == ["b", "a"]


def test_check_rejects_a_missing_knob() -> None:
    with pytest.raises(SpecError, match="lacks knob 'b'"):
        space({"a": [1], "b": [2]}).check({"a": 1})


def test_check_rejects_an_extra_knob() -> None:
    with pytest.raises(SpecError, match="names 'c', which is not a knob"):
        space({"a": [1]}).check({"a": 1, "c": 3})


def test_check_rejects_a_value_of_the_wrong_kind() -> None:
    with pytest.raises(SpecError, match="knob 'a'"):
        space({"a": [1]}).check({"a": [1]})


def test_knob_lookup_by_name() -> None:
    s = space({"a": [1, 2]})
    assert s.knob("a").values == (1, 2)
    with pytest.raises(SpecError, match="'z' is not a knob"):
        s.knob("z")


def test_build_part_keeps_only_build_time_knobs() -> None:
    s = space({"tile": [8], "threads": [1], "unroll": [2]}, run_time=["threads"])
    assert s.build_part({"tile": 8, "threads": 1, "unroll": 2}) == {"tile": 8, "unroll": 2}


def test_build_part_of_a_space_with_only_run_time_knobs_is_empty() -> None:
    s = space({"threads": [1, 2]}, run_time=["threads"])
    assert s.build_part({"threads": 2}) == {}


# --- from_dict / to_dict ---------------------------------------------------------------------------


def test_from_dict_list_form_is_build_time() -> None:
    s = space({"tile": [8, 16]})
    assert s.knob("tile") == Knob("tile", (8, 16), build=True)


def test_from_dict_object_form_can_be_run_time() -> None:
    s = space({"tile": [8], "threads": {"values": [1, 2], "build": False}})
    assert s.run_knobs == ["threads"]
    assert s.knob("threads").values == (1, 2)


def test_from_dict_run_time_list_marks_knobs_run_time() -> None:
    s = space({"tile": [8], "threads": [1, 2]}, run_time=["threads"])
    assert s.build_knobs == ["tile"]
    assert s.run_knobs == ["threads"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "must be an object"),
        ({"knobs": {"a": [1]}, "constrains": []}, "unknown field 'constrains'"),
        ({}, "must map knob names"),
        ({"knobs": {}}, "must map knob names"),
        ({"knobs": [1, 2]}, "must map knob names"),
        ({"knobs": {"a": [1]}, "run_time": "a"}, "'run_time' must be a list"),
        ({"knobs": {"a": [1]}, "run_time": ["b"]}, "run_time names 'b', which is not a knob"),
        ({"knobs": {"a": {"values": [1], "bulid": False}}}, "knob 'a' has an unknown field 'bulid'"),
        ({"knobs": {"a": {"build": False}}}, "knob 'a': values must be a list"),
        ({"knobs": {"a": 3}}, "knob 'a': values must be a list"),
        ({"knobs": {"a": None}}, "knob 'a': values must be a list"),
        ({"knobs": {"a": [[1, 2]]}}, "knob 'a'.*not a bool, number or string"),
        ({"knobs": {"a": [None]}}, "knob 'a'.*not a bool, number or string"),
        ({"knobs": {"a": [1]}, "constraints": "a > 0"}, "'constraints' must be a list"),
        ({"knobs": {"a": [1]}, "constraints": ["b > 0"]}, "names 'b', which is not a knob"),
        ({"knobs": {"a": [1]}, "base": [1]}, "'base' must be an object"),
        ({"knobs": {"a": [1]}, "base": {"n": None}}, "base 'n'"),
    ],
)
def test_from_dict_rejects_bad_input_with_a_clear_message(data: object, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        Space.from_dict(data)  # type: ignore[arg-type]


def test_to_dict_from_dict_round_trip() -> None:
    original = Space.from_dict(
        {
            "knobs": {"threads": [1, 2], "tile": [8, 16], "fast": {"values": [True, False], "build": False}},
            "run_time": ["threads"],
            "constraints": ["tile * threads <= 16"],
            "base": {"n": 4},
        }
    )
    again = Space.from_dict(original.to_dict())
    assert again.to_dict() == original.to_dict()
    assert again.names == original.names
    assert again.run_knobs == ["threads", "fast"]
    assert list(again) == list(original)


def test_to_dict_is_json() -> None:
    data = space({"a": [1, 2.5, "x", True]}, constraints=["a != 'x'"]).to_dict()
    assert canonical_json(data) == (
        '{"base":{},"constraints":["a != \'x\'"],"knobs":{"a":{"build":true,"values":[1,2.5,"x",true]}}}'
    )


def test_from_dict_rejects_a_build_flag_that_is_not_a_bool() -> None:
    # bool("false") is True: the knob silently becomes build-time instead of failing the spec.
    with pytest.raises(SpecError, match="build"):
        space({"a": {"values": [1], "build": "false"}})


# --- expressions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "x.__class__",
        "x.real",
        "x[0]",
        "(lambda: 1)()",
        "[i for i in (1, 2)]",
        "{i for i in (1, 2)}",
        "sum(i for i in (1, 2))",
        "open('/etc/passwd')",
        "eval('1')",
        "min(x, key=abs)",
        "(y := 1)",
        "f'{x}'",
        "x in {1, 2}",
        "None",
        "b'x' == x",
    ],
)
def test_unsafe_or_unsupported_expressions_are_rejected_at_parse_time(text: str) -> None:
    with pytest.raises(SpecError, match="constraint"):
        Expression(text)


def test_an_expression_that_does_not_parse_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="is not an expression"):
        Expression("x <=")


def test_a_statement_is_not_an_expression() -> None:
    with pytest.raises(SpecError, match="is not an expression"):
        Expression("import os")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x + y * 2 - 1", 1 + 3 * 2 - 1),
        ("x / 2", 0.5),
        ("y // 2", 1),
        ("y % 2", 1),
        ("y ** 2", 9),
        ("-x + +y", 2),
        ("1 < x + 1 <= y", True),
        ("1 < y < 2", False),
        ("x == 1 and y != 1", True),
        ("x == 2 or y == 3", True),
        ("not x", False),
        ("y in (1, 2, 3)", True),
        ("y not in [1, 2]", True),
        ("s in ('a', 'fast')", True),
        ("x if y > 2 else 0", 1),
        ("x if y > 5 else 0", 0),
        ("min(x, y) + max(x, y, 10) + abs(x - y)", 1 + 10 + 2),
        ("flag and s == 'fast'", True),
    ],
)
def test_supported_expressions_evaluate(text: str, expected: object) -> None:
    assert Expression(text)({"x": 1, "y": 3, "s": "fast", "flag": True}) == expected


def test_expression_names_exclude_the_functions() -> None:
    assert Expression("min(a, b) < max(c, 4)").names == {"a", "b", "c"}


def test_evaluating_with_a_missing_name_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="names 'z', which is not a knob"):
        Expression("z > 1")({"x": 1})


def test_space_rejects_a_constraint_naming_an_unknown_knob_when_built() -> None:
    with pytest.raises(SpecError, match="names 'tiel', which is not a knob"):
        space({"tile": [1]}, constraints=["tiel > 0"])


@pytest.mark.parametrize("constraint", ["a / b > 1", "a // b == 2", "a % b == 0", "b ** -1 > 0"])
def test_division_by_zero_makes_the_configuration_invalid_not_an_exception(constraint: str) -> None:
    s = space({"a": [4], "b": [0, 2]}, constraints=[constraint])
    assert not s.is_valid({"a": 4, "b": 0})
    assert [c["b"] for c in s] == [2]


@pytest.mark.parametrize("constraint", ["a / b != 2", "a / b", "not (a / b > 1)"])
def test_division_by_zero_is_invalid_whatever_the_comparison(constraint: str) -> None:
    # NaN only fails ordered comparisons and ==; != and truthiness let the meaningless configuration through.
    assert not space({"a": [4], "b": [0]}, constraints=[constraint]).is_valid({"a": 4, "b": 0})


def test_float_overflow_makes_the_configuration_invalid_not_an_exception() -> None:
    # Like a zero divisor, an overflowing power makes the configuration meaningless, not the spec wrong.
    s = space({"x": [2.0, 10.0], "e": [10, 1000]}, constraints=["x ** e > 1"])
    assert not s.is_valid({"x": 10.0, "e": 1000})


# --- property: every configuration a space yields is in it and satisfies its constraints -------------

_TEMPLATES = ["{a} + {b} <= {n}", "{a} * {b} != {n}", "{a} % 2 == {n} % 2", "{a} >= {b}", "{a} - {n} in (0, 1, 2)"]


@st.composite
def spaces(draw: st.DrawFn) -> tuple[Space, list[Expression]]:
    count = draw(st.integers(1, 4))
    knobs = []
    for index in range(count):
        values = draw(st.lists(st.integers(-3, 6), min_size=1, max_size=4, unique=True))
        knobs.append(Knob(f"k{index}", tuple(values), build=draw(st.booleans())))
    names = [k.name for k in knobs]
    constraints = [
        Expression(
            draw(st.sampled_from(_TEMPLATES)).format(
                a=draw(st.sampled_from(names)), b=draw(st.sampled_from(names)), n=draw(st.integers(-2, 8))
            )
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    return Space(tuple(knobs), tuple(constraints)), constraints


@settings(max_examples=150, deadline=None)
@given(spaces())
def test_every_yielded_configuration_is_in_the_space_and_satisfies_every_constraint(
    drawn: tuple[Space, list[Expression]],
) -> None:
    s, constraints = drawn
    yielded = list(s)
    for config in yielded:
        assert set(config) == set(s.names)
        for knob in s.knobs:
            assert config[knob.name] in knob.values
        for constraint in constraints:
            assert constraint(config)
    # Nothing valid is left out, and nothing comes twice.
    expected = [s.decode(i) for i in range(s.size) if all(c(s.decode(i)) for c in constraints)]
    assert yielded == expected
    # Build parts come in consecutive runs.
    runs = [k for k, _ in itertools.groupby(canonical_json(s.build_part(c)) for c in yielded)]
    assert len(runs) == len(set(runs))
