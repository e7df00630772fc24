"""How campaigns end, on the store (SQLite and PostgreSQL): a problem with no trial says why, plainly."""

from __future__ import annotations

import pytest

from fleet.campaign import summarize
from fleet.diagnose import no_valid_measurement
from fleet.store import Store

pytestmark = pytest.mark.integration


def test_a_problem_that_got_no_trial_says_the_space_left_none(store: Store) -> None:
    problem = store.add_problem("k", {"n": 1})
    campaign = store.create_campaign(
        name="empty",
        target="cpu-x86_64",
        problem_ids=[problem],
        space={"knobs": {"tile": [1, 2]}, "constraints": ["tile > 2"]},
        strategy={"name": "grid"},
        workload={"kind": "command", "run": ["./k", "{tile}"], "objective": {"json": "s"}},
        options={},
        provenance={},
    )

    error = no_valid_measurement(store, campaign, summarize(store, campaign))

    assert error is not None
    assert "it has no trials: its searcher found no configuration that passes the space's constraints" in str(error)
    assert "none of them finished" not in str(error)
