"""Space files as MLPerf's autotuner reads them: flat JSON grids and Python modules with META_ functions."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from fleet.driving.campaign import parse_spec
from fleet.errors import SpecError
from fleet.search import RandomSearch
from fleet.space_files import load_space_file


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_flat_json_grid_with_fleet_additions(tmp_path: Path) -> None:
    grid = {
        "batch": [1, 2, 4],
        "qps": [100, 200],
        "fleet:run_time": ["qps"],
        "fleet:constraints": ["batch * qps <= 400"],
        "fleet:base": {"scenario": "Server"},
    }
    loaded = load_space_file(write(tmp_path, "grid.json", json.dumps(grid)))

    assert loaded.space.build_knobs == ["batch"] and loaded.space.run_knobs == ["qps"]
    assert loaded.space.base == {"scenario": "Server"}
    assert list(loaded.space) == [
        {"batch": 1, "qps": 100},
        {"batch": 1, "qps": 200},
        {"batch": 2, "qps": 100},
        {"batch": 2, "qps": 200},
        {"batch": 4, "qps": 100},
    ]
    assert loaded.searcher is None


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"a": [1], "fleet:runtime": ["a"]}, "unknown field 'fleet:runtime'"),
        ({"a": [[1]]}, "knob 'a': [1] is not a bool, number or string"),
        ({"a": 1}, "knob 'a' must be a list of values"),
        ({"a": [1], "fleet:run_time": ["b"]}, "no-rebuild parameter 'b' is not a knob"),
        ([1, 2], "a grid is a flat object"),
    ],
)
def test_a_bad_json_grid_is_one_clear_error(tmp_path: Path, grid: object, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_space_file(write(tmp_path, "grid.json", json.dumps(grid)))


PYTHON_SPACE = """
    import math

    batch_size = [1, 2, 4, 8]
    target_qps = [100, 200, 400]
    use_graphs = [True, False]
    _private = [1, 2]
    scale = 3

    def META_get_no_rebuild_params():
        return ["target_qps"]

    def META_is_config_valid(config):
        # Sees the base configuration overlaid with the knob values.
        return config["batch_size"] * config["target_qps"] <= config["max_work"]
"""


def test_a_python_space_file(tmp_path: Path) -> None:
    loaded = load_space_file(write(tmp_path, "grid.py", PYTHON_SPACE), base={"max_work": 800})

    space = loaded.space
    assert space.names == ["batch_size", "use_graphs", "target_qps"]  # build-time knobs vary slowest
    assert space.run_knobs == ["target_qps"]
    configs = list(space)
    assert all(c["batch_size"] * c["target_qps"] <= 800 for c in configs)
    assert {"batch_size": 8, "use_graphs": True, "target_qps": 100} in configs
    assert {"batch_size": 8, "use_graphs": True, "target_qps": 200} not in configs
    # Configurations differing only in the run-time knob follow each other: each build is done once.
    builds = [(c["batch_size"], c["use_graphs"]) for c in configs]
    runs_of_builds = [b for i, b in enumerate(builds) if i == 0 or builds[i - 1] != b]
    assert len(runs_of_builds) == len(set(builds))


def test_meta_search_callback_supplies_the_searcher(tmp_path: Path) -> None:
    text = textwrap.dedent(PYTHON_SPACE) + textwrap.dedent("""
        from fleet.search import RandomSearch

        def META_search_callback(space):
            return RandomSearch(space, budget=3, seed=7)
    """)
    loaded = load_space_file(write(tmp_path, "grid.py", text), base={"max_work": 10_000})
    searcher = loaded.searcher(loaded.space)  # type: ignore[misc]
    assert isinstance(searcher, RandomSearch)
    assert len(list(searcher.generate())) == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = [1]\ndef META_frobnicate():\n    return 1\n", "unknown META_ function 'META_frobnicate'"),
        ("a = [1, [2]]\n", "knob 'a': [2] is not a bool, number or string"),
        ("a = [1]\ndef META_get_no_rebuild_params():\n    return ['b']\n", "no-rebuild parameter 'b' is not a knob"),
        ("a = [1]\nMETA_is_config_valid = 3\n", "META_is_config_valid must be a function"),
        ("x = 1\n", "defines no knobs"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("a = [1]\ndef META_search_callback():\n    return 42\n", "must return a fleet.search.Searcher"),
    ],
)
def test_a_bad_python_space_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        loaded = load_space_file(write(tmp_path, "grid.py", text))
        if loaded.searcher:
            loaded.searcher(loaded.space)


def test_a_campaign_spec_names_a_space_file_and_records_it_for_resuming(tmp_path: Path) -> None:
    write(tmp_path, "grid.py", PYTHON_SPACE)
    write(tmp_path, "k.c", "int main(void) { return 0; }\n")
    spec = parse_spec(
        {
            "name": "mlperf",
            "problems": [{"kind": "bench", "params": {}}],
            "space": {"file": "grid.py", "base": {"max_work": 400}},
            "workload": {
                "kind": "command",
                "run": ["./run", "{batch_size}", "{target_qps}"],
                "objective": {"json": "qps", "goal": "max"},
            },
        },
        tmp_path,
    )
    assert spec.space.run_knobs == ["target_qps"]
    assert spec.options["space_file"]["path"] == str((tmp_path / "grid.py").resolve())
    assert spec.options["space_file"]["base"] == {"max_work": 400}
    assert all(c["batch_size"] * c["target_qps"] <= 400 for c in spec.space)
