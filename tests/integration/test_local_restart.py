"""Embedded mode restarts a worker process that died, as ``fleet worker`` does (issue 12): real processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.store import Store
from fleet.workers.gpus import cpu_target
from fleet.workers.launch import Launcher, WorkerSpec
from tests.conftest import Fleet, write_spec
from tests.integration.test_embedded import embedded_env
from tests.integration.test_faults import assert_each_recorded_once, script_spec, trials


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Fleet]:
    """An embedded installation under ``tmp_path`` (SQLite and a private broker), with short leases."""
    home = tmp_path / ".fleet"
    home.mkdir()
    # Leases of 3 s: the trial of a killed worker is given back in seconds, not a minute.
    env = embedded_env(tmp_path, FLEET_HOME=str(home), FLEET_LEASE_SECONDS="3")
    store = Store(f"sqlite:///{home / 'fleet.db'}")
    store.upgrade()  # as `fleet tune` would, but before the test looks at the tables
    installation = Fleet(env, store, tmp_path, cpu_target())
    yield installation
    installation.close()


def start(local: Fleet, *args: str, log: str) -> subprocess.Popen[bytes]:
    """Start ``fleet ARGS`` in its own process group, its output in ``log``; ``local.close`` stops it."""
    with (local.home / log).open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", *args],
            env=local.env,
            cwd=local.home,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    local.procs.append(proc)
    return proc


def eval_worker(local: Fleet) -> tuple[str, int]:
    worker = local.store.workers(role="eval")[0]
    return worker.name, worker.pid


def test_fleet_up_starts_a_killed_worker_again_and_stops_it_for_good(local: Fleet) -> None:
    up = start(local, "up", "--local", log="up.log")
    output = local.home / "up.log"
    local.wait_for(lambda: "fleet up:" in output.read_text(), timeout=120, what=f"fleet up to start ({output})")
    name, pid = eval_worker(local)

    os.killpg(pid, signal.SIGKILL)  # the Celery worker and its pool, as the OOM killer or a person would

    def beats_again() -> bool:
        return any(
            w.name == name and w.pid != pid and w.heartbeat_at > w.started_at for w in local.store.workers(within=2)
        )

    local.wait_for(beats_again, timeout=90, what=f"{name} to start again and beat its heart ({output})")
    local.stop(up, signal.SIGTERM)
    assert up.returncode == 0, output.read_text()
    text = output.read_text()
    assert text.count("starting it again") == 1, text
    assert f"{name} exited with status -9" in text
    # A deliberate stop is not a death: every worker said goodbye, and none was started after it.
    assert all(w.stopped_at is not None for w in local.store.workers()), local.store.workers()
    worker_log = next(local.home.glob(".fleet/logs/eval/**/*.log")).read_text()
    assert "restart 1: the last process exited with -9" in worker_log


def test_embedded_tune_finishes_after_its_eval_worker_is_killed_mid_evaluation(local: Fleet) -> None:
    spec = write_spec(local.home, script_spec(local, ["sleep4", "a", "bb"]))
    tune = start(local, "tune", str(spec), "--json", "--window", "1", log="tune.log")
    local.wait_for(
        lambda: any(t.state == "evaluating" and t.config["mode"] == "sleep4" for t in trials(local)),
        timeout=120,
        what="the slow trial to be evaluating",
    )

    os.killpg(eval_worker(local)[1], signal.SIGKILL)  # the only evaluation process: nobody else could measure

    assert tune.wait(120) == 0, (local.home / "tune.log").read_text()
    report = (local.home / "tune.log").read_text()
    assert json.loads(report[report.index("{") :])["problems"][0]["trials"] == {"evaluated": 3}
    slow = next(t for t in trials(local) if t.config["mode"] == "sleep4")
    assert slow.attempts == 2
    assert_each_recorded_once(local)


def test_a_worker_that_dies_at_once_is_started_again_with_growing_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Python itself cannot start with no standard library: the process exits at once, every time.
    broken = WorkerSpec("eval-broken@here", "eval", "cpu-x", 1, {"PYTHONHOME": str(tmp_path / "nowhere")})
    launcher = Launcher([broken], log_dir=tmp_path, restart_delay=0.05, quick_seconds=60, quick_deaths=4)
    caplog.set_level(logging.WARNING, logger="fleet.launch")

    launcher.start().supervise_in_background(poll=0.01)
    threading.Event().wait(2.0)
    launcher.stop()

    # Waits of 0.05, 0.1, 0.2, 0.4, 0.8 s...: a handful of restarts in 2 s, not hundreds.
    assert 3 <= launcher.restarts[broken.name] <= 6, launcher.restarts
    lines = [r.getMessage() for r in caplog.records]
    assert sum("4 times in a row" in line for line in lines) == 1, lines
    assert not any("5 times in a row" in line for line in lines)
    log = launcher.log_path(broken)
    assert log is not None and "restart 3: the last process exited with 1" in log.read_text()
