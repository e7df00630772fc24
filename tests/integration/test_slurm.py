"""``fleet slurm`` against a real Slurm (munged, slurmctld, two slurmds with two fake GPUs each), real workers,
Redis and PostgreSQL: jobs start workers on the GPUs Slurm allocated, drain before their wall time, are scaled by
queue depth, and a job that ends mid-campaign costs no trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.ops.slurm_cluster import SlurmCluster, missing, new_cluster, remove
from fleet.store import Measurement, Trial
from tests.conftest import Fleet, write_spec

RUN = """import json, os, sys, time
time.sleep(float(sys.argv[2]))
print(json.dumps({"score": int(sys.argv[1]), "device": int(os.environ["CUDA_VISIBLE_DEVICES"])}))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    assert not missing(), f"{', '.join(missing())} missing: run scripts/install-services"
    started = new_cluster(nodes=2, gpus_per_node=2)
    try:
        yield started.start()
    finally:
        remove(started)


@pytest.fixture
def slurm_fleet(fleet: Fleet, cluster: SlurmCluster) -> Iterator[Fleet]:
    """The test's fleet on target sm_90, Slurm's commands pointed at the cluster; its jobs cancelled after it."""
    fleet.target = "sm_90"
    fleet.env.update(cluster.env)
    (fleet.home / "run.py").write_text(RUN)
    yield fleet
    jobs = cluster.live_jobs()
    if jobs:
        cluster.run("scancel", *jobs)
    fleet.wait_for(lambda: not cluster.live_jobs(), timeout=30, what="the test's jobs to end")


def spec(fleet: Fleet, count: int, seconds: float) -> Path:
    return write_spec(
        fleet.home,
        {
            "name": "slurm",
            "target": "sm_90",
            "problems": [{"kind": "slurm", "params": {}}],
            "space": {"knobs": {"x": {"values": list(range(count)), "build": False}}},
            "workload": {
                "kind": "command",
                "sources": ["run.py"],
                "run": [sys.executable, "run.py", "{x}", str(seconds)],
                "objective": {"json": "score"},
                "repeats": 1,
            },
        },
    )


def live_eval_workers(fleet: Fleet) -> list:
    return fleet.store.workers(target="sm_90", role="eval", within=2)


def assert_each_once(fleet: Fleet, count: int) -> None:
    with fleet.store.session() as session:
        trials = list(session.scalars(select(Trial)))
        measured = dict(
            session.execute(select(Measurement.trial_id, func.count()).group_by(Measurement.trial_id)).all()
        )
    assert len(trials) == count
    assert sorted(t.config["x"] for t in trials) == list(range(count))  # none lost, none tried twice
    assert all(t.state == "evaluated" for t in trials), sorted((t.id, t.state) for t in trials)
    assert all(measured.get(t.id) == 1 for t in trials), measured


def test_jobs_run_workers_on_their_allocated_gpus_with_no_secret_in_sight(
    slurm_fleet: Fleet, cluster: SlurmCluster
) -> None:
    fleet = slurm_fleet
    hostile = "a \"b\" #c $(touch pwned) `x` \\ 'd'"
    shown = fleet.cli("slurm", "submit", "--target", "sm_90", "--time", "10", "--print", "--", f"--comment={hostile}")
    assert shown.returncode == 0, shown.stderr
    password = fleet.env["FLEET_DATABASE_URL"]
    assert password not in shown.stdout and "#SBATCH --signal=TERM@150" in shown.stdout

    done = fleet.cli(
        "slurm", "submit", "--target", "sm_90", "--time", "10", "--jobs", "2", "--", f"--comment={hostile}"
    )
    assert done.returncode == 0, done.stderr
    ids = [line.split()[2] for line in done.stdout.splitlines()]
    assert len(ids) == 2
    assert f"Comment={hostile}" in cluster.run("scontrol", "show", "job", ids[0])  # sbatch read it back intact
    fleet.wait_for(lambda: len(live_eval_workers(fleet)) == 2, timeout=60, what="two Slurm-launched workers")

    done = fleet.cli("tune", str(spec(fleet, 12, 0)), "--json", check=True, timeout=120)
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 12}
    assert_each_once(fleet, 12)
    workers = {w.name: w for w in live_eval_workers(fleet)}
    allocations = {job: cluster.allocation(job) for job in ids}
    with fleet.store.session() as session:
        rows = session.execute(select(Measurement.worker, Measurement.metrics)).all()
    for worker, metrics in rows:
        node, _, job = worker.split("@")[1].partition(".slurm-")
        assert job in ids, worker  # registered under its Slurm job
        assert metrics["device"] in allocations[job][node], (worker, metrics, allocations)  # its own GPU only
    for worker in workers.values():
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes()
        assert b"FLEET_DATABASE_URL=" not in environ and b"FLEET_BROKER_URL=" not in environ
        assert b"FLEET_DATABASE_URL_FILE=" in environ
    secret = Path(fleet.home / ".fleet" / "slurm" / "secrets" / "fleet_database_url")
    assert secret.stat().st_mode & 0o777 == 0o600
    assert not (fleet.home / "pwned").exists()


