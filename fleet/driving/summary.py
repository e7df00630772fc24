"""What a campaign found for each problem: its best, its baseline and its counts (:func:`summarize`).

A module of its own, apart from the driver: ``fleet best`` and ``fleet status CAMPAIGN`` summarize a campaign
without importing the driver and every searcher, which only a campaign whose searcher judges its runs (``step``,
``bisect``, ``composer``, a space file's) needs (issue 42, item 12).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.space import Space
from fleet.spec.workloads import load_workload_spec

if TYPE_CHECKING:
    from fleet.search import Searcher
    from fleet.store import Campaign, ProblemTally, Store, TrialResult

JUDGING = ("step", "bisect", "composer")
"""Strategies whose searchers may hold a predicate on runs (a space file's ``META_search_callback`` may too)."""


@dataclass
class Summary:
    """What a campaign found for one problem."""

    problem_id: int
    best: TrialResult | None
    baseline: TrialResult | None
    counts: dict[str, int]

    maximize: bool = False

    @property
    def speedup(self) -> float | None:
        """How many times better the best is than the baseline (a ratio of GFLOPS, or of times inverted)."""
        if not (self.best and self.baseline and self.best.objective and self.baseline.objective):
            return None
        ratio = self.best.objective / self.baseline.objective
        return ratio if self.maximize else 1 / ratio


def judges(campaign: Any) -> bool:
    """Whether ``campaign``'s best is the one its searcher accepts, which only the searcher can say: its
    strategy's searcher (or a space file's own) may hold a predicate on runs."""
    return campaign.strategy.get("name") in JUDGING or bool(campaign.options.get("space_file"))


def summarize(
    store: Store,
    campaign: Campaign,
    searchers: Sequence[Searcher] | None = None,
    tallies: Mapping[int, ProblemTally] | None = None,
) -> list[Summary]:
    """Per problem of ``campaign``: its best trial, its baseline trial, and trial counts by state.

    The best is a run that the campaign's searcher accepts: with a predicate (MLPerf's ``Step``, ``Bisect`` or
    ``Composer``), a valid run that the predicate fails is not the best, however fast it was.

    Parameters
    ----------
    searchers:
        The searchers that drove it, one per problem in order (a driver's); by default they are made again from
        the campaign, which cannot be done for a space file's own searcher where no user code runs: its best
        is then the database's best valid run.
    tallies:
        The campaign's :meth:`~fleet.store.Store.tally` with its bests, when the caller has read it already.
    """
    maximize = load_workload_spec(campaign.workload).maximize
    run_knobs = Space.from_dict(campaign.space).run_knobs
    if tallies is None:
        tallies = store.tally(campaign.id, maximize)
    judged = None
    if searchers is not None or judges(campaign):
        from fleet.driving.judging import judged_bests  # the searchers: only for a campaign whose searcher judges

        judged = judged_bests(store, campaign, maximize, searchers)
    summaries = []
    for problem in store.campaign_problems(campaign.id):
        tally = tallies.get(problem.id)
        best = tally.best if tally else None
        if judged is not None:
            best = judged.get(problem.id)
        # The baseline run with the same run-time knob values as the best: a like-for-like speedup.
        baseline = None if best is None else store.same_run_baseline(campaign.id, problem.id, best.config, run_knobs)
        summaries.append(Summary(problem.id, best, baseline, tally.counts if tally else {}, maximize))
    return summaries
