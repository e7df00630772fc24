"""A workload's several objectives: the spec's checks, and what a worker measures of each one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.bundle import pack
from fleet.errors import SpecError
from fleet.search.pareto import Objective
from fleet.spec import load_workload_spec, parse_spec
from fleet.workers.workloads import Job, Measured
from fleet.workers.workloads.command import CommandWorkload

TIME = {"name": "time", "json": "ms", "goal": "min"}
ENERGY = {"name": "energy", "observer": "energy", "goal": "min"}


def workload(objectives: Any, **extra: Any) -> dict[str, Any]:
    return {"kind": "command", "run": ["sh", "run.sh"], "objectives": objectives, **extra}


def test_objectives_in_order_the_first_being_the_measurements() -> None:
    spec = load_workload_spec(workload([TIME, ENERGY, {"json": "gflops", "goal": "max"}]))
    assert spec.objectives == [Objective("time"), Objective("energy"), Objective("gflops", maximize=True)]
    assert (spec.objective_name, spec.maximize) == ("time", False)
    one = load_workload_spec({"kind": "command", "run": ["k"], "objective": {"json": "gflops", "goal": "max"}})
    assert one.objectives == [Objective("gflops", maximize=True)]


@pytest.mark.parametrize(
    ("objectives", "extra", "message"),
    [
        ([TIME, {**TIME, "json": "seconds"}], {}, "workload objective 'time' is named twice"),
        ([TIME, {"json": "time"}], {}, "workload objective 'time' is named twice"),
        ([TIME, {"name": "energy", "json": "j", "goal": "least"}], {}, "objective 2: 'goal' must be 'min' or 'max'"),
        ([TIME, {"name": "energy", "goal": "min"}], {}, "objective 2 must name where its value comes from"),
        ([TIME, {"name": "energy", "json": "j", "observer": "energy"}], {}, "objective 2 must name where its value"),
        ([TIME, {"name": "e", "observer": "energie"}], {}, "'energie' is no reading.*did you mean 'energy'"),
        ([TIME, {"name": "e", "jsno": "j"}], {}, "objective 2 has an unknown field 'jsno'"),
        ([TIME], {}, "a list of two or more objectives"),
        ({"time": TIME}, {}, "a list of two or more objectives"),
        ([TIME, "energy"], {}, "objective 2 must be an object"),
        ([ENERGY, {"name": "power", "observer": "power_w"}], {}, "at least one of the workload's objectives.*'json'"),
        ([TIME, ENERGY], {"objective": TIME}, "names 'objective' and 'objectives'"),
        ([TIME, {"name": "", "json": "j"}], {}, "'name' must be a non-empty string"),
    ],
)
def test_a_bad_objectives_field_is_refused(objectives: Any, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_workload_spec(workload(objectives, **extra))


def _spec(strategy: dict[str, Any]) -> dict[str, Any]:
    return {
        "problems": [{"kind": "k"}],
        "space": {"knobs": {"x": [1, 2, 3]}},
        "strategy": strategy,
        "workload": workload([TIME, ENERGY]),
    }


def test_the_campaign_refuses_a_strategy_of_one_objective(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"strategy 'local' optimises one objective.*use nsga2"):
        parse_spec(_spec({"name": "local", "budget": 2}), tmp_path, name="c")
    with pytest.raises(SpecError, match="annealing on the fleet optimises one objective"):
        parse_spec(_spec({"name": "anneal", "options": {"on_fleet": True}}), tmp_path, name="c")
    for name in ("nsga2", "auto", "random", "grid"):
        assert parse_spec(_spec({"name": name, "budget": 2}), tmp_path, name="c").strategy["name"] == name


def test_fleet_validate_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    spec = _spec({"name": "nsga2"})
    spec["workload"]["objectives"] = [TIME, {"name": "time", "json": "seconds"}]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "validate", "spec.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        "fleet: error: spec.json: workload objective 'time' is named twice: each objective needs its own name"
    ]


# -- on a worker -----------------------------------------------------------------------------------------------


def _measure(tmp_path: Path, objectives: list[dict[str, Any]], lines: list[str]) -> Measured:
    """Evaluate a run script that prints ``lines`` in turn, one per run (a warm-up and three repeats)."""
    script = "n=$(cat count 2>/dev/null || echo 0); echo $((n + 1)) > count\n"
    script += "".join(f"[ $n = {i} ] && echo '{line}'\n" for i, line in enumerate(lines)) + "exit 0\n"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    command = CommandWorkload(workload(objectives, warmup=1, repeats=3))
    return command.evaluate(Job({}, {}, scratch, lambda key: b""), pack({"run.sh": script.encode()}))


def test_each_objective_read_from_the_line_is_the_median_of_its_repeats(tmp_path: Path) -> None:
    lines = ['{"ms": 99, "joules": 99}', '{"ms": 3, "joules": 7}', '{"ms": 1, "joules": 9}', '{"ms": 2, "joules": 8}']
    measured = _measure(tmp_path, [TIME, {"name": "energy", "json": "joules"}], lines)
    assert measured.state == "evaluated"
    assert measured.objective == 2 and measured.samples == [3, 1, 2]
    assert measured.objectives == {"time": 2, "energy": 8}


def test_a_run_without_every_objective_is_errored(tmp_path: Path) -> None:
    lines = ['{"ms": 1, "joules": 2}', '{"ms": 3}', '{"ms": 1, "joules": 2}', '{"ms": 1, "joules": 2}']
    measured = _measure(tmp_path, [TIME, {"name": "energy", "json": "joules"}], lines)
    assert measured.state == "errored" and measured.reason == "not every objective (time, energy) in the run's output"


def test_an_observer_objective_is_its_reading_and_the_first_is_the_objective() -> None:
    command = CommandWorkload(workload([ENERGY, TIME]))
    read = Measured("evaluated", 2.0, [2.0, 2.5], {"ms": 2.0, "energy": 41.5}, objectives={"time": 2.0})
    measured = command.with_observed(read)
    assert measured.objectives == {"energy": 41.5, "time": 2.0}
    assert measured.objective == 41.5 and measured.samples == [41.5]
    # The time first: the observer's reading joins the objectives, the objective stays the time.
    second = CommandWorkload(workload([TIME, ENERGY])).with_observed(read)
    assert second.objectives == {"time": 2.0, "energy": 41.5} and second.objective == 2.0


def test_an_observer_objective_without_its_reading_errors_the_trial() -> None:
    read = Measured("evaluated", 2.0, [2.0], {"ms": 2.0}, objectives={"time": 2.0})
    measured = CommandWorkload(workload([TIME, ENERGY])).with_observed(read)
    assert measured.state == "errored" and measured.objective is None
    assert "the objective 'energy' is the observer's 'energy', and this evaluation has none" in (measured.reason or "")
    errored = Measured("errored", reason="the run failed")
    assert CommandWorkload(workload([TIME, ENERGY])).with_observed(errored) is errored