def test_a_job_array_runs_each_element_as_a_job_of_its_own(slurm_fleet: Fleet, cluster: SlurmCluster) -> None:
    fleet = slurm_fleet
    done = fleet.cli("slurm", "submit", "--target", "sm_90", "--time", "10", "--array", "2", check=True)
    assert "(fleet-sm_90: 2 jobs of 1 node(s) x 1 GPU(s))" in done.stdout, done.stdout
    array = done.stdout.split()[3]
    fleet.wait_for(lambda: len(live_eval_workers(fleet)) == 2, timeout=60, what="the array's two workers")
    elements = {}
    for worker in live_eval_workers(fleet):
        node, _, element = worker.name.split("@")[1].partition(".slurm-")
        gpu = int(worker.name.split("-")[1].removeprefix("gpu"))
        assert gpu in cluster.allocation(element)[node], (worker.name, cluster.allocation(element))  # its own GPU
        elements[element] = worker.name
    assert sorted(elements) == [f"{array}_0", f"{array}_1"]  # registered as squeue and scancel name them
    cluster.run("scancel", "--signal=TERM", f"{array}_1")  # one element alone drains, as scaling cancels it
    fleet.wait_for(lambda: len(live_eval_workers(fleet)) == 1, timeout=60, what="the cancelled element to drain")
    assert [w.name for w in live_eval_workers(fleet)] == [elements[f"{array}_0"]]


def test_user_mistakes_are_one_line(slurm_fleet: Fleet) -> None:
    for args, says in (
        (["--time", "soon"], "--time 'soon'"),
        (["--time", "1", "--drain", "60"], "--drain 60"),
        (["--partition", "gpu; rm"], "not a Slurm partition name"),
        (["--print", "--", "qos=high"], "starts with '-'"),
        (["--print", "--", "--comment=a\nb"], "control character"),
        (["--print", "--array", "0-3"], "--array '0-3': expected a count of jobs"),
    ):
        done = slurm_fleet.cli("slurm", "submit", "--target", "sm_90", *args)
        assert done.returncode == 1, (args, done.stdout)
        assert done.stderr.count("\n") == 1 and says in done.stderr, (args, done.stderr)


def test_a_database_or_broker_the_nodes_cannot_share_is_refused_before_submitting(
    slurm_fleet: Fleet, cluster: SlurmCluster
) -> None:
    sqlite = f"sqlite:///{slurm_fleet.home / 'fleet.db'}"
    for env, says in (
        ({"FLEET_DATABASE_URL": sqlite}, "FLEET_DATABASE_URL is a SQLite file"),
        ({"FLEET_BROKER_URL": "filesystem://"}, "FLEET_BROKER_URL is kombu's filesystem transport"),
    ):
        for command in (["submit"], ["scale", "--max", "2", "--once"]):
            done = slurm_fleet.cli("slurm", *command, "--target", "sm_90", env=env)
            assert done.returncode == 1, (env, command, done.stdout)
            assert done.stderr.count("\n") == 1 and says in done.stderr, (env, command, done.stderr)
            assert "Slurm's nodes cannot share it" in done.stderr
    assert not cluster.live_jobs()
    assert not (slurm_fleet.home / ".fleet" / "slurm" / "scripts").exists()  # nothing written, nothing submitted


