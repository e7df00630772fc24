"""The figures of ``fleet bench slurm`` (fleet/bench/slurm.py) read from Slurm's job completion log, and the verdict
on them. The run itself needs root and Slurm's daemons: tests/integration/test_bench_slurm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.bench.slurm import _jobs, _verdict
from fleet.ops.slurm_cluster import new_cluster


def test_the_job_completion_log_is_read_by_whole_lines_only(tmp_path: Path) -> None:
    cluster = new_cluster(1, 1, directory=tmp_path)
    assert cluster.ended_jobs() == []  # no job ended yet: no log
    cluster.job_log.parent.mkdir()
    cluster.job_log.write_text(
        "JobId=1 UserId=root(0) Name=fleet-sm_90 JobState=COMPLETED TimeLimit=1 NodeList=node1 ReservationName= \n"
        "JobId=2 UserId=root(0) Name=fleet-sm_90 JobSt"  # slurmctld is writing it
    )
    assert cluster.ended_jobs() == [
        {"JobId": "1", "UserId": "root(0)", "Name": "fleet-sm_90", "JobState": "COMPLETED", "TimeLimit": "1",
         "NodeList": "node1", "ReservationName": ""},
    ]  # fmt: skip


def test_jobs_drained_or_killed_at_their_wall_time_are_expiries_and_any_other_end_a_failure() -> None:
    ended = [{"JobState": state} for state in ("COMPLETED", "TIMEOUT", "COMPLETED", "FAILED", "NODE_FAIL")]
    assert _jobs(ended, ["7", "8"]) == {
        "expiries": 3,
        "jobs_failed": 2,
        "jobs_ended_by_state": {"COMPLETED": 2, "TIMEOUT": 1, "FAILED": 1, "NODE_FAIL": 1},
        "jobs": 7,
    }


def _figures(**changed: Any) -> dict[str, Any]:
    figures = {"lost": 0, "duplicated": 0, "wrong_valued": 0, "stuck": 0, "jobs_failed": 0, "not_on_slurm": 0,
               "expiries": 3, "driver_exit_status": 0, "first_trial_s": 9.5,
               "measured_by_node": {"node1": 70, "node2": 65, "node3": 65}}  # fmt: skip
    return figures | changed


def test_a_run_passes_with_nothing_lost_and_its_expiries_seen_and_meets_its_goals_besides() -> None:
    assert _verdict(_figures(), nodes=3, expiries=2) == {"ok": True, "goals_met": True}
    assert _verdict(_figures(first_trial_s=15.0), 3, 2) == {"ok": True, "goals_met": False}
    assert _verdict(_figures(measured_by_node={"node1": 200}), 3, 2) == {"ok": True, "goals_met": False}
    for failed in ({"duplicated": 1}, {"lost": 1}, {"jobs_failed": 1}, {"expiries": 1}, {"driver_exit_status": 1}):
        assert _verdict(_figures(**failed), 3, 2) == {"ok": False, "goals_met": False}, failed
    assert _verdict({}, 3, 2) == {"ok": False, "goals_met": False}  # a run that measured nothing
