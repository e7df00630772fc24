"""Hostile specs (issue 13): whatever a spec holds, loading it ends in a spec or in one SpecError line, quickly,
and what it accepts can be stored. Constraints are held to a cost bound (fleet/expr.py), names and kinds to
the store's column sizes (fleet/limits.py), settings' URLs to what parses (fleet/settings.py).

tests/integration/test_hostile_specs.py runs the same inputs through the real `fleet` command."""

from __future__ import annotations

import copy
import json
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

import fleet
from fleet.errors import ConfigurationError, FleetError, SpecError, shown
from fleet.expr import MAX_BITS, MAX_DEPTH, MAX_LENGTH, Expression, TooCostly, Undefined
from fleet.limits import KIND_LENGTH, NAME_LENGTH, TAG_LENGTH, check_json
from fleet.settings import Settings, redact
from fleet.space import Space, canonical_json, digest
from fleet.spec import CampaignSpec, ProblemSpec, load_spec, parse_spec
from fleet.store import Store
from fleet.store import _models as models
from fleet.store._models import Blob, Campaign, Problem
from fleet.targets import TARGET, TARGET_LENGTH

SPEC: dict[str, Any] = {
    "name": "hostile",
    "target": "cpu-x86_64",
    "problems": [{"kind": "noop", "params": {"n": 1}, "tags": ["small"]}],
    "space": {"knobs": {"b": [1, 2, 3], "c": ["x", "y"]}},
    "strategy": {"name": "grid"},
    "workload": {"kind": "noop"},
}

# The findings of issue 13, as spec changes; each is refused with the words given.
CASES: list[tuple[str, Any, str]] = [
    ("tower", ("space", "constraints", ["((((b**64)**64)**64)**64) > 0"]), "a power has more than 4096 bits"),
    ("repetition", ("space", "constraints", ["(1,)*(2**40)==1"]), "a repeated tuple has more than 4096 items"),
    ("unary minus", ("space", "constraints", ["-" * 50_000 + "b > 0"]), "longer than 4096 characters"),
    ("shorter unary minus", ("space", "constraints", ["-" * 4000 + "b > 0"]), "nested"),
    ("anneal options", ("strategy", "options", "hot"), "strategy 'options' must be an object, not 'hot'"),
    ("long name", ("name", None, "n" * 10_000), "has 10000 characters; at most 128 are allowed"),
    ("long kind", ("problems", None, [{"kind": "k" * 1000}]), "has 1000 characters; at most 64 are allowed"),
    ("escapes in a kind", ("problems", None, [{"kind": "a\n\x1b[31mred"}]), "holds the control character '\\n'"),
    ("long tag", ("problems", None, [{"kind": "k", "tags": ["t" * 129]}]), "at most 128 are allowed"),
    ("a bidi override", ("name", None, "abc\u202edef"), "holds the control character '\\u202e'"),
    ("long target", ("target", None, "cpu-" + "x" * 100), "of at most 64 characters"),
    ("huge knob value", ("space", "knobs", {"b": [2**70]}), "larger than an integer of 64 bits"),
    ("lone surrogate", ("space", "knobs", {"b": ["\ud800"]}), "not valid Unicode"),
    ("NUL in a value", ("problems", None, [{"kind": "k", "params": {"p": "a\0b"}}]), "holds a NUL character"),
    ("NaN priority", ("priority", None, float("nan")), "'priority' is a weight above 0"),
    ("infinite priority", ("priority", None, float("inf")), "'priority' is a weight above 0"),
    ("deep options", ("options", None, {"a": json.loads("[" * 40 + "]" * 40)}), "nested more than 32 deep"),
    ("huge workload number", ("workload", "repeats", 10**30), "larger than an integer of 64 bits"),
]


def changed(change: tuple[str, str | None, Any]) -> dict[str, Any]:
    field, key, value = change
    data = copy.deepcopy(SPEC)
    if key is None:
        data[field] = value
    else:
        data[field][key] = value
    return data


