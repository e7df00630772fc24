"""The GPU's clock as a knob, end to end: an embedded `fleet tune` on a node whose only GPU is a fake `nvidia-smi`
(it names an H100, locks and resets clocks, and samples at the clock it was locked to), real workers, the
workload in the sandbox. Each configuration's evaluation runs at its own clock, a clock the driver refuses errors
that trial alone with the driver's line, and nothing is left locked."""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

from tests.conftest import write_spec
from tests.integration.test_embedded import embedded_env

SLEEP = shutil.which("sleep") or "/bin/sleep"
DATE = shutil.which("date") or "/bin/date"
CAT = shutil.which("cat") or "/bin/cat"

# A program that prints its time and energy; neither depends on the clock, which only the observer sees.
PROGRAM = "import json; print(json.dumps({'ms': 2.5, 'joules': 0.75}))"


def fake_nvidia_smi(directory: Path, state: Path) -> None:
    """nvidia-smi as a node with one H100 answers it; a lock to 1200 MHz is refused as without the right to."""
    directory.mkdir(parents=True)
    script = directory / "nvidia-smi"
    script.write_text(
        f"""#!/bin/sh
echo "$*" >> "{state}/calls"
case "$*" in
  *--query-gpu=index,name,compute_cap,uuid*) echo "0, NVIDIA H100 80GB HBM3, 9.0, GPU-00000000-fake" ;;
  *--query-gpu=index,name,driver_version*) echo "0, NVIDIA H100 80GB HBM3, 580.00.00" ;;
  *--lock-gpu-clocks=1200,1200*)
    echo "Setting locked GPU clocks is not supported for GPU 00000000:19:00.0: Insufficient Permissions" >&2
    exit 4 ;;
  *--lock-gpu-clocks=*) clock="${{*##*--lock-gpu-clocks=}}"; echo "${{clock%%,*}}" > "{state}/clock"
    echo "GPU clocks set for GPU 00000000:19:00.0" ;;
  *--reset-gpu-clocks*) echo 1980 > "{state}/clock"; echo "All done." ;;
  *-lms*) while :; do
            echo "$("{DATE}" '+%Y/%m/%d %H:%M:%S.%3N'), $("{CAT}" "{state}/clock"), 2619, 300.00, 45"
            "{SLEEP}" 0.02
          done ;;
  *) echo "NVIDIA-SMI 580.00.00    Driver Version: 580.00.00      CUDA Version: 13.0" ;;
esac
"""
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_each_trial_runs_at_its_configurations_clock(tmp_path: Path) -> None:
    state = tmp_path / "gpu"
    state.mkdir()
    (state / "clock").write_text("1980\n")
    fake_nvidia_smi(tmp_path / "bin", state)
    spec = {
        "name": "clocks",
        "target": "sm_90",
        "problems": [{"kind": "clocked", "params": {}}],
        "space": {"knobs": {"sm_clock": {"values": [990, 1200, 1590], "build": False}}},
        "strategy": {"name": "grid"},
        "workload": {
            "kind": "command",
            "run": [sys.executable, "-c", PROGRAM],
            "objectives": [{"name": "time", "json": "ms"}, {"name": "energy", "json": "joules"}],
            "clocks": {"sm": "sm_clock"},
        },
    }
    env = embedded_env(
        tmp_path,
        FLEET_BROKER_URL="filesystem://",
        FLEET_OBSERVE="nvidia-smi",
        FLEET_OBSERVE_INTERVAL_MS="20",
        PATH=f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
    )
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "tune", str(write_spec(tmp_path, spec)), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout, done.stderr
    db = sqlite3.connect(tmp_path / ".fleet" / "fleet.db")
    rows = db.execute(
        "SELECT t.config, t.state, t.reason, m.metrics FROM trials t LEFT JOIN measurements m ON m.trial_id = t.id"
    ).fetchall()
    db.close()
    trials = {
        json.loads(config)["sm_clock"]: (state_, reason, json.loads(m or "{}")) for config, state_, reason, m in rows
    }
    assert set(trials) == {990, 1200, 1590}
    for clock in (990, 1590):
        state_, _, metrics = trials[clock]
        assert state_ == "evaluated"
        # The observer sampled the GPU at the clock the configuration locked it to, all the evaluation long.
        assert metrics["sm_clock_mhz"] == clock and metrics["sm_clock_min_mhz"] == clock
        assert metrics["ms"] == 2.5 and metrics["joules"] == 0.75
    state_, reason, _ = trials[1200]
    assert state_ == "errored" and "\n" not in reason
    assert "--lock-gpu-clocks=1200,1200 failed: " in reason and "Insufficient Permissions" in reason
    # The campaign ends with the two it measured: an errored trial is counted, and is no failure of the campaign.
    assert done.returncode == 0, done.stderr
    [problem] = json.loads(done.stdout)["problems"]
    assert problem["trials"]["evaluated"] == 2 and problem["trials"]["errored"] == 1
    # Every lock was reset, the refused one too, and the clock is the default again.
    calls = (state / "calls").read_text().splitlines()
    locks = [c for c in calls if "--lock-gpu-clocks" in c]
    resets = [c for c in calls if "--reset-gpu-clocks" in c]
    assert sorted(locks) == [f"-i 0 --lock-gpu-clocks={c},{c}" for c in (1200, 1590, 990)]
    assert len(resets) == len(locks)
    assert (state / "clock").read_text().strip() == "1980"
