"""``fleet bench pipeline --quick``: one tiny case, as the fleet runs it and in the MITuna order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fleet.bench.pipeline import QUICK_CASES
from tests.conftest import ROOT


def test_one_tiny_case_gives_both_makespans_and_neither_beats_its_bound() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "bench", "pipeline", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    (case,) = result["cases"]
    (shape,) = QUICK_CASES
    assert case["trials"] == shape.trials and case["bound_s"] == round(shape.bound_s, 2)
    # Sleeps cannot be beaten: the measured makespans are at least what the schedules allow (clocks to 5%).
    assert case["fleet_s"] >= 0.95 * case["bound_s"]
    assert case["mituna_build_phase_s"] >= 0.95 * shape.builds * shape.build_s / shape.build_slots
    assert case["mituna_eval_phase_s"] >= 0.95 * shape.trials * shape.run_s / shape.eval_slots
    # Each figure is rounded to 10 ms on its own.
    assert case["mituna_s"] == pytest.approx(case["mituna_build_phase_s"] + case["mituna_eval_phase_s"], abs=0.02)
    # What each build and run took beyond its sleep: the fleet's cost per task, never much below nothing.
    assert case["build_overhead_s"] > -0.05 and case["eval_overhead_s"] > -0.05
    # Nor is either wildly off: a few seconds of sleeps take seconds, not minutes.
    assert case["fleet_over_bound"] < 5 and case["mituna_over_bound"] < 5
    assert result["met"] is (case["fleet_over_bound"] <= 1.1)
    assert "case 1/1" in done.stderr and "MITuna order" in done.stderr