def test_scaled_workers_survive_wall_time_and_scancel_then_scale_to_zero(
    slurm_fleet: Fleet, cluster: SlurmCluster
) -> None:
    """Scaling brings up jobs for a campaign; its jobs end at their wall time (0:30, draining 20 s
    before) and one is cancelled mid-trial; every trial is measured exactly once,
    and the jobs are gone soon after the campaign. The campaign (40 trials of 2 s on at most 2 workers) outlasts
    the first jobs' wall time, so that their end falls inside it however quickly the machine runs."""
    fleet = slurm_fleet
    scale = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "slurm", "scale", "--target", "sm_90", "--max", "2",
         "--time", "0:30", "--drain", "20", "--interval", "1", "--cooldown", "2"],
        env=fleet.env, cwd=fleet.home, stdout=(fleet.home / "scale.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    fleet.procs.append(scale)
    assert not cluster.live_jobs()
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec(fleet, 40, 2)), "--json", "--window", "2"],
        env=fleet.env, cwd=fleet.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    fleet.wait_for(lambda: live_eval_workers(fleet), timeout=30, what="scaling to start a worker")
    fleet.wait_for(
        lambda: fleet.store.workers(target="sm_90", role="eval") and _evaluating(fleet),
        timeout=30,
        what="a trial to be evaluating",
    )
    first = cluster.live_jobs()
    victim = first[0]
    cluster.run("scancel", victim)  # mid-trial, as a user or a preemption would
    try:
        _, err = tune.communicate(timeout=240)
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
    assert tune.returncode == 0, err
    assert all(job not in cluster.live_jobs() for job in first)  # the other first job ran out of wall time
    assert_each_once(fleet, 40)
    jobs = {w.name.partition(".slurm-")[2] for w in fleet.store.workers(target="sm_90", role="eval")}
    assert len(jobs) >= 3, jobs  # the cancelled job, and jobs that ran out of wall time, were replaced
    fleet.wait_for(lambda: not cluster.live_jobs(), timeout=60, what="scaling to zero after the campaign")
    fleet.stop(scale)
    assert "cancelled" in (fleet.home / "scale.log").read_text() or not cluster.live_jobs()


def test_scaling_counts_pending_array_elements_and_draining_jobs_and_does_not_over_submit(
    slurm_fleet: Fleet, cluster: SlurmCluster
) -> None:
    """Jobs of the target's name already there: one running whose whole minute of wall time lies within the
    scaler's --drain (it is draining), a pending array of two and a pending job. Six messages queued, --max 6:
    scaling submits two jobs, not five, then nothing more; with the queue empty it cancels the pending jobs and
    leaves the draining one to end by itself."""
    from kombu import Connection

    fleet = slurm_fleet
    script = fleet.home / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 120\n")
    common = ["sbatch", "--parsable", "--job-name=fleet-sm_90", "--gpus-per-node=1", f"--output={fleet.home}/%j.out"]
    draining = cluster.run(*common, "--time=1", str(script)).strip()
    cluster.run(*common, "--time=1", "--array=0-1", "--begin=now+3600", str(script))
    cluster.run(*common, "--time=1", "--begin=now+3600", str(script))
    fleet.wait_for(lambda: f"{draining}|RUNNING" in cluster.run("squeue", "--noheader", "--format=%i|%T"), timeout=30,
                   what="the draining job to run")  # fmt: skip
    with Connection(fleet.env["FLEET_BROKER_URL"]) as connection:
        queue = connection.SimpleQueue("eval.sm_90")
        for n in range(6):
            queue.put({"n": n})
        queue.close()

    # The scaler's jobs are held back too, so that no worker takes the queued messages.
    scale = ["slurm", "scale", "--target", "sm_90", "--max", "6", "--time", "1", "--drain", "59", "--cooldown", "0",
             "--once", "--", "--begin=now+3600"]  # fmt: skip
    first = fleet.cli(*scale, check=True).stdout
    assert "6 queued, campaign none, 4 jobs (3 pending, 1 draining): submitted" in first, first
    assert len(first.split("submitted ")[1].split(", ")) == 2, first
    second = fleet.cli(*scale, check=True).stdout
    assert "6 jobs (5 pending, 1 draining): steady" in second, second
    assert len(cluster.run("squeue", "--noheader", "--array", "--format=%i").split()) == 6

    with Connection(fleet.env["FLEET_BROKER_URL"]) as connection:
        connection.SimpleQueue("eval.sm_90").clear()
    assert "0 wanted; cancelling after 0 s" in fleet.cli(*scale, check=True).stdout
    said = fleet.cli(*scale, check=True).stdout
    cancelled = said.split("cancelled ")[1].split(", ")
    assert len(cancelled) == 5 and draining not in [c.strip() for c in cancelled], said
    fleet.wait_for(lambda: cluster.live_jobs() == [draining], timeout=30, what="only the draining job left")
    assert fleet.cli(*scale, check=True).stdout.endswith("1 jobs (0 pending, 1 draining): steady\n")


def _evaluating(fleet: Fleet) -> bool:
    with fleet.store.session() as session:
        return bool(session.scalar(select(func.count()).select_from(Trial).where(Trial.state == "evaluating")))
