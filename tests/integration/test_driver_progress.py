"""The driver's progress: how many trials ended, counted as they end (it keeps no result of its own)."""

from __future__ import annotations

from collections.abc import Iterable

from fleet.driving.campaign import CampaignSpec, Driver, ProblemSpec, submit
from fleet.space import Knob, Space
from fleet.store import Requeue, Store


def test_progress_counts_every_trial_that_ended_and_the_summary_finds_the_best(store: Store) -> None:
    space = Space((Knob("tile", (1, 2, 3, 4, 5)), Knob("unroll", (1, 2))))
    spec = CampaignSpec(
        name="progress",
        problems=[ProblemSpec("gemm", {"n": n}) for n in (256, 512)],
        target="sm_90",
        space=space,
        workload={"kind": "noop"},
        strategy={"name": "random", "budget": 7},
    )
    campaign = submit(store, spec)

    def work(requeues: Iterable[Requeue], batch: int) -> int:
        """A worker in the driver's process: each trial compiles, then measures tile x unroll (one errors)."""
        sent = list(requeues)
        for requeue in sent:
            trial = store.trial(requeue.trial_id)
            assert store.claim(trial.id, "compile", "w", 60, 3) and store.mark_compiled(trial.id, "w")
            assert store.claim(trial.id, "evaluate", "w", 60, 3)
            if trial.config == {"tile": 1, "unroll": 1}:
                assert store.record(trial.id, "w", state="errored", reason="boom")
                continue
            objective = float(trial.config["tile"] * trial.config["unroll"])
            measurement = {"objective_name": "ms", "maximize": False, "objective": objective, "valid": True,
                           "samples": [objective], "metrics": {}}  # fmt: skip
            assert store.record(trial.id, "w", measurement=measurement)
        return len(sent)

    progress: list[tuple[int, int | None]] = []
    driver = Driver(store, campaign, work, window=3, on_progress=lambda done, total, _: progress.append((done, total)))
    summaries = driver.run()

    assert progress[-1] == (14, 14) and driver.finished == 14
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert sum(summary.counts.get("evaluated", 0) + summary.counts.get("errored", 0) for summary in summaries) == 14
    for summary in summaries:
        assert summary.best is not None and summary.best.objective == min(
            float(r.config["tile"] * r.config["unroll"])
            for r in store.results(campaign_id=campaign.id)
            if r.problem_id == summary.problem_id and r.valid
        )


def test_a_driver_taking_a_campaign_over_passes_its_ended_trials_straight_through(store: Store) -> None:
    """The trials an earlier driver ended take no room in a new driver's window: its first look sends a window's
    worth of new trials however many ended before (it sent a window's worth of ended ones per look: 42 s past
    1,500 of them before the first new trial went out)."""
    spec = CampaignSpec(
        name="takeover",
        problems=[ProblemSpec("gemm", {"n": 256})],
        target="sm_90",
        space=Space((Knob("tile", tuple(range(1, 11))), Knob("unroll", (1, 2, 4)))),
        workload={"kind": "noop"},
        strategy={"name": "grid"},
    )
    campaign = submit(store, spec)
    sent: list[int] = []

    def work(requeues: Iterable[Requeue], batch: int) -> int:
        """A worker in the driver's process: each trial sent is built and measured at once."""
        for requeue in requeues:
            sent.append(requeue.trial_id)
            assert store.claim(requeue.trial_id, "compile", "w", 60, 3) and store.mark_compiled(requeue.trial_id, "w")
            assert store.claim(requeue.trial_id, "evaluate", "w", 60, 3)
            measurement = {"objective_name": "ms", "maximize": False, "objective": 1.0, "valid": True,
                           "samples": [1.0], "metrics": {}}  # fmt: skip
            assert store.record(requeue.trial_id, "w", measurement=measurement)
        return 0

    first = Driver(store, campaign, work, window=3)
    first._fill(24)  # the first driver ends 24 of the 30 trials, then goes away
    assert len(sent) == 24

    second = Driver(store, campaign, lambda requeues, batch: len(list(requeues)), window=3)
    second._fill()
    assert len(second.counted) == 24  # the ended ones, passed through to feed the searcher
    assert len(second.in_flight) - len(second.counted) == 3  # and a full window of new trials out at once
    assert len(store.trial_counts(campaign.id)) and sum(store.trial_counts(campaign.id).values()) == 27