def assert_one_line(error: BaseException) -> None:
    message = str(error)
    # Unassigned code points are harmless; controls, format characters and line separators are not.
    assert not [c for c in message if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")], message
    assert len(message) < 6000, message  # a path may be long; a 10 000-character name is cut


@pytest.mark.parametrize(("change", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_finding_is_one_spec_error(change: tuple[str, str | None, Any], words: str) -> None:
    started = time.monotonic()
    with pytest.raises(SpecError) as raised:
        parse_spec(changed(change), Path.cwd())
    assert words in str(raised.value)
    assert_one_line(raised.value)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (b'{"name": ' + b"9" * 5000 + b"}", "a number has too many digits"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (json.dumps({**SPEC, "options": {"note": "a\ud800"}}).encode(), "not valid Unicode"),
        (b"\xef\xbb\xbf\xef\xbb\xbf{}", "not valid JSON"),
    ],
    ids=["binary", "5000 digits", "deep", "surrogate", "two byte order marks"],
)
def test_a_spec_file_that_is_not_json_fit_for_fleet_is_one_spec_error(
    tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "spec.json"
    path.write_bytes(content)
    with pytest.raises(SpecError, match=words) as raised:
        load_spec(path)
    assert_one_line(raised.value)


def test_a_spec_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    # Some Windows editors write one; it is no part of the JSON.
    path = tmp_path / "spec.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(SPEC).encode())
    assert load_spec(path).name == "hostile"


def test_a_spec_file_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    with path.open("wb") as out:
        out.truncate(17 << 20)
    with pytest.raises(SpecError, match="at most 16 MiB"):
        load_spec(path)


def test_a_campaign_spec_built_in_python_is_held_to_the_same_limits() -> None:
    space = Space.from_dict({"knobs": {"b": [2, 3]}, "constraints": ["((b**64)**64)**64 > 0"]})
    fields: dict[str, Any] = {
        "name": "py",
        "problems": [ProblemSpec("noop", {})],
        "target": "cpu-x86_64",
        "space": Space.from_dict({"knobs": {"b": [1]}}),
        "workload": {"kind": "noop"},
    }
    with pytest.raises(SpecError, match="a power has more than"):
        CampaignSpec(**{**fields, "space": space})
    with pytest.raises(SpecError, match="control character"):
        CampaignSpec(**{**fields, "problems": [ProblemSpec("a\x1b[2J", {})]})
    with pytest.raises(SpecError, match="is not JSON"):
        CampaignSpec(**{**fields, "options": {"when": object()}})
    with pytest.raises(SpecError, match="ProblemSpec"):
        CampaignSpec(**{**fields, "problems": [{"kind": "noop"}]})
    with pytest.raises(SpecError, match="the strategy must be an object"):
        CampaignSpec(**{**fields, "strategy": "grid"})


def test_the_limits_are_the_store_s_column_sizes() -> None:
    assert models.Campaign.__table__.c.name.type.length == NAME_LENGTH
    assert models.Campaign.__table__.c.target.type.length == TARGET_LENGTH
    assert models.Problem.__table__.c.kind.type.length == KIND_LENGTH
    assert models.ProblemTag.__table__.c.tag.type.length == TAG_LENGTH


@pytest.mark.parametrize(
    "change",
    [c[1] for c in CASES if c[0] in ("long name", "long kind", "escapes in a kind", "long tag", "long target")]
    + [("name", None, "a\x1b[2Jb"), ("space", "constraints", ["b > 0"] * 101)],
)
def test_the_schema_refuses_what_the_loader_refuses_for_lengths_and_controls(change: Any) -> None:
    from tests.unit.test_spec_schema import schema_accepts

    assert schema_accepts(SPEC)
    assert not schema_accepts(changed(change))
    with pytest.raises(SpecError):
        parse_spec(changed(change), Path.cwd())


def test_names_and_kinds_at_the_limits_are_accepted() -> None:
    data = copy.deepcopy(SPEC)
    data["name"] = "n" * NAME_LENGTH
    data["target"] = "cpu-" + "x" * (TARGET_LENGTH - 4)
    data["problems"] = [{"kind": "é" * KIND_LENGTH, "tags": ["t" * TAG_LENGTH]}]
    spec = parse_spec(data, Path.cwd())
    assert len(spec.name) == NAME_LENGTH


# --- the cost bound of constraints ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "((((b**64)**64)**64)**64) > 0",
        "b ** 5000 > 0",
        "(b ** 60) * (b ** 60) * (b ** 60) ** 60 > 0",
        "(1,) * (2 ** 40) == 1",
        "(1, 2) * 3000 == ()",
        "((1,) * 4000 + (1,) * 4000) == ()",
        "(1,) * 4000 == (1,) * 4000 and (1,) * 4000 == (1,) * 4000 and (1,) * 4000 == (1,) * 4000",
    ],
)
def test_a_costly_expression_stops_at_the_bound_quickly(text: str) -> None:
    started = time.monotonic()
    with pytest.raises(TooCostly):
        Expression(text)({"b": 3})
    assert time.monotonic() - started < 0.5


def test_the_bound_leaves_ordinary_arithmetic_alone() -> None:
    assert Expression("2 ** 100 > b")({"b": 1}) is True
    assert Expression("b ** 64 * b ** 64 > 0")({"b": 2**30}) is True
    assert Expression("(1, 2) * 2 == (1, 2, 1, 2)")({}) is True
    with pytest.raises(Undefined):  # a float overflows at once: the configuration is invalid
        Expression("2.0 ** 5000 > 0")({})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("x" * (MAX_LENGTH + 1), "longer than"),
        ("-" * (MAX_DEPTH + 5) + "b", f"nested more than {MAX_DEPTH} deep"),
        ("-" * 3000 + "b", "nested"),
        ("+".join(["b"] * (MAX_DEPTH + 5)), "nested"),
        ("9" * 2000 + " > b", f"more than {MAX_BITS} bits"),
        ("(" * 500 + "b" + ")" * 500, "not an expression"),
        ("b\0", "not an expression"),
    ],
)
def test_an_expression_too_large_to_parse_safely_is_a_spec_error(text: str, words: str) -> None:
    with pytest.raises(SpecError, match=words) as raised:
        Expression(text)
    assert_one_line(raised.value)


