"""What a spec gets when it leaves things out: the strategy, and paths given as plain strings."""

from __future__ import annotations

from pathlib import Path

import pytest

import fleet
from fleet.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _spec(strategy: dict | None) -> dict:
    spec = {
        "name": "defaults",
        "problems": [{"kind": "k", "params": {"n": 8}}],
        "space": {"knobs": {"a": [1, 2, 3, 4], "b": [1, 2, 3]}},
        "workload": {"kind": "command", "run": ["./x", "{a}", "{b}", "{n}"], "objective": {"json": "t"}},
    }
    if strategy is not None:
        spec["strategy"] = strategy
    return spec


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (None, "grid"),  # no budget: the whole space
        ({"budget": 12}, "grid"),  # the space fits the budget exactly
        ({"budget": 50}, "grid"),
        ({"budget": 11}, "auto"),  # larger than the budget
        ({"budget": 5, "seed": 3}, "auto"),
        ({"name": "random", "budget": 5}, "random"),  # a named strategy is kept
        ({"name": "grid", "budget": 5}, "grid"),
    ],
)
def test_a_spec_without_a_strategy_gets_grid_only_when_the_space_fits(strategy: dict | None, expected: str) -> None:
    assert parse_spec(_spec(strategy), Path(".")).strategy["name"] == expected


def test_load_spec_takes_a_plain_string_path() -> None:
    spec = fleet.load_spec(str(EXAMPLES / "matmul-c" / "spec.json"))
    assert spec.name == "matmul-c"
    # The matrix order is a problem parameter, not a knob: "best" never picks a smaller problem.
    assert spec.problems[0].params == {"n": 512}
    assert "n" not in spec.space.names


def test_the_walkthrough_example_tunes_two_problem_sizes_with_the_default_strategy() -> None:
    spec = fleet.load_spec(EXAMPLES / "stencil-c" / "spec.json")
    assert [p.params["n"] for p in spec.problems] == [1024, 2048]
    assert spec.strategy["name"] == "auto"
    assert spec.space.size > spec.strategy["budget"]


def test_embedded_state_is_the_nearest_fleet_folder_above_the_current_directory(tmp_path: Path) -> None:
    from fleet.settings import Settings, find_home

    project = tmp_path / "project"
    (project / ".fleet").mkdir(parents=True)
    deep = project / "src" / "kernels"
    deep.mkdir(parents=True)
    # A .fleet folder without a database is not a project's state yet: the current directory's is used.
    assert find_home(deep) == deep / ".fleet"
    (project / ".fleet" / "fleet.db").write_bytes(b"")
    assert find_home(deep) == project / ".fleet"
    assert find_home(tmp_path) == tmp_path / ".fleet"
    # FLEET_HOME, when set, wins.
    assert Settings.from_env({"FLEET_HOME": str(tmp_path / "elsewhere")}).home == tmp_path / "elsewhere"


def test_a_spec_may_name_its_schema_for_editors() -> None:
    spec = _spec({"budget": 4})
    spec["$schema"] = "../fleet/spec/schema.json"
    assert parse_spec(spec, Path(".")).name == "defaults"
