"""Faults the fleet meets, with real worker processes, Redis and PostgreSQL: each ends with every trial
recorded exactly once, never lost and never stuck."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from fleet.bench.partition import now
from fleet.ops.nodes import build_clock_library
from fleet.store import Measurement, Trial
from tests.conftest import ROOT, Fleet, write_spec


def script_spec(fleet: Fleet, modes: list[str], **workload: object) -> dict:
    """A campaign whose run-time knob says what each run does: print, sleep first, or kill its worker."""
    shutil.copy(ROOT / "tests" / "data" / "poison.py", fleet.home / "poison.py")
    return {
        "name": "faults",
        "target": fleet.target,
        "problems": [{"kind": "script", "params": {}}],
        "space": {"knobs": {"mode": {"values": modes, "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["poison.py"],
            "run": [sys.executable, "poison.py", "{mode}"],
            "objective": {"json": "score"},
            "repeats": 1,
            **workload,
        },
    }


def trials(fleet: Fleet) -> list[Trial]:
    with fleet.store.session() as session:
        return list(session.scalars(select(Trial).order_by(Trial.id)))


def measurement_counts(fleet: Fleet) -> dict[int, int]:
    with fleet.store.session() as session:
        rows = session.execute(select(Measurement.trial_id, func.count()).group_by(Measurement.trial_id)).all()
    return dict(rows)


def start_tune(fleet: Fleet, spec_path: object, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec_path), "--json", *args],
        env=fleet.env,
        cwd=fleet.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def assert_each_recorded_once(fleet: Fleet) -> None:
    counts = measurement_counts(fleet)
    for trial in trials(fleet):
        assert trial.state in ("evaluated", "errored", "invalid"), (trial.id, trial.state)
        expected = 1 if trial.state == "evaluated" else 0
        assert counts.get(trial.id, 0) == expected, (trial.id, trial.state, counts.get(trial.id))


def test_worker_killed_mid_evaluation_is_measured_again_once(fleet: Fleet) -> None:
    fleet.start_worker()
    spec = write_spec(fleet.home, script_spec(fleet, ["sleep4", "a", "bb"]))
    tune = start_tune(fleet, spec, "--window", "1")
    fleet.wait_for(
        lambda: any(t.state == "evaluating" and t.config["mode"] == "sleep4" for t in trials(fleet)),
        what="the slow trial to be evaluating",
    )
    victim = fleet.store.workers(target=fleet.target, role="eval")[0]

    os.killpg(victim.pid, signal.SIGKILL)  # the Celery worker and its pool process, mid-measurement

    out, err = tune.communicate(timeout=120)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 3}
    slow = next(t for t in trials(fleet) if t.config["mode"] == "sleep4")
    assert slow.attempts == 2
    assert_each_recorded_once(fleet)


def test_build_failure_and_run_timeout_are_errored_and_the_worker_goes_on(fleet: Fleet) -> None:
    fleet.start_worker()
    spec = script_spec(fleet, ["sleep30", "ok"], run_timeout=1)
    spec["space"]["knobs"]["flag"] = ["-O1", "-Onope"]
    spec["workload"]["build"] = ["gcc", "{flag}", "-x", "c", "/dev/null", "-c", "-o", "empty.o"]
    path = write_spec(fleet.home, spec)

    done = fleet.cli("tune", str(path), "--json", check=True, timeout=120)

    by_config = {(t.config["flag"], t.config["mode"]): t for t in trials(fleet)}
    assert by_config[("-O1", "ok")].state == "evaluated"
    assert by_config[("-O1", "sleep30")].state == "errored"
    # The time it ran, which a loaded machine stretches past the 1 s limit before the kill lands.
    assert re.search(r"timed out after 1\.\d s", by_config[("-O1", "sleep30")].reason or "")
    for mode in ("ok", "sleep30"):
        failed = by_config[("-Onope", mode)]
        assert failed.state == "errored"
        assert failed.reason.startswith("build failed: the build exited with status 1")
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"errored": 3, "evaluated": 1}
    assert_each_recorded_once(fleet)


def test_a_trial_that_kills_its_worker_every_time_is_errored_after_bounded_attempts(fleet: Fleet) -> None:
    # Without the sandbox, where a workload can kill its worker (as a crash of the worker would).
    fleet.start_worker(env={"FLEET_SANDBOX": "none"})
    spec = write_spec(fleet.home, script_spec(fleet, ["kill", "ok"]))

    done = fleet.cli("tune", str(spec), "--json", check=True, timeout=180)

    poison = next(t for t in trials(fleet) if t.config["mode"] == "kill")
    assert poison.state == "errored"
    assert "lost its worker 3 times" in poison.reason
    assert poison.attempts == 3
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"errored": 1, "evaluated": 1}
    assert_each_recorded_once(fleet)


def test_work_claimed_by_a_vanished_worker_is_given_back_by_its_lease(fleet: Fleet) -> None:
    spec = write_spec(fleet.home, script_spec(fleet, ["a", "bb"]))
    tune = start_tune(fleet, spec, "--detach")
    assert tune.wait(60) == 0
    first = trials(fleet)[0]
    # A worker that claimed the trial and then vanished without a trace: only its lease is left.
    assert fleet.store.claim(first.id, "compile", "ghost@nowhere/1", 1.0, 3) is not None

    fleet.start_worker()

    fleet.wait_for(
        lambda: all(t.state == "evaluated" for t in trials(fleet)), timeout=60, what="every trial to be evaluated"
    )
    assert_each_recorded_once(fleet)


def test_killed_driver_is_resumed_without_measuring_anything_twice(fleet: Fleet) -> None:
    fleet.start_worker()
    modes = [f"sleep0.{i}" for i in range(1, 10)]
    spec = write_spec(fleet.home, script_spec(fleet, modes))
    tune = start_tune(fleet, spec, "--window", "2")
    fleet.wait_for(lambda: sum(t.state == "evaluated" for t in trials(fleet)) >= 3, what="three evaluations")
    os.killpg(tune.pid, signal.SIGKILL)
    tune.wait()

    done = fleet.cli("resume", "faults", "--json", check=True, timeout=120)

    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 9}
    assert len(trials(fleet)) == 9
    assert_each_recorded_once(fleet)


def test_redis_restart_mid_campaign_loses_nothing(fleet: Fleet, redis_server: object) -> None:
    fleet.start_worker(env={"FLEET_REQUEUE_SECONDS": "5"})
    modes = [f"sleep0.{i}" for i in range(1, 10)]
    spec = write_spec(fleet.home, script_spec(fleet, modes))
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec), "--json", "--window", "3"],
        env={**fleet.env, "FLEET_REQUEUE_SECONDS": "5"},
        cwd=fleet.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    fleet.wait_for(lambda: sum(t.state == "evaluated" for t in trials(fleet)) >= 2, what="two evaluations")

    redis_server.kill()  # type: ignore[attr-defined]
    time.sleep(2)
    redis_server.start()  # type: ignore[attr-defined]

    out, err = tune.communicate(timeout=180)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 9}
    assert_each_recorded_once(fleet)


def test_driver_and_status_say_when_no_worker_listens(fleet: Fleet) -> None:
    spec = write_spec(fleet.home, script_spec(fleet, ["a"]))
    tune = start_tune(fleet, spec)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "no worker is listening" not in line:
            line = tune.stderr.readline()  # type: ignore[union-attr]
        assert f"no worker is listening on eval.{fleet.target}" in line
        status = fleet.cli("status", check=True)
        assert f"warning: no worker is listening on eval.{fleet.target}: 1 trials wait" in status.stdout
    finally:
        os.killpg(tune.pid, signal.SIGKILL)
        tune.wait()


def test_a_dynamic_campaign_survives_its_driver_and_measures_nothing_twice(fleet: Fleet) -> None:
    fleet.start_worker()
    spec = script_spec(fleet, [f"sleep0.{i}" for i in range(1, 10)] + ["a", "bb", "ccc"])
    spec["strategy"] = {"name": "local", "budget": 10, "seed": 5}
    path = write_spec(fleet.home, spec)
    tune = start_tune(fleet, path)
    fleet.wait_for(lambda: sum(t.state == "evaluated" for t in trials(fleet)) >= 3, what="three evaluations")
    os.killpg(tune.pid, signal.SIGKILL)
    tune.wait()
    before = {t.id for t in trials(fleet) if t.state == "evaluated"}

    done = fleet.cli("resume", "faults", "--json", check=True, timeout=180)

    result = json.loads(done.stdout)["problems"][0]
    assert sum(result["trials"].values()) <= 10
    assert before <= {t.id for t in trials(fleet) if t.state == "evaluated"}
    assert_each_recorded_once(fleet)


def test_a_worker_whose_clock_runs_two_minutes_ahead_takes_no_live_lease(fleet: Fleet) -> None:
    # Its reaper and its claims compare leases on the database's clock: on its own, every lease the other
    # worker holds (3 s long, renewed while it measures) would look two minutes expired.
    fleet.start_worker()
    fleet.start_worker(env={"FLEET_TEST_CLOCK_SKEW": "120", "FLEET_NODE_NAME": "ahead"}, log="ahead.log")
    spec = write_spec(fleet.home, script_spec(fleet, ["sleep4", "sleep4.0", "sleep4.00", "sleep4.000"]))
    done = fleet.cli("tune", str(spec), "--json", "--window", "4", check=True, timeout=300)
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 4}
    assert [t.attempts for t in trials(fleet)] == [1, 1, 1, 1]  # never taken from the worker measuring it
    assert_each_recorded_once(fleet)


def test_a_worker_whose_wall_clock_jumps_back_two_minutes_while_it_measures_keeps_its_leases(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Issue 39's nemesis found it: a worker's pool process read the database's clock as its own wall clock plus the
    # offset measured when it started, so a step of the wall clock went into every lease it renewed. Two minutes
    # behind, its leases were already expired when renewed, and the other worker's reaper took its trials away.
    clock = tmp_path / "clock"
    clock.write_text("0\n")
    jumps = {"LD_PRELOAD": str(build_clock_library(tmp_path / "clockjump.so")), "FLEET_CLOCK_FILE": str(clock)}
    fleet.start_worker(env=jumps | {"FLEET_NODE_NAME": "jumps"}, log="jumps.log")
    spec = write_spec(fleet.home, script_spec(fleet, ["sleep4", "sleep4.0", "sleep4.00", "sleep4.000"]))
    tune = start_tune(fleet, spec, "--window", "4")
    fleet.wait_for(
        lambda: any(t.state == "evaluating" and "jumps" in (t.worker or "") for t in trials(fleet)),
        timeout=60,
        what="the jumping worker to measure",
    )
    clock.write_text("-120\n")
    fleet.start_worker()  # its reaper sees every lease the jumping worker renews from now on
    out, err = tune.communicate(timeout=300)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 4}
    assert [t.attempts for t in trials(fleet)] == [1, 1, 1, 1]  # never taken from the worker measuring it
    assert_each_recorded_once(fleet)
    # Each trial's times on the database's clock, whatever the jumping worker's wall clock said.
    end = now(fleet.store)
    assert all(t.started_at and t.finished_at and t.started_at <= t.finished_at <= end for t in trials(fleet))
