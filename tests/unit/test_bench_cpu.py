"""The benchmarks' CPU meter: per-trial milliseconds by role over a window, and the idle cores."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fleet.bench.cpu import OTHER, CpuMeter
from fleet.bench.scale import cpu_use


def made_up(samples: list[tuple[float, dict[str, float], float]]) -> CpuMeter:
    meter = CpuMeter()
    meter.samples = samples
    return meter


def test_a_window_between_samples_counts_its_share_of_each_span() -> None:
    # The worker spends 0.5 s of CPU a second, the database 0.25; one of two cores is idle.
    meter = made_up(
        [(float(t), {"worker": 0.5 * t, "database": 0.25 * t, OTHER: 0.1 * t}, 1.0 * t) for t in range(0, 11)]
    )

    # 2.5 s to 6.5 s: 100 trials.
    window = meter.window(2.5, 6.5, 100)

    assert window is not None
    assert window["cpu_ms_per_trial"] == {"worker": 20.0, "database": 10.0, OTHER: 4.0}
    assert window["fleet_cpu_ms_per_trial"] == 30.0  # what else ran on the machine is not the fleet's
    assert window["idle_cores"] == 1.0


def test_a_cost_that_doubles_shows_in_its_role_and_idle_cores_in_waiting() -> None:
    # The database's cost per second doubles after 10 s; the rate of trials halves, so the cores idle.
    samples = []
    for t in range(21):
        database = 0.5 * t if t <= 10 else 5 + 0.5 * (t - 10)
        idle = 0.5 * t if t <= 10 else 5 + 1.0 * (t - 10)
        samples.append((float(t), {"database": database}, idle))
    finished = [n / 100 for n in range(1000)] + [10 + n / 50 for n in range(500)]

    use = cpu_use(made_up(samples), finished, window=200)

    first, last = use["first"], use["last"]
    assert first["cpu_ms_per_trial"]["database"] == pytest.approx(5.0, rel=0.01)
    assert last["cpu_ms_per_trial"]["database"] == pytest.approx(10.0, rel=0.01)
    assert (first["idle_cores"], last["idle_cores"]) == (0.5, 1.0)


def test_no_figures_for_a_window_the_samples_do_not_cover() -> None:
    meter = made_up([(float(t), {"worker": 0.1 * t}, 0.0) for t in range(5, 10)])

    assert meter.window(1.0, 6.0, 10) is None
    assert meter.window(6.0, 12.0, 10) is None
    assert meter.window(6.0, 8.0, 10) is not None


def test_a_role_watched_later_counts_from_zero_before_it_appeared() -> None:
    meter = made_up([(0.0, {"worker": 0.0}, 0.0), (1.0, {"worker": 1.0, "driver": 0.5}, 0.0)])

    window = meter.window(0.0, 1.0, 10)

    assert window is not None
    assert window["cpu_ms_per_trial"] == {"worker": 100.0, "driver": 50.0}


def test_a_busy_process_in_its_own_session_counts_under_its_role() -> None:
    busy = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
    meter = CpuMeter(every=0.2).start()
    try:
        child = subprocess.Popen([sys.executable, "-c", busy], start_new_session=True)
        meter.watch("worker", child.pid)
        child.wait(30)
        time.sleep(0.3)  # a sample after it ended: an exited process keeps the seconds it was last seen with
    finally:
        meter.close()

    start, end = meter.samples[0][0], meter.samples[-1][0]
    window = meter.window(start, end, 1)

    assert window is not None
    # Its CPU seen before it exited: most of its 1 s, and never more than the whole run's.
    assert 500 <= window["cpu_ms_per_trial"]["worker"] <= 1000 * (end - start)
    assert window["fleet_cpu_ms_per_trial"] == window["cpu_ms_per_trial"]["worker"]
