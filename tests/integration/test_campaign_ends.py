"""How campaigns end, on the store (SQLite and PostgreSQL): a problem with no trial says why, plainly."""

from __future__ import annotations

import pytest

from fleet.diagnose import no_valid_measurement
from fleet.driving.campaign import summarize
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


def test_waiting_trials_are_sent_again_only_to_a_queue_that_someone_consumes(store: Store) -> None:
    from fleet.store import NewTrial

    problem = store.add_problem("k", {"n": 2})
    campaign = store.create_campaign(
        name="unserved",
        target="cpu-nobody",
        problem_ids=[problem],
        space={"knobs": {"tile": [1, 2]}},
        strategy={"name": "grid"},
        workload={"kind": "command", "run": ["./k", "{tile}"], "objective": {"json": "s"}},
        options={},
        provenance={},
    )
    store.add_trials(campaign.id, "cpu-nobody", [NewTrial(problem, {"tile": 1}, "b1", "m1", seq=1)])

    # No worker serves cpu-nobody: its message waits in the queue, and another would only make the queue grow.
    assert store.stale(0, campaign.id, served_within=30) == []
    assert store.stale_chains(0, campaign.id, served_within=30) == []
    store.register_worker(
        name="eval-cpu0@node1",
        hostname="node1",
        role="eval",
        target="cpu-nobody",
        queues=["eval.cpu-nobody"],
        gpu=None,
        gpus=[],
        cpus=1,
        concurrency=1,
        pid=1,
    )
    assert [r.task for r in store.stale(0, campaign.id, served_within=30)] == ["compile"]
