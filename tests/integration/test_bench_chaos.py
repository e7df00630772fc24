"""``fleet bench chaos`` with small numbers: every kind of fault injected, every trial recorded once, rightly."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

FAULTS = {
    "pool_kills": 2,
    "worker_kills": 1,
    "node_kills": 1,
    "redis_restarts": 1,
    "postgres_restarts": 1,
    "driver_kills": 1,
    "skewed_nodes": 1,
}


def test_a_small_chaos_run_records_every_trial_once_with_its_right_value() -> None:
    options = [f"--{kind.replace('_', '-')}={count}" for kind, count in FAULTS.items()]
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "bench", "chaos", "--trials", "60", "--seconds", "0.2", *options, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["ok"] is True
    assert (result["trials_planned"], result["recorded"]) == (60, 60)
    assert [result[k] for k in ("lost", "duplicated", "stuck", "wrong_valued")] == [0, 0, 0, 0], result["examples"]
    assert result["states"] == {"evaluated": 60}
    assert {kind: result["faults"][kind] for kind in FAULTS} == FAULTS
    assert result["faults"]["processes_killed"] >= 2 + 2 + 3  # a pool process each, a worker's two, a node's
    assert result["faults_not_injected"] == {}
    assert result["stale_messages"]["trials_changed_by_their_delivery"] == 0
    assert result["stale_messages"]["still_queued_after_delivery"] == 0
    assert result["driver_exit_status"] == 0
    assert result["settings"]["build_procs"] >= 2 and result["settings"]["eval_procs"] >= 2
    assert "FLEET_REQUEUE_SECONDS" in result["settings"]
    assert result["wall_s"] > result["campaign_s"] > 0
    # Progress went to stderr as the run went, one line per fault among them.
    assert "fault 8/8" in done.stderr and "finished" in done.stderr
