"""A user's second day, embedded: `fleet best CAMPAIGN`, `fleet trials --csv`, a failed campaign in `fleet status`,
and `fleet resume` of a cancelled campaign (refused, or run again with --force)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import chromium, headless_chromium
from tests.conftest import write_spec
from tests.integration.test_report import Page, table
from tests.integration.test_trials_cli import Home, whoami_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    # Not pytest's own: its base folder is mode 0700, which a workload run as another account cannot enter.
    folder = Path(tempfile.mkdtemp(prefix="fleet-second-day-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


PRINT = "import json, sys; print(json.dumps({'score': float(sys.argv[1])}))"


def inline(spec: dict) -> dict:
    """``spec`` with its program given on the command line: no source file to copy into the workload's folder."""
    spec["workload"] = {**spec["workload"], "run": [sys.executable, "-c", PRINT, "{x}"]}
    spec["workload"].pop("sources", None)
    return spec


def two_problems(home: Home, name: str) -> dict:
    spec = inline(whoami_spec(home.path, name, {"json": "score"}))
    spec["problems"] = [{"kind": "whoami", "params": {"size": 1}}, {"kind": "whoami", "params": {"size": 2}}]
    return spec


def test_best_of_a_campaign_is_one_line_per_problem_and_trials_csv_is_the_full_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = Home(tmp_path)
    spec = write_spec(tmp_path, two_problems(home, "two"))
    assert home.cli("tune", str(spec)).returncode == 0
    done = home.cli("best", "two")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["whoami size=1", "whoami size=2"]
    assert all(" x=" in line and "(trial " in line for line in lines)
    assert home.cli("best", "--kind", "whoami").returncode == 1  # two problems of that kind: --param picks one
    one = json.loads(home.cli("best", "--kind", "whoami", "--param", "size=2", "--json").stdout)
    assert one["params"] == {"size": 2}
    table = home.cli("trials", "two", "--csv")
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert len(rows) == 4 and {"trial", "state", "objective", "x", "worker"} <= set(rows[0])


def test_a_campaign_with_no_valid_measurement_shows_as_failed_with_its_reason(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = Home(tmp_path)
    spec = write_spec(tmp_path, inline(whoami_spec(tmp_path, "wrong", {"regex": r"time: ([0-9.]+)"})))
    assert home.cli("tune", str(spec)).returncode == 1
    listing = home.cli("status").stdout
    row = next(line for line in listing.splitlines() if " wrong " in line)
    assert row.split()[3] == "failed", listing
    assert "failed: no valid measurement: no objective in the run's output" in listing
    entry = json.loads(home.cli("status", "wrong", "--json").stdout)["campaigns"][0]
    assert entry["status"] == "failed" and entry["reason"].startswith("no valid measurement")
    # Valid results without an objective (a perf-db's tuned parameters) are no failure.
    perf_db = Path(__file__).resolve().parents[2] / "examples" / "miopen" / "gfx900_56.db"
    assert home.cli("miopen", "import-db", str(perf_db), "--target", "gfx900:56").returncode == 0
    imported = json.loads(home.cli("status", "--json").stdout)["campaigns"]
    assert [c["status"] for c in imported if c["name"].startswith("import-gfx900_56.db")] == ["done"]


def test_resume_of_a_cancelled_campaign_refuses_or_with_force_runs_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = Home(tmp_path)
    spec = write_spec(tmp_path, two_problems(home, "stopped"))
    assert home.cli("submit", str(spec)).returncode == 0
    assert home.cli("cancel", "stopped").returncode == 0
    listing = home.cli("status").stdout
    assert any(line.split()[3:4] == ["cancelled"] for line in listing.splitlines()), listing  # its own column
    refused = home.cli("resume", "stopped")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "fleet: error: campaign 'stopped' was cancelled: `fleet resume --force stopped` runs its cancelled trials again"
    ]
    forced = home.cli("resume", "--force", "stopped", "--json")
    assert forced.returncode == 0, forced.stderr
    assert "resuming cancelled campaign stopped (--force)" in forced.stderr
    assert "nothing new measured" not in forced.stderr
    result = json.loads(forced.stdout)
    assert [p["trials"] for p in result["problems"]] == [{"evaluated": 2}, {"evaluated": 2}]


def test_the_report_holds_every_trial_and_the_speedup_over_a_baseline_that_pins_a_run_time_knob(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = Home(tmp_path)
    spec = inline(whoami_spec(tmp_path, "pinned", {"json": "score", "goal": "max"}))
    spec["space"] = {"knobs": {"x": {"values": [1, 2, 3, 4], "build": False}}}
    spec["baseline"] = {"x": 0.5}  # pins the run-time knob to a value no searched trial has
    assert home.cli("tune", str(write_spec(tmp_path, spec))).returncode == 0
    summary = home.cli("tune", str(write_spec(tmp_path, spec)), "--json")  # measures nothing new: the stored result
    problem = json.loads(summary.stdout)["problems"][0]
    assert problem["baseline"]["config"] == {"x": 0.5} and problem["speedup"] == 8.0
    out = tmp_path / "report.html"
    assert home.cli("report", "pinned", "-o", str(out)).returncode == 0
    page = Page(out.read_text())
    every = table(page, "all")
    assert len(every) == 5 and sum(r["trial"].endswith("(baseline)") for r in every) == 1
    assert table(page, "best")[0]["speedup"] == "8.00\u00d7"
    assert "No speedup" not in out.read_text()

    # Sorting and filtering run in a real browser. The view in the address: by score (column 3), highest first,
    # rows that hold the word "evaluated"; then by trial, the baseline only.
    chromium()
    url = out.resolve().as_uri() + "#sort=3-&q=evaluated"
    done = headless_chromium(url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000")
    assert done.returncode == 0, done.stderr[-2000:]
    shown = Page(done.stdout)
    assert [r["score"] for r in table(shown, "all")] == ["4", "3", "2", "1", "0.5"]
    assert 'aria-sort="descending"' in done.stdout and "5 of 5 trials" in done.stdout
    filtered = headless_chromium(
        out.resolve().as_uri() + "#sort=0&q=baseline", tmp_path / "profile2", "--dump-dom", "--virtual-time-budget=5000"
    )
    assert "1 of 5 trials" in filtered.stdout
    assert len(re.findall(r"<tr [^>]*\bhidden", filtered.stdout)) == 4


def test_a_report_says_why_it_has_no_speedup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = Home(tmp_path)
    spec = inline(whoami_spec(tmp_path, "broken-baseline", {"json": "score"}))
    spec["baseline"] = {"x": "none"}  # float('none') fails: the baseline errors
    tuned = home.cli("tune", str(write_spec(tmp_path, spec)))
    assert "  baseline  no valid measurement (1 errored): no speedup; fleet trials broken-baseline says why" in (
        tuned.stdout.splitlines()
    )
    out = tmp_path / "report.html"
    assert home.cli("report", "broken-baseline", "-o", str(out)).returncode == 0
    text = " ".join(Page(out.read_text()).text)
    assert "No speedup: the baseline has no valid measurement: trial" in text and "errored" in text


def test_fleet_db_upgrade_on_a_plain_postgresql_url(postgres_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import uuid

    url = postgres_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    assert url.startswith("postgresql+psycopg2://")
    plain = "postgresql://" + url.split("://", 1)[1]  # as the README writes it
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_DATABASE_URL": plain, "FLEET_HOME": str(tmp_path / ".fleet")}
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "db", "upgrade"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "is at revision" in done.stdout
