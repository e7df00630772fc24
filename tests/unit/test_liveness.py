"""One liveness rule (fleet.settings.liveness_window), one setting for it: workers, drivers, status and tests ask
``Settings.liveness_seconds`` and write no arithmetic of their own."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.settings import Settings

FLEET = Path(__file__).resolve().parents[2] / "fleet"


def test_a_worker_is_alive_for_three_beats_and_a_slack() -> None:
    assert Settings.from_env({"FLEET_HOME": "/nowhere"}).liveness_seconds == 3 * 5.0 + 5.0
    short = {"FLEET_HOME": "/nowhere", "FLEET_HEARTBEAT_SECONDS": "0.5", "FLEET_LIVENESS_SLACK_SECONDS": "0.25"}
    assert Settings.from_env(short).liveness_seconds == 1.75


def test_no_liveness_arithmetic_outside_the_settings() -> None:
    arithmetic = re.compile(r"\d+(\.\d+)? \* [\w.()]*heartbeat_seconds\s*\+|heartbeat_seconds\s*\+\s*\d")
    found = [
        f"{path.relative_to(FLEET.parent)}:{n}"
        for path in sorted(FLEET.rglob("*.py"))
        if path.name != "settings.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if arithmetic.search(line)
    ]
    assert found == []
