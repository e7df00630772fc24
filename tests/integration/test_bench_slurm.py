"""``fleet bench slurm`` with small numbers (issue 40): one Slurm node, a job whose wall time ends mid-campaign and
its replacement by scaling; every figure reported, every trial recorded once with its right value."""

from __future__ import annotations

import json
import subprocess
import sys

from fleet.ops.slurm_cluster import missing
from tests.conftest import ROOT


def test_a_small_slurm_run_sees_a_wall_time_expiry_and_loses_and_duplicates_nothing() -> None:
    assert not missing(), f"{', '.join(missing())} missing: run scripts/install-services"
    # --time 1 --drain 30: Slurm warns the job at its first look at time limits, 30 s after slurmctld starts (just
    # before the submission); 14 runs of 2 s on one worker outlast that however quickly the machine runs. Its
    # replacement, of --time 5, is warned only after it has measured the rest however slowly the machine runs.
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "bench", "slurm", "--trials", "14", "--nodes", "1", "--seconds", "2",
         "--time", "1", "--drain", "30", "--scale-time", "5", "--expiries", "1", "--window", "2",
         "--timeout", "180", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,  # the bench's own --timeout first: it cleans up then
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["ok"] is True
    assert (result["trials_planned"], result["recorded"]) == (14, 14)
    assert [result[k] for k in ("lost", "duplicated", "stuck", "wrong_valued")] == [0, 0, 0, 0], result["examples"]
    assert result["states"] == {"evaluated": 14}
    assert result["expiries"] >= 1 and result["jobs_failed"] == 0, result["jobs_ended_by_state"]
    # The job that ended at its wall time was replaced, and its replacement measured the rest.
    assert result["jobs"] >= 2 and result["jobs_that_measured"] >= 2
    assert result["measured_by_node"] == {"node1": 14} and result["not_on_slurm"] == 0
    assert 0 < result["first_worker_s"] < result["first_trial_s"] < result["campaign_s"] < result["wall_s"]
    assert result["driver_exit_status"] == 0 and isinstance(result["goals_met"], bool)
    # Progress went to stderr as the run went.
    assert "submitted job" in done.stderr and "evaluated" in done.stderr
