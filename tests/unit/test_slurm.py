"""fleet.ops.slurm's pure parts: Slurm's time formats, #SBATCH quoting, the GPUs a task was given, jobs wanted."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.ops import slurm
from fleet.ops.slurm import (
    Scaler,
    SlurmError,
    SlurmJob,
    SlurmJobState,
    allocated_gpus,
    node_name,
    parse_time,
    sbatch_quote,
    script,
    seconds_left,
    shared_services,
    wanted,
)
from fleet.settings import Settings


def test_times_as_sbatch_reads_them() -> None:
    assert [parse_time(t) for t in ("90", "0:30", "4:00:00", "1-12", "1-0:0:5")] == [5400, 30, 14400, 129600, 86405]
    with pytest.raises(SlurmError, match="--time 'x'"):
        parse_time("x")


def test_sbatch_quoting_keeps_quotes_hashes_and_backslashes() -> None:
    assert sbatch_quote('a "b" #c \\d') == '"a \\"b\\" \\#c \\\\d"'
    with pytest.raises(SlurmError, match="control character"):
        sbatch_quote("a\nb")


def test_allocated_gpus_the_most_specific_variable_first() -> None:
    assert allocated_gpus({"CUDA_VISIBLE_DEVICES": "1,3", "SLURM_JOB_GPUS": "5,7"}) == "1,3"
    assert allocated_gpus({"ROCR_VISIBLE_DEVICES": "2"}) == "2"
    assert allocated_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "0"}) == "0"
    with pytest.raises(SlurmError, match="allocated no GPU"):
        allocated_gpus({})


def test_jobs_wanted_follow_the_queue_within_bounds() -> None:
    assert wanted(0, False, 4, 0, 3) == 0
    assert wanted(0, True, 4, 0, 3) == 1  # a campaign runs: one job, whose workers its driver feeds
    assert wanted(9, True, 4, 0, 3) == 3
    assert wanted(100, True, 4, 0, 3) == 3
    assert wanted(0, False, 4, 2, 3) == 2


def test_drain_defaults_to_a_quarter_of_a_short_wall_time() -> None:
    assert SlurmJob("sm_90", time="4:00:00").drain_seconds() == 300
    assert SlurmJob("sm_90", time="1").drain_seconds() == 15
    with pytest.raises(SlurmError, match="--drain 60"):
        SlurmJob("sm_90", time="1", drain=60).drain_seconds()


def test_services_the_nodes_cannot_share_are_refused() -> None:
    def shared(**env: str) -> str | None:
        return shared_services(Settings.from_env({"FLEET_HOME": "/nowhere", **env}))

    postgres, redis = "postgresql://fleet:pw@db.example:5432/fleet", "redis://:pw@redis.example:6379/0"
    assert shared(FLEET_DATABASE_URL=postgres, FLEET_BROKER_URL=redis) is None
    for env, says in (
        ({"FLEET_BROKER_URL": redis}, "no FLEET_DATABASE_URL (or FLEET_DATABASE_URL_FILE) is set, so the database"),
        ({"FLEET_DATABASE_URL": "sqlite:////nfs/fleet.db", "FLEET_BROKER_URL": redis}, "a SQLite file (/nfs/"),
        ({"FLEET_DATABASE_URL": postgres}, "no FLEET_BROKER_URL (or FLEET_BROKER_URL_FILE) is set"),
        ({"FLEET_DATABASE_URL": postgres, "FLEET_BROKER_URL": "filesystem://"}, "kombu's filesystem transport"),
    ):
        with pytest.raises(SlurmError, match="Slurm's nodes cannot share it") as raised:
            shared(**env)
        assert says in str(raised.value) and "pw" not in str(raised.value)
    # Reached only from this machine: fine for a Slurm on one host, so a warning, not a refusal.
    warned = shared(FLEET_DATABASE_URL="postgresql://fleet:pw@127.0.0.1/fleet", FLEET_BROKER_URL=redis)
    assert warned == "warning: FLEET_DATABASE_URL names 127.0.0.1: only jobs that run on this machine reach it"
    warned = shared(FLEET_DATABASE_URL=postgres, FLEET_BROKER_URL="redis+socket:///run/redis.sock?virtual_host=0")
    assert warned is not None and "FLEET_BROKER_URL names a unix socket" in warned


def test_time_left_as_squeue_prints_it() -> None:
    assert [seconds_left(t) for t in ("0:05", "29:55", "1:00:00", "2-03:04:05", "7")] == [5, 1795, 3600, 183845, 7]
    assert seconds_left("UNLIMITED") is None and seconds_left("NOT_SET") is None and seconds_left("") is None


def test_scaling_counts_pending_and_draining_jobs_and_cancels_no_serving_job_for_a_draining_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = [
        SlurmJobState("10", "RUNNING"),
        SlurmJobState("11", "RUNNING", draining=True),
        SlurmJobState("12_0", "PENDING"),
    ]
    cancelled: list[str] = []
    submitted: list[str] = []
    monkeypatch.setattr(slurm, "jobs", lambda job, signalled=frozenset(): live)
    monkeypatch.setattr(slurm, "cancel", lambda state: cancelled.append(state.id))
    scaler = Scaler(
        SlurmJob("sm_90"), 0, 8, 0, tmp_path / "scale.json", submit_job=lambda: submitted.append("x") or "13"
    )
    said = scaler.step(3, True, now=0)
    assert said == "sm_90: 3 queued, campaign running, 3 jobs (1 pending, 1 draining): steady" and not submitted
    assert scaler.step(4, True, now=1).endswith("submitted 13")  # one more than the three there are
    # Two wanted: the draining job is the one too many, and it is leaving by itself.
    assert scaler.step(2, True, now=2).endswith(": steady") and not cancelled
    # One wanted: after the cool-down, the pending job goes, not the running one that serves.
    assert "cancelling after 0 s" in scaler.step(1, True, now=3)
    assert scaler.step(1, True, now=4).endswith("cancelled 12_0") and cancelled == ["12_0"]


def test_a_job_array_in_the_script_and_in_its_workers_names(tmp_path: Path) -> None:
    text = script(SlurmJob("sm_90", time="1:00:00", array="8%2"), env={}, output=tmp_path, python="/usr/bin/python3")
    assert "#SBATCH --array=0-7%2\n" in text and "a job array of 8 jobs" in text
    assert f'#SBATCH --output="{tmp_path}/%x-%A_%a.out"' in text  # one log per element
    single = script(SlurmJob("sm_90", time="1:00:00"), env={}, output=tmp_path, python="/usr/bin/python3")
    assert "--array" not in single and "%x-%j.out" in single
    for wrong in ("0-7", "0", "x", "4%0"):
        with pytest.raises(SlurmError, match=f"--array '{wrong}'"):
            SlurmJob("sm_90", array=wrong).check()
    # An element registers as squeue and scancel name it, not by the job id Slurm gave it underneath.
    element = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "15", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3"}
    assert node_name(element) == "n1.slurm-12_3"
    assert node_name({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "15"}) == "n1.slurm-15"