def test_at_run_time_a_costly_configuration_is_invalid_not_a_hang() -> None:
    # Sampling found nothing costly; a configuration outside the sample still ends at the bound.
    space = Space.from_dict({"knobs": {"e": list(range(1, 3000))}, "constraints": ["2 ** (e * e) > 0"]})
    assert space.is_valid({"e": 2})
    assert not space.is_valid({"e": 2999})


def test_an_ill_typed_comparison_makes_the_configuration_invalid_not_a_crash() -> None:
    space = Space.from_dict({"knobs": {"u": [1, "auto"]}, "constraints": ["u <= 4"]})
    space.check_constraints()
    assert [c["u"] for c in space] == [1]


def test_the_sample_puts_every_value_of_every_knob_in_a_large_space() -> None:
    space = Space.from_dict({"knobs": {f"k{i}": list(range(12)) for i in range(9)}})
    sample = space.sample(Space.SAMPLE)
    assert len(sample) == Space.SAMPLE == len({canonical_json(c) for c in sample})
    for knob in space.knobs:
        assert {c[knob.name] for c in sample} == set(knob.values)
    assert sample == space.sample(Space.SAMPLE)


def test_a_constraint_costly_only_for_some_values_is_found_by_the_sample() -> None:
    # One configuration of 40 000 is costly; the sample of 256 holds every value of every knob.
    space = Space.from_dict(
        {
            "knobs": {"a": list(range(200)), "b": list(range(200))},
            "constraints": ["(1,) * (5000 if a == 177 else 1) != ()"],
        }
    )
    with pytest.raises(SpecError, match="cannot be evaluated at a=177 b="):
        space.check_constraints()


def test_checking_many_long_constraints_stays_under_a_second() -> None:
    # Each costs about 4300 steps; the check stops sampling at Space.CHECK_STEPS.
    text = "(1,) * 1000 == (1,) * 1000 and " + " + ".join(["b"] * 90) + " > 0"
    space = Space.from_dict({"knobs": {"b": list(range(100)), "c": list(range(100))}, "constraints": [text] * 100})
    started = time.monotonic()
    space.check_constraints()
    assert time.monotonic() - started < 2


def test_a_space_has_at_most_100_constraints() -> None:
    with pytest.raises(SpecError, match="at most 100"):
        Space.from_dict({"knobs": {"b": [1]}, "constraints": ["b > 0"] * 101})


# --- settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["postgresql://::::", "postgresql://u:secret@h:abc/db", "postgresql://[::1", "postgresql://u:secret@h:99999/d"],
)
def test_a_database_url_that_does_not_parse_is_one_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="expected a postgresql://") as raised:
        Settings.from_env({"FLEET_DATABASE_URL": url, "FLEET_HOME": "/tmp/unused"})
    assert "secret" not in str(raised.value)
    assert_one_line(raised.value)


def test_a_broker_url_that_does_not_parse_is_one_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="expected a redis://") as raised:
        Settings.from_env({"FLEET_BROKER_URL": "redis://:secret@::::", "FLEET_HOME": "/tmp/unused"})
    assert "secret" not in str(raised.value)


def test_redact_hides_the_password_of_an_url_that_does_not_parse() -> None:
    assert redact("postgresql://u:secret@h:abc/db") == "postgresql://***@h:abc/db"
    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://::::") == "postgresql://::::"


