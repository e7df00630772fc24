"""A mistyped spec field, knob or command is answered with the closest right one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import SpecError, did_you_mean
from fleet.spec.campaign import parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "matmul-c"


def spec(**changes: Any) -> dict[str, Any]:
    data = json.loads((EXAMPLE / "spec.json").read_text())
    for key, value in changes.items():
        data[key] = value
    return data


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as error:
        parse_spec(data, EXAMPLE)
    return str(error.value)


def test_a_mistyped_spec_field() -> None:
    data = spec()
    data["problem"] = data.pop("problems")
    assert refusal(data) == "the spec has an unknown field 'problem' (did you mean 'problems'?)"


def test_a_mistyped_strategy_field() -> None:
    data = spec()
    data["strategy"] = {"name": "random", "budgte": 4}
    assert refusal(data) == "strategy has an unknown field 'budgte' (did you mean 'budget'?)"


def test_a_mistyped_knob_in_the_baseline_and_in_a_constraint() -> None:
    data = spec()
    data["baseline"] = {**data["baseline"], "unrol": 1}
    assert refusal(data).endswith("baseline names 'unrol', which is not a knob (did you mean 'unroll'?)")
    data = spec()
    data["space"]["constraints"] = ["tile_l * tile_k <= 8192"]
    assert "names 'tile_l', which is not a knob (did you mean 'tile_" in refusal(data)


def test_a_mistyped_workload_field() -> None:
    data = spec(workload={"kind": "replay", "spcae": "pnpoly__RTX_2080_Ti"})
    assert "replay workload has an unknown field 'spcae' (did you mean 'space'?)" in refusal(data)


def test_nothing_close_suggests_nothing() -> None:
    assert did_you_mean("zzz", ["budget", "name"]) == ""


def test_a_mistyped_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "stauts"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "Did you mean 'status'?" in done.stderr
