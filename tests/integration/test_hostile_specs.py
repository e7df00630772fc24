"""Hostile specs through the real `fleet` command (issue 13): each ends in one `fleet: error:` line and exit 1,
and writes nothing, on the embedded SQLite store of a fresh directory (no server needed).

tests/unit/test_spec_hostile.py holds the limits themselves and feeds many more specs to the loader."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

import fleet
from fleet.limits import KIND_LENGTH, NAME_LENGTH, TAG_LENGTH
from fleet.store import Store
from fleet.store._models import ProblemTag
from fleet.targets import TARGET_LENGTH
from tests.conftest import ROOT
from tests.unit.test_spec_hostile import CASES, SPEC, changed, hostile_specs


def fleet_cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``fleet ARGS`` in ``home``, embedded (no FLEET_DATABASE_URL or FLEET_BROKER_URL), killed whole at the end."""
    base = {k: v for k, v in os.environ.items() if k not in ("FLEET_DATABASE_URL", "FLEET_BROKER_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *args],
        env={**base, "FLEET_HOME": str(home / ".fleet"), "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        # A spec wrongly accepted would start local workers and a Redis: leave none behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def assert_refused(home: Path, done: subprocess.CompletedProcess[str], words: str = "") -> None:
    """The three properties: one line, exit 1, no row written."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: "), done.stderr
    assert "\x1b" not in done.stderr and words in lines[0], lines[0]
    assert done.stdout == ""
    database = home / ".fleet" / "fleet.db"
    if database.exists():
        with sqlite3.connect(database) as connection:
            for table in ("campaigns", "problems", "blobs", "trials"):
                assert connection.execute(f"select count(*) from {table}").fetchone() == (0,), table


@pytest.mark.parametrize(("change", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_finding_is_one_line_and_writes_nothing(tmp_path: Path, change: Any, words: str) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(changed(change)))
    assert_refused(tmp_path, fleet_cli(tmp_path, "tune", "spec.json"), words)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (json.dumps(SPEC).replace('"b": [1, 2, 3]', '"b": [' + "9" * 5000 + "]").encode(), "too many digits"),
    ],
    ids=["binary", "5000 digits"],
)
def test_a_file_fleet_cannot_read_is_one_line_and_writes_nothing(tmp_path: Path, content: bytes, words: str) -> None:
    (tmp_path / "spec.json").write_bytes(content)
    for command in ("tune", "submit"):
        assert_refused(tmp_path, fleet_cli(tmp_path, command, "spec.json"), words)


def test_a_name_on_the_command_line_is_held_to_the_same_limits(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    done = fleet_cli(tmp_path, "submit", "spec.json", "--name", "a\x1b]0;pwned\x07b")
    assert_refused(tmp_path, done, "holds the control character '\\x1b'")
    assert_refused(tmp_path, fleet_cli(tmp_path, "tune", "spec.json", "--name", "n" * 129), "at most 128")


@pytest.mark.parametrize("url", ["postgresql://::::", "postgresql://fleet:secret@db:port/fleet"])
def test_a_database_url_that_does_not_parse_is_one_line(tmp_path: Path, url: str) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    for args in (("tune", "spec.json"), ("status",)):
        done = fleet_cli(tmp_path, *args, env={"FLEET_DATABASE_URL": url})
        assert_refused(tmp_path, done, "FLEET_DATABASE_URL=")
        assert "secret" not in done.stderr
    assert not (tmp_path / ".fleet").exists()


# A dozen examples: each is a `fleet` process of about half a second.
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile_specs(), command=st.sampled_from(["tune", "submit"]))
def test_a_hostile_spec_is_one_line_nonzero_and_writes_nothing(data: dict[str, Any], command: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        home = Path(directory)
        # ensure_ascii: a lone surrogate is written as \ud800, as a hostile user would.
        (home / "spec.json").write_text(json.dumps(data))
        assert_refused(home, fleet_cli(home, command, "spec.json"))


@pytest.mark.parametrize("priority", ["nan", "inf"])
def test_a_priority_that_is_not_a_finite_weight_is_one_line(tmp_path: Path, priority: str) -> None:
    # click's FloatRange lets NaN and infinity through; the store would keep them and share slots by them.
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    done = fleet_cli(tmp_path, "submit", "spec.json", "--priority", priority)
    assert_refused(tmp_path, done, f"'priority' is a weight above 0, such as 1 or 3, not {priority}")


def test_a_spec_at_the_limits_is_written_whole_on_both_stores(store: Store) -> None:
    # The limits are the columns' sizes: PostgreSQL counts characters, so 64 two-byte ones fit a kind.
    data = json.loads(json.dumps(SPEC))
    data["name"] = "n" * NAME_LENGTH
    data["target"] = "cpu-" + "x" * (TARGET_LENGTH - 4)
    data["problems"] = [{"kind": "é" * KIND_LENGTH, "params": {"n": 2**63 - 1}, "tags": ["t" * TAG_LENGTH]}]
    handle = fleet.submit(data, store)
    campaign = handle.campaign()
    assert (campaign.name, campaign.target) == (data["name"], data["target"])
    [problem] = store.campaign_problems(campaign.id)
    assert problem.kind == "é" * KIND_LENGTH
    with store.session() as session:
        assert list(session.scalars(select(ProblemTag.tag))) == ["t" * TAG_LENGTH]
