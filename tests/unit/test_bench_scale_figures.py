"""``fleet bench scale``'s figures of campaigns run at once, from finish times made up to show each case."""

from __future__ import annotations

import pytest

from fleet.bench.scale import SpeedProbe, campaign_ends, machine_speed, rates


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


class Probe(SpeedProbe):
    """A probe whose samples are given: the machine twice as slow after 100 s (each loop twice the CPU time)."""

    def __init__(self) -> None:
        self.samples = [(float(t), 0.01 if t < 100 else 0.02) for t in range(200)]


def test_a_machine_half_as_fast_at_the_end_shows_beside_the_rates() -> None:
    finished = steady(0.0, 1000, 10.0) + steady(100.0, 500, 5.0)  # 10 trials/s, then 5

    assert rates(finished, 200)["last_over_first"] == pytest.approx(0.5, abs=0.01)
    assert machine_speed(Probe(), finished, window=200) == {"machine_speed_last_over_first": 0.5}


def test_no_speed_without_samples_in_a_window() -> None:
    probe = Probe()
    probe.samples = [(t, c) for t, c in probe.samples if t < 50]

    assert machine_speed(probe, steady(0.0, 1000, 10.0), window=200) == {"machine_speed_last_over_first": None}
