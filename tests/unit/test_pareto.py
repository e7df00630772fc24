"""Several objectives: dominance, NSGA-II's sorting and crowding, the front, the 2-D hypervolume, and the nsga2
searcher (deterministic, within the constraints, ahead of random search on a synthetic front)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from fleet.errors import SpecError
from fleet.search import NSGA2, make_searcher
from fleet.search.base import WAIT, Run
from fleet.search.pareto import (
    Objective,
    crowding_distance,
    dominates,
    front,
    hypervolume_2d,
    loss_vector,
    non_dominated_sort,
)
from fleet.space import Space

INF = math.inf
TIME, ENERGY = Objective("time"), Objective("energy")


def test_dominance_is_strict_in_one_objective_and_no_worse_in_all() -> None:
    assert dominates((1, 2), (2, 2))
    assert dominates((1, 1), (2, 2))
    assert not dominates((1, 2), (1, 2))  # equal points dominate neither way
    assert not dominates((1, 3), (2, 2)) and not dominates((2, 2), (1, 3))
    assert dominates((1, 1), (INF, INF))


def test_loss_vector_negates_what_is_maximised_and_fails_what_is_missing() -> None:
    objectives = [Objective("gflops", maximize=True), Objective("power_w")]
    assert loss_vector({"gflops": 10, "power_w": 3.5}, objectives) == (-10.0, 3.5)
    assert loss_vector({"gflops": 10}, objectives) == (-10.0, INF)
    assert loss_vector({"gflops": math.nan, "power_w": True}, objectives) == (INF, INF)


def test_non_dominated_sort_gives_each_point_its_front() -> None:
    losses = [(1, 5), (2, 2), (5, 1), (3, 3), (4, 4), (2, 2), (6, 6), (INF, INF)]
    assert non_dominated_sort(losses) == [[0, 1, 2, 5], [3], [4], [6], [7]]
    assert non_dominated_sort([]) == []


def test_non_dominated_sort_agrees_with_brute_force() -> None:
    rng = random.Random(3)
    losses = [(rng.randrange(8), rng.randrange(8), rng.randrange(8)) for _ in range(60)]
    remaining, fronts = set(range(len(losses))), []
    while remaining:
        layer = {i for i in remaining if not any(dominates(losses[j], losses[i]) for j in remaining)}
        fronts.append(sorted(layer))
        remaining -= layer
    assert [sorted(f) for f in non_dominated_sort(losses)] == fronts


def test_crowding_distance_keeps_the_ends_and_measures_the_gaps() -> None:
    # Sorted by the first objective: 0, 1, 3, 4 (and by the second the reverse); ranges 4 and 4.
    distance = crowding_distance([(0, 4), (1, 3), (3, 1), (4, 0)])
    assert distance[0] == distance[3] == INF
    assert distance[1] == pytest.approx((3 - 0) / 4 + (4 - 1) / 4)
    assert distance[2] == pytest.approx((4 - 1) / 4 + (3 - 0) / 4)
    assert crowding_distance([(1, 1), (1, 1)]) == [INF, INF]
    assert crowding_distance([]) == []


def test_front_leaves_out_failed_dominated_and_repeated_points() -> None:
    losses = [(3, 1), (1, 3), (2, 2), (2, 2), (3, 3), (INF, 0), (1, 4)]
    assert front(losses) == [1, 2, 0]


def test_hypervolume_2d_is_the_exact_dominated_area() -> None:
    # Three steps against the reference (4, 4): 3x1 + 2x1 + 1x1 ... built up strip by strip.
    assert hypervolume_2d([(1, 3), (2, 2), (3, 1)], (4, 4)) == pytest.approx(3 * 1 + 2 * 1 + 1 * 1)
    assert hypervolume_2d([(1, 1)], (4, 4)) == pytest.approx(9)
    # A dominated point, a repeated one and one beyond the reference add nothing.
    assert hypervolume_2d([(1, 3), (2, 2), (3, 1), (3, 3), (2, 2), (5, 0)], (4, 4)) == pytest.approx(6)
    assert hypervolume_2d([], (4, 4)) == 0


def test_hypervolume_2d_agrees_with_counting_unit_cells() -> None:
    rng = random.Random(5)
    points = [(rng.randrange(10), rng.randrange(10)) for _ in range(25)]
    cells = sum(1 for x, y in itertools.product(range(10), range(10)) if any(px <= x and py <= y for px, py in points))
    assert hypervolume_2d(points, (10, 10)) == pytest.approx(cells)


# -- the nsga2 searcher ----------------------------------------------------------------------------------------

SPACE = {"knobs": {"a": list(range(16)), "b": list(range(16)), "c": [0, 1, 2, 3]}, "constraints": ["a + b <= 24"]}


def measure(config: dict) -> Run:
    """A synthetic pair of objectives in conflict: time falls with a, energy rises with it; b and c add waste."""
    a, b, c = config["a"], config["b"], config["c"]
    time = 20 - a + abs(b - 6) + c
    energy = a * a / 8 + abs(b - 6) + 2 * (c != 1)
    return Run(config, time, True, objectives={"time": float(time), "energy": float(energy)})


def drive(searcher: NSGA2, slots: int = 1, order: random.Random | None = None) -> list[dict]:
    """Run ``searcher`` with up to ``slots`` runs out at once, sent back in the order ``order`` shuffles them."""
    proposals = searcher.generate()
    proposed: list[dict] = []
    out: list[dict] = []
    answer = None
    while True:
        try:
            config = proposals.send(answer) if proposed or out else next(proposals)
        except StopIteration:
            return proposed
        answer = None
        if config is not WAIT:
            proposed.append(config)
            out.append(config)
        if config is WAIT or len(out) >= slots:
            if order is not None:
                order.shuffle(out)
            answer = measure(out.pop(0))


def test_nsga2_is_deterministic_whatever_order_a_generation_comes_back_in() -> None:
    def searcher() -> NSGA2:
        return NSGA2(Space.from_dict(SPACE), objectives=[TIME, ENERGY], population=8, budget=60, seed=4)

    first = drive(searcher())
    assert len(first) == 60
    assert drive(searcher()) == first
    # With 8 slots and the runs of each generation sent back in a shuffled order, the same proposals.
    assert drive(searcher(), slots=8, order=random.Random(1)) == first
    other = NSGA2(Space.from_dict(SPACE), objectives=[TIME, ENERGY], population=8, budget=60, seed=5)
    assert drive(other) != first


def test_nsga2_proposes_only_valid_configurations_and_none_twice() -> None:
    space = Space.from_dict(SPACE)
    proposed = drive(NSGA2(space, objectives=[TIME, ENERGY], population=10, budget=300, seed=2))
    assert all(space.is_valid(config) and config["a"] + config["b"] <= 24 for config in proposed)
    keys = [tuple(config.values()) for config in proposed]
    assert len(set(keys)) == len(keys) == 300


def test_nsga2_finds_more_of_the_front_than_random_search() -> None:
    space = Space.from_dict(SPACE)
    objectives = [TIME, ENERGY]

    def hypervolume(configs: list[dict]) -> float:
        losses = [loss_vector(measure(c).objectives, objectives) for c in configs]
        return hypervolume_2d(losses, (40.0, 60.0))

    ahead = 0
    for seed in range(5):
        nsga2 = drive(make_searcher("nsga2", space, budget=80, seed=seed, objectives=objectives))  # type: ignore[arg-type]
        rand = drive(make_searcher("random", space, budget=80, seed=seed, objectives=objectives))  # type: ignore[arg-type]
        ahead += hypervolume(nsga2) > hypervolume(rand)
    assert ahead == 5


def test_auto_is_nsga2_for_several_objectives_and_one_objective_strategies_are_refused() -> None:
    space = Space.from_dict(SPACE)
    searcher = make_searcher("auto", space, objectives=[TIME, ENERGY])
    assert isinstance(searcher, NSGA2) and searcher.objectives == [TIME, ENERGY]
    assert make_searcher("auto", space, objectives=[TIME]).name == "auto"
    assert make_searcher("random", space, objectives=[TIME, ENERGY]).name == "random"
    with pytest.raises(SpecError, match=r"strategy 'genetic' optimises one objective.*use nsga2"):
        make_searcher("genetic", space, objectives=[TIME, ENERGY])
    with pytest.raises(
        SpecError, match=r"strategy auto \(which is nsga2 for several objectives\) has no option 'init'"
    ):
        make_searcher("auto", space, options={"init": 5}, objectives=[TIME, ENERGY])
    with pytest.raises(SpecError, match="population must be an integer >= 2"):
        make_searcher("nsga2", space, options={"population": 1})


def test_nsga2_with_one_objective_breeds_from_the_best_and_skips_failed_runs() -> None:
    space = Space.from_dict({"knobs": {"x": list(range(40)), "y": list(range(40))}})
    searcher = NSGA2(space, population=6, budget=120, seed=0)
    proposals = searcher.generate()
    config, best = next(proposals), math.inf
    for _ in range(119):
        value = (config["x"] - 30) ** 2 + (config["y"] - 10) ** 2
        failed = config["x"] % 7 == 0
        best = best if failed else min(best, value)
        config = proposals.send(Run(config, None if failed else value, not failed))
    assert best <= 2
