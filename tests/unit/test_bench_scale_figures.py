"""``fleet bench scale``'s figures of campaigns run at once, from finish times made up to show each case."""

from __future__ import annotations

import pytest

from fleet.bench.scale import campaign_ends, rates


def steady(start: float, count: int, per_second: float) -> list[float]:
    return [start + n / per_second for n in range(count)]


def test_campaigns_that_go_evenly_all_run_in_the_last_window() -> None:
    # Two campaigns of 1,000 trials at 50 trials/s each: they end together.
    times = {1: steady(0.0, 1000, 50.0), 2: steady(0.01, 1000, 50.0)}

    ends = campaign_ends(times, window=200)

    assert ends["campaign_end_s"] == [20.0, 20.0]
    assert ends["campaigns_running_in_last_window"] == 2
    assert ends["slowest_campaign_when_first_ended"] == pytest.approx(1.0, abs=0.002)
    assert ends["last_over_first_while_all_ran"] == pytest.approx(1.0, abs=0.01)


def test_a_campaign_that_ends_early_leaves_the_last_window_to_the_other() -> None:
    # The fleet's rate is the same throughout (100 trials/s): 2 got three quarters of it until 1 ended.
    fast = steady(0.0, 1500, 75.0)  # ends at 20 s
    slow = steady(0.0, 500, 25.0) + steady(20.0, 1000, 100.0)  # alone after 20 s, until 30 s
    ends = campaign_ends({1: slow, 2: fast}, window=400)

    assert ends["campaign_end_s"] == [20.0, 30.0]
    assert ends["campaigns_running_in_last_window"] == 1
    assert ends["slowest_campaign_when_first_ended"] == pytest.approx(0.333, abs=0.001)
    assert ends["last_over_first_while_all_ran"] == pytest.approx(1.0, abs=0.01)
    assert rates(sorted(fast + slow), 400)["last_over_first"] == pytest.approx(1.0, abs=0.01)


def test_no_ratio_while_all_ran_when_the_first_ends_within_two_windows() -> None:
    times = {1: steady(0.0, 100, 10.0), 2: steady(0.0, 1000, 10.0)}

    ends = campaign_ends(times, window=200)

    assert ends["last_over_first_while_all_ran"] is None
    assert ends["slowest_campaign_when_first_ended"] == pytest.approx(0.1, abs=0.001)
