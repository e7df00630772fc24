"""Constraints that leave no configuration are refused when the spec is read, in one line naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.space import Space
from fleet.spec import parse_spec

LEAVE_NONE = "the space's constraints leave no configuration to try"


def spec(constraints: list[str]) -> dict:
    return {
        "name": "empty",
        "problems": [{"kind": "k", "params": {}}],
        "space": {"knobs": {"tile": [8, 16, 32], "unroll": [1, 2]}, "constraints": constraints},
        "workload": {"kind": "command", "run": ["./k", "{tile}", "{unroll}"], "objective": {"json": "s"}},
    }


@pytest.mark.parametrize(
    ("constraints", "why"),
    [
        (["tile > 64"], "'tile > 64' is false for all 6 configurations"),
        (["tile > 64", "unroll > 4", "tile > 1"], "'tile > 64', 'unroll > 4' are false for all 6 configurations"),
        (["tile > 8", "tile < 16"], "'tile > 8' and 'tile < 16' are never true together in all 6 configurations"),
        (["nope + 1 > 0"], "is not a knob"),
    ],
)
def test_constraints_that_leave_nothing_are_one_clear_error(tmp_path: Path, constraints: list[str], why: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec(spec(constraints), tmp_path)
    assert why in str(error.value)
    assert "\n" not in str(error.value)
    if "knob" not in why:
        assert str(error.value).startswith(LEAVE_NONE)


def test_constraints_that_leave_one_configuration_pass(tmp_path: Path) -> None:
    assert parse_spec(spec(["tile == 32 and unroll == 2"]), tmp_path).space.size == 6


def test_a_predicate_that_refuses_everything_is_named() -> None:
    space = Space.from_dict({"knobs": {"a": [1, 2]}}, predicate=lambda config: False)
    with pytest.raises(SpecError, match="META_is_config_valid is false for all 2 configurations"):
        space.check_not_empty()


def test_a_space_too_large_to_look_through_is_left_to_the_run() -> None:
    space = Space.from_dict({"knobs": {f"k{i}": list(range(10)) for i in range(8)}, "constraints": ["k0 > 100"]})
    Space.EMPTY_SECONDS, saved = 0.05, Space.EMPTY_SECONDS
    try:
        space.check_not_empty()  # 10**8 configurations: it stops looking, and says nothing
    finally:
        Space.EMPTY_SECONDS = saved
