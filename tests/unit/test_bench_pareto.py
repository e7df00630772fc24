"""``fleet bench pareto`` on synthetic recorded spaces: the frame, the hypervolume curves, the ratios to random
search, leave one out, and the command."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet.bench.pareto import Frame, Variant, cross_validate, curve, frame, losses_of, pareto_command, run
from fleet.replay import load_recorded
from fleet.search.pareto import hypervolume_2d


def write_space(path: Path, size: int = 30) -> Path:
    """A recorded space of two knobs whose time falls as x grows and whose compile time grows with it; y only
    adds to both, and a few configurations failed."""
    cache = {}
    for x in range(size):
        for y in range(size):
            record: dict = {"x": x, "y": y, "compile_time": 100.0 + 40 * x + 30 * abs(y - 7), "benchmark_time": 5.0}
            record["time"] = "RuntimeFailedConfig" if (x * y) % 17 == 1 else 10.0 + (size - x) ** 1.5 + 2 * abs(y - 7)
            cache[f"{x},{y}"] = record
    document = {
        "tune_params_keys": ["x", "y"],
        "tune_params": {"x": list(range(size)), "y": list(range(size))},
        "cache": cache,
    }
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


@pytest.fixture
def space(tmp_path: Path) -> Path:
    return write_space(tmp_path / "synthetic__two.json.gz")


def test_the_frame_scores_against_the_whole_recorded_front(space: Path) -> None:
    recorded = load_recorded(space)
    scored = frame(recorded, draws=100, points=10)
    losses = list(losses_of(recorded).values())
    assert len(losses) == sum(1 for r in recorded.records.values() if r.valid)
    # The reference lies beyond the worst of the front in each objective: a share of its range further out.
    assert all(scored.reference[m] > min(loss[m] for loss in losses) for m in range(2))
    assert scored.whole == pytest.approx(hypervolume_2d(losses, scored.reference))
    assert scored.times[-1] == pytest.approx(100 * recorded.mean_cost_s()) and len(scored.times) == 10


def test_the_curve_grows_to_one_once_every_configuration_is_measured(space: Path) -> None:
    recorded = load_recorded(space)
    scored = frame(recorded, draws=2 * recorded.size, points=20)
    values = curve(recorded, Variant("grid", "grid"), 0, scored)
    assert all(0 <= a <= b <= 1 + 1e-12 for a, b in itertools.pairwise(values))
    assert values[-1] == pytest.approx(1.0)
    nothing = Frame(scored.reference, scored.whole, (0.0,))
    assert curve(recorded, Variant("grid", "grid"), 0, nothing) == [0.0]


def test_nsga2_is_ahead_of_random_search_on_a_front_it_can_follow(space: Path) -> None:
    rows = run([space], [Variant("nsga2", "nsga2")], repeats=4)
    by_strategy = {row["strategy"]: row for row in rows}
    assert by_strategy["random"]["ratio"] == 1.0
    nsga2 = by_strategy["nsga2"]
    assert nsga2["ratio"] > 1.05 and nsga2["final"] > by_strategy["random"]["final"]
    assert nsga2["repeats"] == 4 and nsga2["area_sem"] >= 0


def test_a_strategy_that_fails_is_reported_and_random_search_still_scored(space: Path) -> None:
    rows = run([space], [Variant("broken", "nsga2", (("population", 1),))], repeats=2)
    broken = next(row for row in rows if row["strategy"] == "broken")
    assert "population must be an integer >= 2" in broken["error"] and "ratio" not in broken
    assert next(row for row in rows if row["strategy"] == "random")["ratio"] == 1.0


def test_leave_one_out_chooses_by_the_geometric_mean_on_the_other_spaces() -> None:
    ratios = {"a": {"s1": 1.0, "s2": 1.2, "s3": 9.0}, "b": {"s1": 1.3, "s2": 1.3, "s3": 1.3}}
    rows = [{"space": s, "strategy": "random", "ratio": 1.0, "final": 0.5} for s in ("s1", "s2", "s3")]
    rows += [{"space": s, "strategy": c, "ratio": r, "final": 0.9} for c, by in ratios.items() for s, r in by.items()]
    result = cross_validate(rows, ["a", "b"])
    # Left out s1: a's geometric mean on s2, s3 (3.29) beats b's (1.3); left out s3, b's (1.3) beats a's (1.10).
    assert [r["chosen"] for r in result[:-1]] == ["a", "a", "b"]
    assert [r["ratio"] for r in result[:-1]] == [1.0, 1.2, 1.3]
    assert result[-1]["ratio"] == pytest.approx((1.0 * 1.2 * 1.3) ** (1 / 3)) and result[-1]["worst"] == 1.0
    assert result[-1]["in_sample"]["b"] == pytest.approx(1.3)
    assert math.isclose(result[-1]["in_sample"]["a"], (1.0 * 1.2 * 9.0) ** (1 / 3))


def test_the_command_prints_a_ratio_per_space_and_strategy(tmp_path: Path) -> None:
    first = write_space(tmp_path / "one.json.gz", size=12)
    second = write_space(tmp_path / "two.json.gz", size=14)
    done = CliRunner().invoke(pareto_command, ["--space", str(first), "--space", str(second), "--repeats", "2"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == "hypervolume over time (time and compile time), 2 repeats, as a ratio to random search's"
    assert [line.split()[:2] for line in lines[2:6]] == [
        ["one", "random"],
        ["one", "nsga2"],
        ["two", "random"],
        ["two", "nsga2"],
    ]
    assert lines[-1].startswith("nsga2: geometric mean ratio ")
    refused = CliRunner().invoke(pareto_command, ["--space", str(first), "--cv"])
    assert refused.exit_code != 0
    assert "--cv leaves one space out: it needs at least two spaces" in str(refused.exception)
