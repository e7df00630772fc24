"""The default strategy starts from the best configurations known for similar problems, in the campaigns its spec
names as its history (fleet.trust; see also test_history.py)."""

from __future__ import annotations

from fleet.driving.campaign import CampaignSpec, Driver, ProblemSpec, submit
from fleet.space import Knob, Space
from fleet.store import NewTrial, Store
from tests.integration.test_history import record_run


def test_auto_is_seeded_with_the_best_of_other_problems_of_the_kind(store: Store) -> None:
    space = Space((Knob("tile", (8, 16, 32, 64)), Knob("unroll", (1, 2, 4))))
    first = submit(
        store,
        CampaignSpec(
            name="a", problems=[ProblemSpec("gemm", {"n": 256})], target="sm_90", space=space, workload={"kind": "noop"}
        ),
    )
    problem = store.campaign_problems(first.id)[0].id
    good = {"tile": 32, "unroll": 4}
    [(trial, _)] = store.add_trials(first.id, "sm_90", [NewTrial(problem, good, "b", "m")])
    record_run(store, trial, 1.5)
    second = submit(
        store,
        CampaignSpec(
            name="b",
            problems=[ProblemSpec("gemm", {"n": 512})],
            target="sm_90",
            space=space,
            workload={"kind": "noop"},
            strategy={"name": "auto", "budget": 5},
            options={"history": {"from": ["a"]}},
        ),
    )

    driver = Driver(store, second, lambda work, batch: 0)

    # It comes as history (fleet.driving.history): the first proposal, and said to be from there.
    assert driver.searchers[0].history[0].config == good  # type: ignore[attr-defined]
    assert next(driver.searchers[0].generate()) == good
    assert driver.searchers[0].origin(good)["rank"] == 1  # type: ignore[attr-defined]
