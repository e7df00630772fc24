"""The default strategy's parts: the first design, the bandit's credit per second.

fleet/search/design.py, fleet/search/auto.py, fleet/search/points.py (cost).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fleet.errors import SpecError
from fleet.search import Run, make_searcher
from fleet.search.auto import Bandit
from fleet.search.design import latin_hypercube
from fleet.search.points import Grid, History, Point, Technique, cost
from fleet.space import Space
from tests.unit.test_searchers_dynamic import drive


def space(knobs: dict, constraints: list[str] | None = None) -> Space:
    return Space.from_dict({"knobs": knobs, "constraints": constraints or []})


# -- the design --------------------------------------------------------------------------------------------------


def test_a_latin_hypercube_takes_each_value_of_each_knob_once_when_it_has_as_many_points() -> None:
    grid = Grid(space({"a": list(range(8)), "b": list(range(8)), "c": list(range(8))}))
    points = latin_hypercube(grid, 8, random.Random(3))
    assert len(set(points)) == 8
    for knob in range(3):
        assert sorted(p[knob] for p in points) == list(range(8))


def test_with_more_points_than_values_each_value_gets_its_share() -> None:
    grid = Grid(space({"a": [1, 2, 4], "b": list(range(40))}))
    points = latin_hypercube(grid, 30, random.Random(1))
    assert Counter(p[0] for p in points) == {0: 10, 1: 10, 2: 10}
    # Thirty points over forty values: one per stratum of 4/3 values, so no value twice.
    assert len({p[1] for p in points}) == 30


def test_design_points_are_valid_new_and_spread_even_under_constraints() -> None:
    # Most of the box is ruled out: points the hypercube puts there move to valid ones.
    s = space({"x": [1, 2, 4, 8, 16, 32, 64], "y": [1, 2, 4, 8, 16, 32, 64]}, ["32 <= x * y <= 256"])
    grid = Grid(s)
    seen: dict[Point, None] = {grid.encode({"x": 8, "y": 8}): None}  # type: ignore[dict-item]
    points = latin_hypercube(grid, 10, random.Random(5), seen)
    assert len(set(points)) == 10
    assert all(grid.is_valid(p) and p not in seen for p in points)
    assert len({p[0] for p in points}) >= 5 and len({p[1] for p in points}) >= 5


def test_a_design_larger_than_the_space_stops_at_the_space() -> None:
    grid = Grid(space({"a": [1, 2, 3], "b": [1, 2]}, ["a != 2"]))
    assert sorted(latin_hypercube(grid, 10, random.Random(0))) == [(0, 0), (0, 1), (2, 0), (2, 1)]


def test_auto_starts_with_its_design_and_never_a_cluster() -> None:
    s = space({f"k{i}": list(range(10)) for i in range(4)})
    for seed in range(3):
        proposals = drive(make_searcher("auto", s, budget=30, seed=seed, options={"init": 10}), lambda c: 1.0)
        first = proposals[:10]
        # A hypercube of ten points over ten values: every knob's values all different.
        for knob in s.names:
            assert len({c[knob] for c in first}) == 10
        assert len({tuple(c.values()) for c in proposals}) == 30


def test_the_design_size_is_an_option() -> None:
    s = space({"a": list(range(20)), "b": list(range(20))})
    proposals = drive(make_searcher("auto", s, budget=5, options={"init": 5}), lambda c: float(c["a"] + c["b"]))
    assert len({c["a"] for c in proposals}) == 5
    with pytest.raises(SpecError, match="strategy 'auto': init must be an integer >= 0"):
        make_searcher("auto", s, options={"init": -1})
    with pytest.raises(SpecError, match="strategy 'auto': credit must be one of time, count"):
        make_searcher("auto", s, options={"credit": "luck"})
    with pytest.raises(SpecError, match="strategy 'auto': exploration must be a number >= 0"):
        make_searcher("auto", s, options={"exploration": "a lot"})


# -- credit per second -------------------------------------------------------------------------------------------


def test_a_runs_cost_comes_from_its_metrics() -> None:
    config = {"a": 1}
    assert cost(Run(config, 1.0, True, {"simulated_s": 2.5, "compile_s": 9.0})) == 2.5
    assert cost(Run(config, 1.0, True, {"compile_s": 1.5, "benchmark_s": 0.5})) == 2.0
    assert cost(Run(config, None, False, {"compile_s": 3.0})) == 3.0
    assert cost(Run(config, 1.0, True, {"gflops": 100.0})) is None
    assert cost(Run(config, 1.0, True, {"simulated_s": "soon"})) is None


class Fixed(Technique):
    """Proposes the points it is given, in order."""

    def __init__(self, grid: Grid, history: History, points: list[Point]) -> None:
        super().__init__(grid, history, random.Random(0))
        self.points = points

    def propose(self) -> Point | None:
        return self.points.pop(0) if self.points else None


def two_techniques(by_time: bool) -> tuple[Bandit, History]:
    grid = Grid(space({"a": list(range(10)), "b": list(range(10))}))
    history = History(grid)
    dear = Fixed(grid, history, [(1, i) for i in range(10)])
    cheap = Fixed(grid, history, [(0, i) for i in range(10)])
    return Bandit(grid, history, random.Random(0), {"dear": dear, "cheap": cheap}, by_time=by_time), history


def test_by_time_the_technique_whose_proposals_cost_less_ranks_first() -> None:
    bandit, history = two_techniques(by_time=False)
    # Counted per proposal, turns go dear, cheap, dear, cheap (untried first, then ties in the given order). Both
    # find a new best with their first proposal and none with their second; the dear one's take ten times longer.
    for value in (10.0, 9.0, 9.5, 9.2):
        point = bandit.propose()
        assert point is not None
        history.propose(point)
        history.record(point, value, 10.0 if point[0] == 1 else 1.0)
        bandit.observe(point, value)
    assert list(bandit.results["dear"]) == [(True, 10.0), (False, 10.0)]
    assert list(bandit.results["cheap"]) == [(True, 1.0), (False, 1.0)]
    assert bandit.ranked() == ["dear", "cheap"]
    # The same record, per second: the cheap one's credit is ten times the dear one's.
    by_time, _ = two_techniques(by_time=True)
    by_time.results = bandit.results
    assert by_time.ranked() == ["cheap", "dear"]
    mean = by_time._mean_cost()
    assert mean == pytest.approx(5.5)
    assert by_time.score("cheap", mean) - by_time.score("dear", mean) == pytest.approx((1 / 3) * (5.5 - 0.55))


def test_without_costs_the_credit_is_opentuners() -> None:
    grid = Grid(space({"a": list(range(5))}))
    history = History(grid)
    bandit = Bandit(grid, history, random.Random(0), {"one": Fixed(grid, history, [(0,), (1,), (2,)])})
    for value in (3.0, 2.0, 5.0):
        point = bandit.propose()
        assert point is not None
        history.propose(point)
        history.record(point, value)  # no cost known
        bandit.observe(point, value)
    # Uses weigh 1, 2, 3; new bests at the first two: (1 + 2) / 6, plus exploration sqrt(2 ln 3 / 3) x C.
    assert bandit.score("one", bandit._mean_cost()) == pytest.approx(0.5 + 0.05 * (2 * 1.0986122886681098 / 3) ** 0.5)
