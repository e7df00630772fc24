"""A reused trial's measurement is its source's: said once, as ``Trial.measured_in`` in the store's models; every
other query of a trial's measurement asks it rather than spell the rule again."""

from __future__ import annotations

import re
from pathlib import Path

FLEET = Path(__file__).resolve().parents[2] / "fleet"
RULE = FLEET / "store" / "_models.py"
GLANCE = FLEET / "glance.py"  # its SQL text, for reads without SQLAlchemy: the rule spelled once, as MEASURED_IN


def test_the_rule_is_written_in_the_models_alone() -> None:
    spelled = re.compile(r"coalesce\([\w.]*source_trial_id|source_trial_id or |source_trial_id if ")
    found = [
        f"{path.relative_to(FLEET.parent)}:{n}"
        for path in sorted(FLEET.rglob("*.py"))
        if path != RULE and "migrations" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    glance = [place for place in found if place.startswith("fleet/glance.py:")]
    assert [place for place in found if place not in glance] == []
    lines = GLANCE.read_text().splitlines()
    assert [lines[int(place.rsplit(":", 1)[1]) - 1].split(" = ")[0] for place in glance] == ["MEASURED_IN"]


def test_the_stores_queries_join_a_trials_measurement_through_its_builder() -> None:
    """``trials_with_measurements`` beside the rule starts every store query of trials with their measurements."""
    found = [
        f"{path.relative_to(FLEET.parent)}:{n}"
        for path in sorted((FLEET / "store").glob("*.py"))
        if path != RULE
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "Trial.measured_in" in line
    ]
    assert found == []
