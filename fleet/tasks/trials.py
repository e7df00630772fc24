"""The ``compile`` and ``evaluate`` tasks: messages carry a trial id and a target, nothing else."""

from __future__ import annotations

from collections.abc import Iterable

from celery import Task

from fleet.store import Requeue
from fleet.tasks import app
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


def send(work: Iterable[Requeue]) -> int:
    """Send a task for each piece of work; return how many were sent."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for item in work:
            task = compile if item.task == "compile" else evaluate
            task.apply_async(kwargs={"trial_id": item.trial_id, "target": item.target}, producer=producer)
            sent += 1
    return sent
