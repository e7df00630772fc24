"""Sending trial and chain-step messages. Tasks are found on the app by name, so nothing here imports them."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from fleet.store import Requeue
from fleet.tasks._app import app

BATCHED = ("compile", "evaluate")
"""The tasks whose messages may carry several trials (``trial_ids``); the others carry one (``trial_id``)."""


def send_steps(steps: Iterable[tuple[int, int, str]]) -> int:
    """Send ``anneal_step`` for each (chain id, step, target); return how many were sent."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for chain_id, step, target in steps:
            kwargs = {"chain_id": chain_id, "step": step, "target": target}
            app.tasks["fleet.anneal_step"].apply_async(kwargs=kwargs, producer=producer)
            sent += 1
    return sent


def send(work: Iterable[Requeue], batch: int = 1) -> int:
    """Send the tasks ``work`` needs; return how many trials were sent.

    Parameters
    ----------
    work:
        Trials and the task each needs, in the order to send them.
    batch:
        Most trials per message: consecutive trials needing the same task on the same target share
        messages of up to this many (compile and evaluate only).
    """
    sent = 0
    with app.producer_or_acquire() as producer:
        for (name, target), items in groupby(work, key=lambda r: (r.task, r.target)):
            task = app.tasks[f"fleet.{name}"]  # compile, evaluate or tvm_measure
            ids = [item.trial_id for item in items]
            if name not in BATCHED:
                for trial_id in ids:
                    task.apply_async(kwargs={"trial_id": trial_id, "target": target}, producer=producer)
            else:
                for start in range(0, len(ids), max(1, batch)):
                    kwargs = {"trial_ids": ids[start : start + max(1, batch)], "target": target}
                    task.apply_async(kwargs=kwargs, producer=producer)
            sent += len(ids)
    return sent
