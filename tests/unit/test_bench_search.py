"""The search-quality benchmark: the calculated random-search baseline, scores, and ``fleet bench search``.

fleet/bench/search.py.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from fleet.bench import search as bench_search
from fleet.bench.search import (
    Variant,
    baseline,
    choose,
    cross_validate,
    default_strategies,
    expected_best,
    expected_draws_to_reach,
    run,
    score,
    search_command,
)
from fleet.errors import SpecError
from fleet.replay import Evaluation, load_recorded
from fleet.search import STRATEGIES, Proposals, Searcher
from tests.conftest import SPACES

PNPOLY = SPACES / "pnpoly__RTX_2080_Ti.json.gz"
GEMM = SPACES / "gemm_clblast__RTX_2080_Ti.json.gz"


class Shuffled(Searcher):
    """Behaves like random search: every recorded configuration once, in a random order."""

    name = "shuffled"

    every: ClassVar[dict[int, list[dict[str, Any]]]] = {}

    def generate(self) -> Proposals:
        if id(self.space) not in self.every:
            self.every[id(self.space)] = list(self.space)
        configs = list(self.every[id(self.space)])
        random.Random(self.seed).shuffle(configs)
        # Not `yield from`: that would pass the driver's send() on to the list's iterator, which has none.
        for config in configs:  # noqa: UP028
            yield config


class Oracle(Shuffled):
    """Knows the optimum and proposes it first, then behaves like random search."""

    name = "oracle"
    bests: ClassVar[dict[tuple[str, ...], dict[str, Any]]] = {}

    def generate(self) -> Proposals:
        best = self.bests[tuple(self.space.names)]
        yield best
        for config in Shuffled.generate(self):
            if config != best:
                yield config


class Broken(Searcher):
    name = "broken"

    def generate(self) -> Proposals:
        yield {"nope": 1}


class NeedsOptions(Searcher):
    name = "needs-options"

    def __init__(self, space: Any, *, knob: str, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)

    def generate(self) -> Proposals:
        yield from ()


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in (Shuffled, Oracle, Broken, NeedsOptions):
        monkeypatch.setitem(STRATEGIES, cls.name, cls)
    for path in (PNPOLY, GEMM):
        recorded = load_recorded(path)
        monkeypatch.setitem(Oracle.bests, tuple(recorded.names), recorded.best)


# -- the expected best of random search --------------------------------------------------------------------------


def brute_force(values: list[float | None], draws: int, fallback: float) -> float:
    """The mean, over every set of ``draws`` of ``values``, of the best valid one (None is invalid)."""
    bests = []
    for chosen in itertools.combinations(values, draws):
        valid = [v for v in chosen if v is not None]
        bests.append(min(valid) if valid else fallback)
    return statistics.fmean(bests)


@pytest.mark.parametrize(
    "values",
    [
        [3.0],
        [5.0, 1.0, 4.0, 2.0, 3.0],
        [2.0, 2.0, 1.0, 7.0, 7.0, 3.0],
        [4.0, None, 1.5, None, 9.0, 2.5, None],
        [None, None, 6.0],
    ],
)
def test_the_expected_best_matches_every_draw_enumerated(values: list[float | None]) -> None:
    valid = sorted(v for v in values if v is not None)
    fallback = statistics.fmean(valid)
    for draws in range(1, len(values) + 1):
        expected = expected_best(valid, len(values), draws)
        assert expected == pytest.approx(brute_force(values, draws, fallback), rel=1e-12)
    assert expected_best(valid, len(values), len(values)) == pytest.approx(valid[0])


def test_between_two_draw_counts_the_expected_best_is_interpolated_and_clamped() -> None:
    valid = [1.0, 2.0, 3.0, 4.0]
    two, three = expected_best(valid, 4, 2), expected_best(valid, 4, 3)
    assert expected_best(valid, 4, 2.25) == pytest.approx(0.75 * two + 0.25 * three)
    assert expected_best(valid, 4, 0.1) == expected_best(valid, 4, 1) == 2.5
    assert expected_best(valid, 4, 99) == 1.0
    assert expected_best(valid, 4, 1, fallback=100.0) == 2.5


def test_the_expected_best_matches_a_monte_carlo_estimate() -> None:
    rng = random.Random(7)
    values: list[float | None] = [rng.lognormvariate(0, 1) for _ in range(250)] + [None] * 50
    valid = sorted(v for v in values if v is not None)
    fallback = statistics.fmean(valid)
    for draws in (1, 3, 12, 60):
        samples = []
        for _ in range(20_000):
            found = [v for v in rng.sample(values, draws) if v is not None]
            samples.append(min(found) if found else fallback)
        mean, error = statistics.fmean(samples), statistics.stdev(samples) / math.sqrt(len(samples))
        assert expected_best(valid, len(values), draws) == pytest.approx(mean, abs=4 * error + 1e-9)


def test_expected_draws_until_one_of_the_good_ones() -> None:
    # Enumerate every order of 5 configurations of which 2 are good.
    orders = list(itertools.permutations([1, 1, 0, 0, 0]))
    first = statistics.fmean(order.index(1) + 1 for order in orders)
    assert expected_draws_to_reach(2, 5) == pytest.approx(first) == 2.0


# -- the baseline and the score ----------------------------------------------------------------------------------


def test_the_baseline_of_a_real_space() -> None:
    recorded = load_recorded(PNPOLY)
    base = baseline(recorded)
    assert base.target == pytest.approx(base.optimum + 0.05 * (base.median - base.optimum))
    # The cutoff: the first draw count whose expected best reaches the target.
    valid, total = recorded.valid_times, recorded.size
    assert expected_best(valid, total, base.draws_to_cutoff) <= base.target
    assert expected_best(valid, total, base.draws_to_cutoff - 1) > base.target
    assert base.draw_s == pytest.approx(recorded.mean_cost_s())
    assert base.budget_s == pytest.approx(base.draws_to_cutoff * base.draw_s)
    assert len(base.times) == 100 and base.times[-1] == pytest.approx(base.budget_s)
    assert all(a > b for a, b in itertools.pairwise(base.best[2:]))
    assert base.best[-1] == pytest.approx(base.target, rel=0.01)
    # With four slots random search draws four times as fast, 1.5 draws behind (what is still in flight).
    fast = baseline(recorded, 4)
    assert fast.draws_to_cutoff == base.draws_to_cutoff
    assert fast.budget_s == pytest.approx((base.draws_to_cutoff + 1.5) * base.draw_s / 4)
    for t, b in zip(fast.times, fast.best, strict=True):
        assert b == pytest.approx(expected_best(valid, total, 4 * t / base.draw_s - 1.5))
    assert fast.random_time_to_near_s == pytest.approx((base.random_evals_to_near + 1.5) * base.draw_s / 4)


def test_the_score_is_one_at_the_optimum_and_negative_with_nothing_found() -> None:
    base = baseline(load_recorded(PNPOLY))
    config = {"x": 1}
    assert score([Evaluation(config, base.optimum, 0.0, 0.0)], base) == 1.0
    nothing = score([Evaluation(config, None, 0.0, 0.0)], base)
    assert nothing == score([], base) < -1
    # F(t) equal to the median from the start: worse than random search soon after its first draws.
    assert score([Evaluation(config, base.median, 0.0, 0.0)], base) < 0
    # Finding the optimum only at the end of the budget scores below finding it at the start.
    late = [Evaluation(config, base.optimum, base.budget_s / 2, 0.0)]
    assert nothing < score(late, base) < 0.5


def test_a_strategy_that_behaves_like_random_search_scores_about_zero() -> None:
    rows, _ = run([PNPOLY, GEMM], ["shuffled"], repeats=40, progress=False)
    for row in rows:
        # Loose: one run's score varies by about 0.3-0.7, so 40 repeats leave about 0.05-0.1 of noise.
        assert abs(row["score"]) < 0.25, row
        assert abs(row["score"]) < 3 * row["score_sem"], row
        assert row["reached_5pct"] > 0
    # Eight slots, each random draw in parallel: random search with as many slots is the baseline.
    (row,), _ = run([GEMM], ["shuffled"], repeats=20, slots=8, progress=False)
    assert abs(row["score"]) < 0.25, row


def test_a_strategy_that_proposes_the_optimum_first_scores_about_one() -> None:
    rows, _ = run([PNPOLY, GEMM], ["oracle"], repeats=3, progress=False)
    for row in rows:
        assert row["score"] > 0.95, row
        assert row["evals_to_5pct"] == 1 and row["reached_5pct"] == 1.0
        recorded = load_recorded(SPACES / f"{row['space']}.json.gz")
        assert row["time_to_5pct_s"] == pytest.approx(recorded.lookup(recorded.best).cost_s())
        assert row["random_evals_to_5pct"] > 10


def test_default_strategies_leave_out_grid_and_those_that_need_options() -> None:
    names = default_strategies(load_recorded(PNPOLY))
    assert "grid" not in names and "needs-options" not in names
    assert {"random", "shuffled", "oracle"} <= set(names)


def test_a_strategy_that_fails_is_reported_and_the_others_still_scored() -> None:
    rows, _ = run([PNPOLY], ["broken", "oracle"], repeats=2, progress=False)
    broken, oracle = rows
    assert broken["score"] is None and "lacks knob" in broken["error"]
    assert oracle["score"] > 0.9


# -- the command -------------------------------------------------------------------------------------------------


def test_json_and_trace_hold_everything_needed_to_recompute_the_scores(tmp_path: Path) -> None:
    trace_path = tmp_path / "trace.jsonl"
    args = ["--space", "pnpoly__RTX_2080_Ti", "--strategy", "shuffled", "--strategy", "oracle"]
    args += ["--repeats", "3", "--jobs", "1", "--json", "--trace", str(trace_path)]
    result = CliRunner().invoke(search_command, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["strategy"] for r in rows] == ["shuffled", "oracle"]
    for row in rows:
        assert {"strategy", "score", "evals_to_5pct", "time_to_5pct_s", "space", "repeats", "slots"} <= set(row)
        assert row["space"] == "pnpoly__RTX_2080_Ti" and row["repeats"] == 3
    lines = [json.loads(line) for line in trace_path.read_text().splitlines()]
    assert {frozenset(line) for line in lines} == {
        frozenset({"space", "strategy", "repeat", "config", "time_ms", "clock_s"})
    }
    recorded = load_recorded(PNPOLY)
    assert all(set(line["config"]) == set(recorded.names) for line in lines)
    assert any(line["time_ms"] is None for line in lines)
    # Recompute every score from the trace alone.
    base = baseline(recorded)
    for row in rows:
        scores = []
        for repeat in range(3):
            mine = [line for line in lines if line["strategy"] == row["strategy"] and line["repeat"] == repeat]
            trace = [Evaluation(line["config"], line["time_ms"], line["clock_s"], 0.0) for line in mine]
            scores.append(score(trace, base))
        assert statistics.fmean(scores) == pytest.approx(row["score"])


def test_the_table_and_the_average_over_spaces() -> None:
    args = ["--space", "pnpoly__RTX_2080_Ti", "--space", str(GEMM), "--strategy", "oracle", "--repeats", "1"]
    result = CliRunner().invoke(search_command, [*args, "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "pnpoly__RTX_2080_Ti: optimum 8.024 ms" in result.stdout
    assert "gemm_clblast__RTX_2080_Ti: optimum 11.48 ms" in result.stdout
    assert "average over 2 spaces" in result.stdout
    assert "oracle" in result.stdout and "random search (calculated)" in result.stdout
    result = CliRunner().invoke(search_command, [*args, "--jobs", "1", "--json"])
    rows = json.loads(result.stdout)
    assert [r["space"] for r in rows] == ["pnpoly__RTX_2080_Ti", "gemm_clblast__RTX_2080_Ti", "average"]
    assert rows[2]["score"] == pytest.approx((rows[0]["score"] + rows[1]["score"]) / 2)


def test_an_unknown_strategy_or_space_is_one_clear_error() -> None:
    result = CliRunner().invoke(search_command, ["--space", "pnpoly__RTX_2080_Ti", "--strategy", "nope"])
    assert isinstance(result.exception, SpecError) and "unknown strategy 'nope'" in str(result.exception)
    result = CliRunner().invoke(search_command, ["--space", "nope"])
    assert isinstance(result.exception, SpecError) and "recorded space 'nope' not found" in str(result.exception)


# -- leave one space out -----------------------------------------------------------------------------------------


def test_each_space_gets_the_candidate_best_on_the_others() -> None:
    # A is excellent on x alone; B is fair everywhere.
    scores = {"A": {"x": 1.0, "y": 0.0, "z": 0.0}, "B": {"x": 0.2, "y": 0.3, "z": 0.3}}
    assert choose(scores, "x") == "B"  # A 0.0 against B 0.3 on y and z
    assert choose(scores, "y") == "A"  # A 0.5 against B 0.25 on x and z
    assert choose({"A": {"x": 0.5, "y": 0.5}, "B": {"x": 0.5, "y": 0.5}}, "x") == "A"  # a tie: the first


def test_cross_validation_scores_each_space_with_what_the_others_chose() -> None:
    rows = []
    for space, a, b, r in (("x", 1.0, 0.2, 0.1), ("y", 0.0, 0.3, -0.2), ("z", 0.0, 0.3, 0.0)):
        for name, value in (("A", a), ("B", b), ("random", r)):
            rows.append({"space": space, "strategy": name, "score": value, "score_sem": 0.05, "repeats": 20})
    result = cross_validate(rows, ["A", "B"], ["random"])
    assert [(r["space"], r["chosen"], r["score"]) for r in result[:-1]] == [
        ("x", "B", 0.2),
        ("y", "A", 0.0),
        ("z", "A", 0.0),
    ]
    summary = result[-1]
    assert summary["score"] == pytest.approx(0.2 / 3) and summary["worst"] == 0.0
    assert summary["compared"]["random"] == {"score": pytest.approx(-0.1 / 3), "worst": -0.2}
    assert summary["in_sample"] == {"A": pytest.approx(1 / 3), "B": pytest.approx(0.8 / 3)}
    assert result[1]["compared"]["random"] == {"score": -0.2, "score_sem": 0.05}


def test_the_cv_command_prints_held_out_scores_beside_random_search(monkeypatch: pytest.MonkeyPatch) -> None:
    # Cheap candidates stand in for auto's: the oracle should be chosen on either space, and score about one.
    monkeypatch.setattr(bench_search, "CANDIDATES", (Variant("shuffled", "shuffled"), Variant("oracle", "oracle")))
    args = ["--cv", "--space", "pnpoly__RTX_2080_Ti", "--space", str(GEMM), "--repeats", "2", "--jobs", "1"]
    result = CliRunner().invoke(search_command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["space"] for r in rows] == ["pnpoly__RTX_2080_Ti", "gemm_clblast__RTX_2080_Ti", "mean"]
    for row in rows[:2]:
        assert row["chosen"] == "oracle" and row["score"] > 0.9 and row["repeats"] == 2
        assert set(row["compared"]) == {"random"} and row["compared"]["random"]["score"] < 0.9
    assert rows[2]["worst"] == min(rows[0]["score"], rows[1]["score"])
    result = CliRunner().invoke(search_command, [*args, "--strategy", "shuffled"])
    assert result.exit_code == 0, result.output
    assert "leave one space out: 2 spaces, 2 repeats" in result.stdout
    assert "random" in result.stdout and "shuffled" in result.stdout and "worst" in result.stdout


def test_cv_needs_two_spaces_and_bench_search_needs_a_space() -> None:
    result = CliRunner().invoke(search_command, ["--cv", "--space", "pnpoly__RTX_2080_Ti"])
    assert isinstance(result.exception, SpecError) and "at least two spaces" in str(result.exception)
    result = CliRunner().invoke(search_command, [])
    assert isinstance(result.exception, SpecError) and "needs --space" in str(result.exception)