def test_shown_is_one_short_line_whatever_it_quotes() -> None:
    assert shown("a\nb\x1b[0m") == "'a\\nb\\x1b[0m'"
    assert len(shown("x" * 10_000)) == 80
    assert shown(10**5000) == "<an integer of 16610 bits>"


# --- property: malformed and adversarial specs -------------------------------------------------------

_text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl"]), min_size=1, max_size=5),
    st.integers(129, 20_000).map(lambda n: "n" * n),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@st.composite
def _constraints(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["tower", "repeat", "nest", "long", "product"]))
    if kind == "tower":
        text = "b"
        for _ in range(draw(st.integers(2, 6))):
            text = f"({text}) ** {draw(st.integers(64, 10_000))}"
        return f"{text} > 0"
    if kind == "repeat":
        return f"({draw(st.integers(1, 9))},) * ({draw(st.integers(2, 9))} ** {draw(st.integers(20, 64))}) == ()"
    if kind == "nest":
        return draw(st.sampled_from(["-", "+", "not ", "~"])) * draw(st.integers(MAX_DEPTH, 60_000)) + "b"
    if kind == "long":
        return "b + " * draw(st.integers(MAX_LENGTH // 4, 20_000)) + "1 > 0"
    return " * ".join([f"b ** {draw(st.integers(60, 64))}"] * draw(st.integers(60, 200))) + " > 0"


@st.composite
def hostile_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A good spec with one hostile change that makes it bad: each branch below can only be refused."""
    data = copy.deepcopy(SPEC)
    where = draw(st.sampled_from(["name", "kind", "tag", "target", "constraint", "value", "options", "priority"]))
    bad_text = st.one_of(
        st.tuples(st.text(max_size=10), st.sampled_from(["\n", "\x1b[31m", "\u202e", "\0", "\x85"])).map("".join),
        st.integers(129, 20_000).map(lambda n: "k" * n),
    )
    if where == "name":
        data["name"] = draw(bad_text)
    elif where == "kind":
        data["problems"] = [{"kind": draw(bad_text)}]
    elif where == "tag":
        data["problems"] = [{"kind": "k", "tags": [draw(bad_text)]}]
    elif where == "target":
        # An empty or missing target means this machine's CPU: every other value here is refused.
        targets = st.one_of(bad_text, st.integers(61, 500).map(lambda n: "cpu-" + "x" * n), _json)
        data["target"] = draw(targets.filter(lambda t: t and not (isinstance(t, str) and TARGET.fullmatch(t))))
    elif where == "constraint":
        data["space"]["constraints"] = [draw(_constraints())]
    elif where == "value":
        containers = _json.filter(lambda v: isinstance(v, list | dict) or v is None)
        data["space"]["knobs"]["b"] = [draw(st.one_of(st.integers(2**64, 2**4000), st.just("\ud800"), containers))]
    elif where == "options":
        data["strategy"] = {"name": "anneal", "options": draw(_json.filter(lambda v: not isinstance(v, dict)))}
    else:
        data["priority"] = draw(st.one_of(st.floats().filter(lambda f: not 0 < f < float("inf")), _text, st.none()))
    return data


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('db') / 'fleet.db'}")
    store.upgrade()
    yield store
    store.close()


def count_rows(store: Store) -> int:
    with store.session() as session:
        return sum(session.scalar(select(func.count()).select_from(m)) for m in (Campaign, Problem, Blob))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile_specs())
def test_a_hostile_spec_is_one_spec_error_and_writes_nothing(sqlite_store: Store, data: Any) -> None:
    started = time.monotonic()
    with pytest.raises(SpecError) as raised:
        fleet.submit(data, sqlite_store)
    assert time.monotonic() - started < 5
    assert_one_line(raised.value)
    assert count_rows(sqlite_store) == 0


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*SPEC, "priority", "options", "baseline"]), _json, max_size=8))
def test_any_json_is_a_spec_or_one_spec_error(changes: dict[str, Any]) -> None:
    try:
        spec = parse_spec({**copy.deepcopy(SPEC), **changes}, Path.cwd())
    except FleetError as error:
        assert_one_line(error)
        return
    # What is accepted can be stored: digests can be taken and every field is JSON the store holds.
    check_json("spec", spec.workload)
    digest([spec.workload, spec.strategy, spec.options, spec.baseline, spec.space.to_dict()])
    assert len(spec.name) <= NAME_LENGTH
