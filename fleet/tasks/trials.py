"""The ``compile`` and ``evaluate`` tasks: messages carry a trial id and a target, nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from celery import Task

from fleet.errors import StoreUnavailable
from fleet.settings import get_settings
from fleet.tasks._app import app
from fleet.tasks.lifecycle import context
from fleet.tasks.sending import send

T = TypeVar("T")


def _waiting_out_outages(task: Task, work: Callable[[], T]) -> T:
    """Run ``work``; when the database stayed down longer than the worker waits, send the task again later.

    By then its lease has run out, so the next delivery claims the trial whether or not the database
    kept this claim (a crash can lose it, and with it the only message that would bring the trial back).
    """
    try:
        return work()
    except StoreUnavailable as error:
        raise task.retry(exc=error, countdown=get_settings().lease_seconds, max_retries=None) from error


@app.task(name="fleet.compile", bind=True)
def compile(self: Task, trial_id: int, target: str) -> str:
    """Build (or reuse) the trial's artifact, then send its evaluation to ``eval.<target>``."""
    from fleet.workers.execute import compile_trial

    ctx = context(self.request.hostname)
    outcome = _waiting_out_outages(self, lambda: compile_trial(ctx, trial_id))
    if outcome == "compiled":
        evaluate.apply_async(kwargs={"trial_id": trial_id, "target": target})
    elif outcome == "lost":  # a database crash may have taken our claim, and the message with it
        send(ctx.store.resend(trial_id))
    return outcome


@app.task(name="fleet.evaluate", bind=True)
def evaluate(self: Task, trial_id: int, target: str) -> str:
    """Measure the trial on this worker's device and record it."""
    from fleet.workers.execute import evaluate_trial

    ctx = context(self.request.hostname)
    outcome = _waiting_out_outages(self, lambda: evaluate_trial(ctx, trial_id))
    if outcome == "lost":  # as in compile
        send(ctx.store.resend(trial_id))
    elif outcome == "skipped":
        # An evaluation is sent only once its trial is compiled: a trial found still new was rolled back
        # by a database crash (workers commit without waiting for the disk), and nothing else will send it.
        send(ctx.store.resend(trial_id, states=("new",)))
    return outcome


@app.task(name="fleet.anneal_step", bind=True)
def anneal_step(self: Task, chain_id: int, step: int, target: str) -> int | None:
    """One step of an annealing chain: propose, build, measure, accept or reject, record, send the next."""
    from fleet.workers.anneal import anneal_step as run_step

    ctx = context(self.request.hostname)
    following = _waiting_out_outages(self, lambda: run_step(ctx, chain_id, step))
    if following is not None:
        anneal_step.apply_async(kwargs={"chain_id": chain_id, "step": following, "target": target})
    return following
