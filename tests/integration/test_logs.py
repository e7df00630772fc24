"""Worker logs on real workers: where they are kept, rotation by size, and `fleet logs` with its options."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def logs_of(fleet: Fleet, directory: Path) -> dict[str, Path]:
    host = socket.gethostname()
    return {
        "eval": directory / "eval" / fleet.target / host / "eval-cpu0.log",
        "build": directory / "build" / fleet.target / host / f"build-{fleet.target}.log",
    }


def tune(fleet: Fleet, name: str, sizes: list[int]) -> list[int]:
    spec = kernel_spec(fleet, name=name)
    spec["space"] = {"knobs": {"size": sizes, "scale": {"values": [1], "build": False}}}
    del spec["baseline"]
    fleet.cli("tune", str(write_spec(fleet.home, spec, f"{name}.json")), "--json", check=True)
    return [t.id for t in fleet.store.trials(fleet.store.campaign(name).id)]


def test_each_worker_logs_under_role_target_host_and_fleet_logs_finds_a_trial(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "1")
    trials = tune(fleet, "logged", [2, 3])
    paths = logs_of(fleet, Path(fleet.env["FLEET_HOME"]) / "logs")
    assert all(p.is_file() for p in paths.values()), sorted(Path(fleet.env["FLEET_HOME"]).rglob("*.log"))
    for trial in trials:
        assert f"trial {trial} evaluate start" in paths["eval"].read_text()
        assert f"trial {trial} compile start" in paths["build"].read_text()
    # The launcher also copies its workers' output to its own (a service manager's journal gets it).
    assert f"trial {trials[0]} evaluate end: evaluated" in (fleet.home / "worker.log").read_text()

    listed = fleet.cli("logs", "--list", check=True).stdout
    assert str(paths["eval"]) in listed and str(paths["build"]) in listed

    shown = fleet.cli("logs", "--trial", str(trials[1]), check=True).stdout.splitlines()
    # Both workers that touched it, from the database; only the lines about that trial, each with its worker.
    assert {line.split(" | ")[0].split("@")[0] for line in shown} == {"eval-cpu0", f"build-{fleet.target}"}
    assert all(f"trial {trials[1]} " in line for line in shown)
    assert any(f"trial {trials[1]} evaluate end: evaluated" in line for line in shown)
    assert not any(f"trial {trials[0]} " in line for line in shown)

    tail = fleet.cli("logs", "--worker", "eval-cpu0", "--lines", "3", check=True).stdout
    assert tail.splitlines() == paths["eval"].read_text().splitlines()[-3:]

    missing = fleet.cli("logs", "--worker", "nosuch")
    assert missing.returncode == 1 and "no log of a worker 'nosuch'" in missing.stderr
    fresh = fleet.cli(
        "call", "evaluate", "-p", "kernel", "--config", '{"size": 9, "scale": 1}', "--no-send", check=True
    )
    unrun = fleet.cli("logs", "--trial", fresh.stdout.strip())
    assert unrun.returncode == 1 and "no worker has run trial" in unrun.stderr


def test_logs_rotate_by_size_and_trials_are_found_in_rotated_files(fleet: Fleet, tmp_path: Path) -> None:
    directory = tmp_path / "elsewhere"
    fleet.env |= {"FLEET_LOG_DIR": str(directory), "FLEET_LOG_MAX_BYTES": "1200", "FLEET_LOG_BACKUPS": "2"}
    fleet.start_worker("--build-procs", "1")
    trials = tune(fleet, "rotated", [2, 3, 4, 5, 6, 7])
    eval_log = logs_of(fleet, directory)["eval"]
    rotated = sorted(p.name for p in eval_log.parent.iterdir())
    assert rotated == ["eval-cpu0.log", "eval-cpu0.log.1", "eval-cpu0.log.2"]  # older ones were dropped
    assert all(p.stat().st_size <= 1200 for p in eval_log.parent.iterdir())
    whole = "".join((eval_log.parent / name).read_text() for name in reversed(rotated))
    assert f"trial {trials[-1]} evaluate end: evaluated" in whole

    shown = fleet.cli("logs", "--trial", str(trials[-2]), "--worker", "eval-cpu0", check=True).stdout
    assert f"trial {trials[-2]} evaluate start" in shown and f"trial {trials[-2]} evaluate end" in shown


def test_logs_follow_prints_new_lines(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "1")
    tune(fleet, "first", [2])
    follower = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "logs", "--worker", "eval-cpu0", "--lines", "0", "--follow"],
        env=fleet.env,
        cwd=fleet.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follower.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        done = fleet.cli(
            "call", "evaluate", "-p", "kernel", "--config", '{"size": 8, "scale": 1}', "--json", check=True
        )
        trial = json.loads(done.stdout)["trial"]
        seen: list[str] = []
        while not any(f"trial {trial} evaluate end" in line for line in seen):
            seen.append(lines.get(timeout=60))
        assert not any("trial 1 " in line for line in seen)  # --lines 0: nothing from before
    finally:
        os.killpg(follower.pid, signal.SIGTERM)
        follower.wait(30)
