"""A reused trial's measurement is its source's: said once, as ``Trial.measured_in`` in the store's models; every
other query of a trial's measurement asks it rather than spell the rule again."""

from __future__ import annotations

import re
from pathlib import Path

FLEET = Path(__file__).resolve().parents[2] / "fleet"
RULE = FLEET / "store" / "_models.py"


def test_the_rule_is_written_in_the_models_alone() -> None:
    spelled = re.compile(r"coalesce\([\w.]*source_trial_id|source_trial_id or |source_trial_id if ")
    found = [
        f"{path.relative_to(FLEET.parent)}:{n}"
        for path in sorted(FLEET.rglob("*.py"))
        if path != RULE and "migrations" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []
