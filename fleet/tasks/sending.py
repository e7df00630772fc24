"""Sending trial and chain-step messages. Tasks are found on the app by name, so nothing here imports them."""

from __future__ import annotations

from collections.abc import Iterable

from fleet.store import Requeue
from fleet.tasks._app import app


def send_steps(steps: Iterable[tuple[int, int, str]]) -> int:
    """Send ``anneal_step`` for each (chain id, step, target); return how many were sent."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for chain_id, step, target in steps:
            kwargs = {"chain_id": chain_id, "step": step, "target": target}
            app.tasks["fleet.anneal_step"].apply_async(kwargs=kwargs, producer=producer)
            sent += 1
    return sent


def send(work: Iterable[Requeue]) -> int:
    """Send a task for each piece of work; return how many were sent."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for item in work:
            task = app.tasks[f"fleet.{item.task}"]  # compile, evaluate or tvm_measure
            task.apply_async(kwargs={"trial_id": item.trial_id, "target": item.target}, producer=producer)
            sent += 1
    return sent
