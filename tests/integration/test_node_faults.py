"""A node's fault is the node's (issue 29): a worker whose disk fills up gives its trials back, says it is unhealthy,
and takes work again once the disk is freed; no trial is errored and no build remembered as failed for it.
A trial brought to a worker of another target is given back to its own queue. Real PostgreSQL, Redis, workers,
gcc, and a small tmpfs as the worker's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from fleet.store import Artifact, Trial
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def fill(folder: Path) -> Path:
    """A file that takes every free byte of ``folder``'s filesystem."""
    filler = folder / "filler"
    with open(filler, "wb") as file:
        try:
            while True:
                file.write(b"\0" * (64 << 10))
                file.flush()
        except OSError:
            pass
    return filler


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_hands_trials_back_and_the_node_heals_once_it_is_freed(fleet: Fleet, small_disk: Path) -> None:
    fleet.start_worker(env={"FLEET_CACHE_DIR": str(small_disk / "cache")})
    filler = fill(small_disk)
    spec = kernel_spec(fleet, space={"knobs": {"size": [2, 3], "scale": {"values": [1, 10], "build": False}}})
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(write_spec(fleet.home, spec)), "--json"],
        env=fleet.env,
        cwd=fleet.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The node says it is unhealthy, and why; the trials wait, none errored.
        fleet.wait_for(
            lambda: any(w.fault for w in fleet.store.workers(within=5)), timeout=120, what="the node to be unhealthy"
        )
        status = fleet.cli("status", check=True).stdout
        assert "unhealthy since" in status and "No space left on device" in status
        time.sleep(3)
        with fleet.store.session() as session:
            assert session.scalars(select(Trial).where(Trial.state == "errored")).all() == []
            assert session.scalars(select(Artifact).where(Artifact.state == "failed")).all() == []
        filler.unlink()
        out, err = tune.communicate(timeout=240)
    finally:
        if tune.poll() is None:
            tune.kill()
            tune.wait()
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 6}  # 4, and the baseline at both scales
    with fleet.store.session() as session:
        trials = session.scalars(select(Trial)).all()  # the baseline's too: they meet the full disk first
        artifacts = session.scalars(select(Artifact)).all()
    assert sum(t.node_faults for t in trials) >= 1  # counted as the node's ...
    assert all(t.attempts <= 1 for t in trials)  # ... and never as an attempt of the configuration
    assert {a.state for a in artifacts} == {"built"}  # rebuilt once the disk had room
    assert not any(w.fault for w in fleet.store.workers(within=5))  # healthy again


def test_a_trial_sent_to_a_worker_of_another_target_is_given_back_to_its_own_queue(fleet: Fleet) -> None:
    # A hand-made message: the trial is for another target than the only worker's.
    spec = kernel_spec(fleet, target="sm_90", space={"knobs": {"size": [2], "scale": [1]}}, baseline=None)
    del spec["baseline"]
    fleet.cli("tune", str(write_spec(fleet.home, spec)), "--detach", check=True)  # its trials wait on build.sm_90
    campaign = fleet.store.campaign("kernel")
    trial = fleet.store.trials(campaign.id)[0]
    fleet.start_worker()
    code = (
        "import sys; from fleet.tasks.trials import compile; "
        f"compile.apply_async(kwargs={{'target': '{fleet.target}', 'trial_ids': [{trial.id}]}}, "
        f"queue='build.{fleet.target}')"
    )
    subprocess.run([sys.executable, "-c", code], env=fleet.env, cwd=fleet.home, check=True, timeout=60)
    log = fleet.home / "worker.log"
    fleet.wait_for(lambda: "is for sm_90, not this worker's" in log.read_text(), timeout=60, what="the refusal")
    again = fleet.store.trial(trial.id)
    assert again.state == "new" and again.worker is None and again.attempts == 0 and again.node_faults == 0
    with fleet.store.session() as session:
        assert session.scalars(select(Artifact)).all() == []  # nothing built for it here
