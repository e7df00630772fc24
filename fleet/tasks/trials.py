"""The ``compile`` and ``evaluate`` tasks: messages carry a trial id and a target, nothing else."""

from __future__ import annotations

from celery import Task

from fleet.tasks._app import app
from fleet.tasks.lifecycle import context


@app.task(name="fleet.compile", bind=True)
def compile(self: Task, trial_id: int, target: str) -> str:
    """Build (or reuse) the trial's artifact, then send its evaluation to ``eval.<target>``."""
    from fleet.workers.execute import compile_trial

    outcome = compile_trial(context(self.request.hostname), trial_id)
    if outcome == "compiled":
        evaluate.apply_async(kwargs={"trial_id": trial_id, "target": target})
    return outcome


@app.task(name="fleet.evaluate", bind=True)
def evaluate(self: Task, trial_id: int, target: str) -> str:
    """Measure the trial on this worker's device and record it."""
    from fleet.workers.execute import evaluate_trial

    return evaluate_trial(context(self.request.hostname), trial_id)


@app.task(name="fleet.anneal_step", bind=True)
def anneal_step(self: Task, chain_id: int, step: int, target: str) -> int | None:
    """One step of an annealing chain: propose, build, measure, accept or reject, record, send the next."""
    from fleet.workers.anneal import anneal_step as run_step

    following = run_step(context(self.request.hostname), chain_id, step)
    if following is not None:
        anneal_step.apply_async(kwargs={"chain_id": chain_id, "step": following, "target": target})
    return following
