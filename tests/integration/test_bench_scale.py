"""``fleet bench scale`` with small numbers: both phases run, and every figure is there and sane."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

TRIALS, CAMPAIGNS = 400, 4
COMMAND = ["bench", "scale", "--trials", str(TRIALS), "--campaigns", str(CAMPAIGNS), "--json"]


def test_a_small_scale_run_gives_every_figure_of_both_phases() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", *COMMAND],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    # Its commands ran from Fleet's bytecode, as after an install, not compiling the modules at each start.
    page = ROOT / "fleet" / "report" / "page.py"
    assert Path(importlib.util.cache_from_source(str(page))).stat().st_mtime >= page.stat().st_mtime
    result = json.loads(done.stdout)
    one, many = result["one_campaign"], result["many_campaigns"]
    assert (one["trials"], one["driver"]) == (TRIALS, "fleet tune")
    assert (many["campaigns"], many["trials_per_campaign"], many["driver"]) == (CAMPAIGNS, TRIALS // 20, "fleet driver")
    assert many["trials"] == CAMPAIGNS * (TRIALS // 20)
    for phase in (one, many):
        assert 0 < phase["trials_per_s_first"] < 10_000 and 0 < phase["trials_per_s_last"] < 10_000
        # Rates are rounded to 0.1 trials/s in the output, their ratio from the unrounded ones.
        ratio = phase["trials_per_s_last"] / phase["trials_per_s_first"]
        assert phase["last_over_first"] == pytest.approx(ratio, rel=0.01)
        assert 5 <= len(phase["trials_per_s_by_tenth"]) <= 11
        # A real Python process that imported Fleet, SQLAlchemy and Celery: tens of MB, not a guess.
        assert 30 < phase["driver_peak_mb"] < 2000
        # The machine's speed, sampled each second: a phase of a few seconds may hold no sample in a window.
        speed = phase["machine_speed_last_over_first"]
        assert speed is None or 0.2 < speed < 5
        assert set(phase["command_s"]) == {"status", "status_campaign", "best", "trials_errored", "report"}
        assert all(0 < seconds < 60 for seconds in phase["command_s"].values())
        # Each trial leaves a row, its measurement and index entries: a few hundred bytes to a few kB.
        assert 100 < phase["database_bytes_per_trial"] < 100_000
        # Where the CPU went over each window, by role: every private server and fleet process was seen.
        for window in (phase["cpu"]["first"], phase["cpu"]["last"]):
            assert set(window["cpu_ms_per_trial"]) == {"worker", "driver", "database", "broker", "other"}
            assert all(ms >= 0 for ms in window["cpu_ms_per_trial"].values())
            assert window["fleet_cpu_ms_per_trial"] > 0
            assert 0 <= window["idle_cores"] <= result["cores"]
    # How evenly the campaigns run at once went: each one's end, in order, within the phase.
    ends = many["campaign_end_s"]
    assert len(ends) == CAMPAIGNS and ends == sorted(ends) and ends[0] > 0
    assert 1 <= many["campaigns_running_in_last_window"] <= CAMPAIGNS
    assert 0 < many["slowest_campaign_when_first_ended"] <= 1
    assert "campaign_end_s" not in one
    baseline = result["command_s_baseline"]
    assert set(baseline) == {"trials", "status", "status_campaign", "best", "trials_errored", "report"}
    assert result["met"]["small_status_s"] is (baseline["status"] < 0.3)
    assert result["met"]["one_campaign"]["driver_peak_mb"] is (one["driver_peak_mb"] < 300)
    # Progress went to stderr as the run went.
    assert f"one campaign of {TRIALS} trials" in done.stderr
    assert f"{CAMPAIGNS} campaigns of {TRIALS // 20} trials at once" in done.stderr


def started_under(tmp: Path) -> dict[int, str]:
    """The live processes whose environment names ``tmp`` as TMPDIR (a run's own and all it started inherit it) or
    that work in a folder under it (Redis writes its title over its environment), by pid, with their command
    lines."""
    mark = f"TMPDIR={tmp}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit():
                continue
            if mark in (proc / "environ").read_bytes().split(b"\0") or (proc / "cwd").resolve().is_relative_to(tmp):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or a zombie: its environment is unreadable
            continue
    return found


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_sigterm_and_ctrl_c_stop_a_run_and_its_servers(tmp_path: Path, signum: int, status: int) -> None:
    # Short: PostgreSQL's socket goes in it, and a socket's path has 107 bytes at most (pytest's folders under
    # xdist take most of them).
    tmp = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_DATABASE_URL", "FLEET_BROKER_URL")}
    env |= {"TMPDIR": str(tmp), "FLEET_HOME": str(tmp_path / "home")}
    # As a shell without job control starts it in the background: with SIGINT ignored, which it inherits.
    background = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
    )
    command = [sys.executable, "-c", background, sys.executable, "-m", "fleet.cli", "bench", "scale", "--trials", "200"]
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        deadline = time.monotonic() + 120
        while "warm-up:" not in log.read_text() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "warm-up:" in log.read_text(), log.read_text()[-3000:]  # its servers and worker are up
        running = " ".join(started_under(tmp).values())
        assert "postgres -D" in running and "redis-server" in running and "fleet.cli worker" in running

        run.send_signal(signum)

        assert run.wait(120) == status, log.read_text()[-3000:]
        assert started_under(tmp) == {}
        assert not list(tmp.iterdir())  # its servers' and run's directories removed
    finally:
        for pid in started_under(tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
