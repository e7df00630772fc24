"""``fleet dashboard`` on PostgreSQL with a campaign running on real workers, loaded in headless Chromium; and
``fleet export optuna`` read back with ``optuna.load_study``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.interop.optuna_storage import SHIFT
from fleet.store import Trial
from tests.browser import headless_chromium
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec

pytestmark = pytest.mark.integration


def slow_spec(fleet: Fleet, name: str, sleep: float) -> dict:
    """test_campaign's grid of the C kernel (six trials and a baseline), each run sleeping ``sleep`` seconds."""
    return kernel_spec(fleet, name=name, problems=[{"kind": "kernel", "params": {"sleep": sleep}}])


def finished(fleet: Fleet) -> int:
    with fleet.store.transaction() as connection:
        return connection.scalar(select(func.count()).select_from(Trial).where(Trial.state == "evaluated"))


def dom(url: str, profile: Path, *args: str) -> str:
    done = headless_chromium(url, profile, "--window-size=1400,900", "--virtual-time-budget=10000", *args)
    assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}", timeout=30) as response:
        return json.loads(response.read())


def test_the_dashboard_follows_a_running_campaign(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    spec = write_spec(fleet.home, slow_spec(fleet, "live", 0.5))
    with (fleet.home / "tune.log").open("w") as log:
        tune = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", "tune", str(spec)],
            env=fleet.env,
            cwd=fleet.home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "dashboard", "--port", "0"],
        env=fleet.env,
        cwd=fleet.home,
        stderr=subprocess.PIPE,
        text=True,
    )
    fleet.procs.append(tune)  # type: ignore[arg-type]
    try:
        line = dashboard.stderr.readline() if dashboard.stderr else ""
        assert "serving http://" in line, line
        url = line.split("serving ", 1)[1].strip()
        base = url.removesuffix("/dashboard/")
        fleet.wait_for(lambda: finished(fleet) >= 2, timeout=120, what="two trials to finish")
        campaign = fleet.store.campaign("live")
        study = campaign.id << SHIFT
        listing = dom(url, tmp_path / "p1", "--dump-dom")
        assert "live / problem" in listing
        before = api(base, f"/api/studies/{study}")
        seen = {t["number"] for t in before["trials"] if t["state"] == "Complete"}
        assert len(seen) >= 2 and before["directions"] == ["maximize"]
        history = dom(f"{url}studies/{study}", tmp_path / "p2", "--dump-dom")
        assert "History" in history and "main-svg" in history  # the history plot (plotly) is drawn
        shot = tmp_path / "dashboard.png"  # kept: the test's artifact
        dom(f"{url}studies/{study}", tmp_path / "p3", f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000
        fleet.wait_for(lambda: tune.poll() is not None, timeout=180, what="the campaign to end")
        assert tune.returncode == 0, (fleet.home / "tune.log").read_text()

        # The trials that finished after the page loaded are there, once the dashboard's cache of a study's trials
        # (two seconds for a small study, optuna_dashboard._storage.get_trials) has expired: a page load just
        # before the campaign's last trial finished may have filled it.
        def shown() -> tuple[dict, set[int]]:
            answer = api(base, f"/api/studies/{study}")
            return answer, {t["number"] for t in answer["trials"] if t["state"] == "Complete"}

        fleet.wait_for(lambda: len(shown()[1]) == finished(fleet), timeout=30, what="every finished trial shown")
        after, done = shown()
        assert done > seen and len(done) == finished(fleet) >= 7
        # The trial list: each trial with its state, the one shown with its values and user attributes.
        listed = dom(f"{url}studies/{study}/trials", tmp_path / "p4", "--dump-dom")
        assert all(f"Trial {n}" in listed for n in done) and listed.count("Complete") >= 7, listed[-2000:]
        shown = " ".join(re.sub(r"<[^>]+>", " ", listed).split())
        assert "User Attributes fleet_trial" in shown and "eval_seconds" in shown, shown[-1500:]
        keys = {a["key"] for t in after["trials"] for a in t["user_attrs"]}  # a handed trial has no compile time
        assert keys >= {"fleet_trial", "worker", "compile_seconds", "eval_seconds", "device"}
    finally:
        dashboard.terminate()
        dashboard.wait(30)


def test_export_optuna_opens_in_load_study(fleet: Fleet, tmp_path: Path) -> None:
    import optuna

    fleet.start_worker()
    fleet.cli("tune", str(write_spec(fleet.home, slow_spec(fleet, "copy", 0))), check=True, timeout=300)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    done = fleet.cli("export", "optuna", "copy", "--storage", storage, check=True)
    (name,) = optuna.get_all_study_names(storage)
    assert name in done.stdout
    study = optuna.load_study(study_name=name, storage=storage)
    trials = len(fleet.store.trials(fleet.store.campaign("copy").id))  # the grid's six and the baseline's
    assert len(study.trials) == trials >= 7 and study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert {tuple(sorted(t.params.items())) for t in study.trials} >= {
        (("scale", scale), ("size", size)) for size in (2, 3, 4) for scale in (1, 10)
    }
    journal = tmp_path / "copy.journal"
    assert fleet.cli("export", "optuna", "copy", "--storage", str(journal), check=True).returncode == 0
    assert (
        len(
            optuna.load_study(
                study_name=name,
                storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
            ).trials
        )
        == trials
    )
    again = fleet.cli("export", "optuna", "copy", "--storage", storage)
    assert again.returncode == 1 and "exists in" in again.stderr
    own = fleet.cli("export", "optuna", "copy", "--storage", fleet.env["FLEET_DATABASE_URL"])
    assert own.returncode == 1 and "Fleet's own database" in own.stderr
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == trials
