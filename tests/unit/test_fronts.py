"""fleet/fronts.py: a campaign's front from its results, and the point a preference chooses."""

from __future__ import annotations

import pytest

from fleet.errors import SpecError
from fleet.fronts import Preference, check_preference, choose, front_of, objective_values
from fleet.search.pareto import Objective
from fleet.store import TrialResult

TIME, ENERGY, GFLOPS = Objective("time"), Objective("energy"), Objective("gflops", maximize=True)


def result(trial: int, time: float, energy: float, gflops: float = 1.0) -> TrialResult:
    values = {"time": time, "energy": energy, "gflops": gflops}
    return TrialResult(trial, 1, {"x": trial}, "evaluated", None, time, True, objectives=values)


POINTS = [result(1, 10.0, 100.0), result(2, 10.5, 80.0), result(3, 11.5, 60.0), result(4, 20.0, 30.0)]
WORSE = [result(5, 12.0, 90.0), result(6, 10.5, 80.0)]  # dominated, and equal to a point of the front


def test_the_front_is_every_point_no_other_beats_in_every_objective() -> None:
    found = front_of([*WORSE, *POINTS], [TIME, ENERGY])
    assert [r.trial_id for r in found] == [1, 6, 3, 4]  # of two equal points, the first given; best time first
    assert objective_values(POINTS[0], [TIME, ENERGY]) == {"time": 10.0, "energy": 100.0, "gflops": 1.0}


def test_a_preference_is_the_best_of_its_objective_within_a_tolerance_of_the_first() -> None:
    objectives = [TIME, ENERGY]
    assert choose(POINTS, objectives, Preference("time")).trial_id == 1
    assert choose(POINTS, objectives, Preference("energy")).trial_id == 2  # within 10% of 10.0: 10.5, not 11.5
    assert choose(POINTS, objectives, Preference("energy", within=20)).trial_id == 3
    assert choose(POINTS, objectives, Preference("energy", within=0)).trial_id == 1
    assert choose(POINTS, objectives, Preference("energy", within=1000)).trial_id == 4
    assert Preference("energy").describe(objectives) == "least energy within 10% of the best time"
    assert Preference("time").describe(objectives) == "least time"


def test_a_larger_is_better_first_objective_counts_its_tolerance_downwards() -> None:
    points = [result(1, 1.0, 50.0, gflops=100.0), result(2, 1.0, 40.0, gflops=91.0), result(3, 1.0, 10.0, 80.0)]
    objectives = [GFLOPS, ENERGY]
    assert choose(points, objectives, Preference("energy")).trial_id == 2  # 91 is within 10% of 100, 80 is not
    assert Preference("gflops").describe(objectives) == "most gflops"


def test_a_preference_that_cannot_be_met_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match="no objective 'power': the campaign's are time, energy"):
        check_preference(Preference("power"), [TIME, ENERGY])
    with pytest.raises(SpecError, match="this campaign has one objective"):
        check_preference(Preference("time"), [TIME])
    check_preference(Preference("energy", within=5), [TIME, ENERGY])
