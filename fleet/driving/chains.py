"""Annealing chains on the fleet: start them, then watch. The chains drive themselves.

With ``"strategy": {"name": "anneal", "budget": B, "options": {"on_fleet": true, "chains": C}}`` each problem
gets C chains of B / C steps. Each step is one ``anneal_step`` task on the target's evaluation queue that
sends the next step itself, so no driver has to stay alive; a chain whose message was lost is found by its
age in the database and sent again (by this watcher or by any worker's heartbeat).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from fleet.driving.campaign import Steering, Summary, baseline_configs, campaign_space, summarize, trial_keys
from fleet.search import RandomSearch
from fleet.search.anneal import TEMPERATURE
from fleet.settings import get_settings
from fleet.space import Space
from fleet.spec.workloads import load_workload_spec
from fleet.states import DRIVEN, WAITING, CampaignStatus, ChainState, TrialState
from fleet.store import Campaign, NewTrial, Requeue, Store, TrialResult

DEFAULT_CHAINS = 4
DEFAULT_BUDGET = 100


class ChainDriver:
    """Starts a campaign's chains and follows them to their end.

    Parameters
    ----------
    send_steps:
        Sends ``anneal_step`` tasks: (chain id, step, target) each.
    dispatch:
        Sends trials' tasks (the baseline's).
    """

    def __init__(
        self,
        store: Store,
        campaign: Campaign,
        send_steps: Callable[[Iterable[tuple[int, int, str]]], int],
        dispatch: Callable[[Iterable[Requeue]], int],
        *,
        on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        requeue_seconds: float = 300.0,
        poll_seconds: float = 0.5,
        steering: Steering | None = None,
    ) -> None:
        self.store = store
        self.campaign = campaign
        self.steering = steering or Steering(store, campaign.id)
        self.send_steps = send_steps
        self.dispatch = dispatch
        self.on_progress = on_progress or (lambda *_: None)
        self.on_warning = on_warning or (lambda _: None)
        self.requeue_seconds = requeue_seconds
        self.poll_seconds = poll_seconds
        self.in_flight: list[int] = []

    def submit_all(self) -> None:
        """Create the chains (or find them) and send each running chain's current step."""
        options = self.campaign.strategy.get("options") or {}
        count = int(options.get("chains", DEFAULT_CHAINS))
        budget = int(self.campaign.strategy.get("budget") or DEFAULT_BUDGET)
        space, _ = campaign_space(self.campaign)
        seed = int(self.campaign.strategy.get("seed", 0))
        for index, problem in enumerate(self.store.campaign_problems(self.campaign.id)):
            # Random search proposes configurations only (None is a dynamic searcher's 'wait').
            starts = [c for c in RandomSearch(space, budget=count, seed=seed + index).generate() if c is not None]
            self.store.create_chains(
                self.campaign.id,
                problem.id,
                starts,
                seed=seed * 1000 + index * 100,
                steps=math.ceil(budget / len(starts)),
                temperature=float(options.get("temperature", TEMPERATURE)),
            )
        self._submit_baselines(space)
        running = [c for c in self.store.chains(self.campaign.id) if c.state == ChainState.RUNNING]
        self.in_flight = [c.id for c in running]
        self.send_steps((c.id, c.step, self.campaign.target) for c in running)

    def _submit_baselines(self, space: Space) -> None:
        """The baseline runs as ordinary trials beside the chains, for the speedup."""
        if not self.campaign.baseline:
            return
        trials = []
        for problem in self.store.campaign_problems(self.campaign.id):
            for config in baseline_configs(space, self.campaign.baseline):
                build_key, measure_key = trial_keys(self.campaign, problem.id, config, space)
                trials.append(NewTrial(problem.id, config, build_key, measure_key, baseline=True))
        created = self.store.add_trials(self.campaign.id, self.campaign.target, trials)
        self.dispatch(
            Requeue(trial_id, self.campaign.target, "compile" if state == TrialState.NEW else "evaluate")
            for trial_id, state in created
            if state in WAITING
        )

    def run(self) -> list[Summary]:
        """Start the chains, wait until every one is done, and return what they found.

        A cancelled campaign stops at once; a paused one waits, and its chains go on from their last step.
        """
        self.drive()
        return summarize(self.store, self.campaign)

    def drive(self) -> None:
        """:meth:`run` without the summary (``fleet driver`` shows none)."""
        with self.steering:
            self._drive()

    def _drive(self) -> None:
        if self.steering.check() not in DRIVEN:
            return
        self.submit_all()
        total = sum(c.steps for c in self.store.chains(self.campaign.id))
        maximize = load_workload_spec(self.campaign.workload).maximize
        last_check = time.monotonic()
        reported = -1
        paused = self.steering.status == CampaignStatus.PAUSED
        while True:
            if self.steering.due():
                status = self.steering.check()
                if status not in DRIVEN:
                    return
                if paused and status == CampaignStatus.RUNNING:
                    # The workers dropped the steps sent during the pause: send each chain's step again.
                    running = [c for c in self.store.chains(self.campaign.id) if c.state == ChainState.RUNNING]
                    self.send_steps((c.id, c.step, self.campaign.target) for c in running)
                paused = status == CampaignStatus.PAUSED
            chains = self.store.chains(self.campaign.id)
            done = sum(c.step for c in chains)
            bests = [c for c in chains if c.best_objective is not None]
            best = (max if maximize else min)(bests, key=lambda c: c.best_objective or 0.0) if bests else None
            if done != reported:
                reported = done
                self.on_progress(done, total, _as_result(best))
            if all(c.state != ChainState.RUNNING for c in chains):
                break
            if time.monotonic() - last_check > self.requeue_seconds / 4:
                last_check = time.monotonic()
                # Not to a queue that no one consumes: each pass would add a message to it.
                served = get_settings().liveness_seconds
                self.send_steps(self.store.stale_chains(self.requeue_seconds, self.campaign.id, served_within=served))
            time.sleep(self.poll_seconds)
        self.store.set_campaign_status(self.campaign.id, CampaignStatus.DONE)


def _as_result(chain: Any) -> TrialResult | None:
    if chain is None:
        return None
    return TrialResult(
        trial_id=0,
        problem_id=chain.problem_id,
        config=chain.best_config,
        state=TrialState.EVALUATED,
        reason=None,
        objective=chain.best_objective,
        valid=True,
    )
