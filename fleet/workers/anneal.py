"""One step of a simulated-annealing chain, as the ``anneal_step`` task runs it on a worker. No Celery here.

A step is a pure function of the chain's state and its step number: the neighbour comes from a random
generator seeded with (chain seed, step), so a step that runs twice proposes, measures and decides the
same thing, and the store records it once (:meth:`Store.finish_chain_step`).
"""

from __future__ import annotations

import random
import time

from fleet.keys import trial_keys
from fleet.search.anneal import COOLING, accept, neighbour
from fleet.space import Space
from fleet.states import CampaignStatus, ChainState, TrialState
from fleet.store import NewTrial, TrialResult
from fleet.workers.execute import WorkerContext, compile_trial, evaluate_trial

WAIT_SECONDS = 0.2


def measure(ctx: WorkerContext, trial_id: int) -> TrialResult:
    """Build and measure ``trial_id`` here, or wait for whoever holds it; return its result."""
    while True:
        finished = ctx.store.results([trial_id])
        if finished:
            return finished[0]
        state = ctx.store.trial(trial_id).state
        if state == TrialState.NEW:
            ctx.lap()  # its compile's time on the slot, not the chain's
            compile_trial(ctx, trial_id)
        elif state == TrialState.COMPILED:
            ctx.lap()  # its evaluation's, likewise
            evaluate_trial(ctx, trial_id)
        else:
            # Another worker holds it (the same configuration in another chain); its lease brings it back
            # to us if that worker dies.
            time.sleep(WAIT_SECONDS)


def anneal_step(ctx: WorkerContext, chain_id: int, step: int) -> int | None:
    """Run step ``step`` of a chain; return the next step to send, or None when there is none to send."""
    chain = ctx.store.chain(chain_id)
    if chain.state != ChainState.RUNNING or chain.step != step:
        return None  # a duplicate of a step already recorded
    campaign = ctx.store.campaign(chain.campaign_id)
    if campaign.status in (CampaignStatus.PAUSED, CampaignStatus.CANCELLED):
        return None  # a paused campaign's driver sends the step again on resume
    space = Space.from_dict(campaign.space)
    workload = ctx.workload(campaign.id, campaign.workload)
    options = campaign.strategy.get("options") or {}
    rng = random.Random(f"{chain.seed}:{step}")
    candidate = chain.config if step == 0 else neighbour(space, chain.config, rng)
    build_key, measure_key = trial_keys(campaign, chain.problem_id, candidate, space)
    [(trial_id, _)] = ctx.store.add_trials(
        campaign.id, campaign.target, [NewTrial(chain.problem_id, candidate, build_key, measure_key, seq=step)]
    )
    started = time.monotonic()
    result = measure(ctx, trial_id)
    objective = result.objective if result.valid else None
    if step == 0:
        accepted = objective is not None
    else:
        accepted = accept(chain.objective, objective, chain.temperature, rng, workload.maximize)
    moved = ctx.store.finish_chain_step(
        chain,
        trial_id=trial_id,
        config=candidate,
        objective=objective,
        accepted=accepted,
        temperature=chain.temperature * float(options.get("cooling", COOLING)),
        worker=ctx.name,
        seconds=time.monotonic() - started,
        maximize=workload.maximize,
    )
    return step + 1 if moved and step + 1 < chain.steps else None
