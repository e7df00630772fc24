"""Sending trial and chain-step messages. Tasks are found on the app by name, so nothing here imports them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import groupby

from fleet.celery_app import app
from fleet.store import Requeue

BATCHED = ("compile", "evaluate")
"""The tasks whose messages may carry several trials (``trial_ids``); the others carry one (``trial_id``)."""
LABELS = 1000
"""Characters of the trials' labels a message shows in Flower, at most (Celery cuts its own at 1024)."""


def shown(kwargs: dict, labels: Sequence[str]) -> str | None:
    """What Flower shows as a message's arguments: its ids, and whose trials they are (``"for"``, a label per
    trial: campaign, problem, configuration). None, Celery's own repr, when no trial has a label."""
    if not any(labels):
        return None
    text = repr({"for": list(labels), **kwargs})  # first: what Flower's task list cuts short is the ids
    return text if len(text) <= LABELS else text[: LABELS - 4] + "...}"


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
        for (name, target), grouped in groupby(work, key=lambda r: (r.task, r.target)):
            task = app.tasks[f"fleet.{name}"]  # compile, evaluate or tvm_measure
            items = list(grouped)
            if name not in BATCHED:
                for item in items:
                    kwargs = {"trial_id": item.trial_id, "target": target}
                    task.apply_async(kwargs=kwargs, kwargsrepr=shown(kwargs, [item.label]), producer=producer)
            else:
                size = max(1, batch)
                for start in range(0, len(items), size):
                    part = items[start : start + size]
                    kwargs = {"trial_ids": [item.trial_id for item in part], "target": target}
                    labels = [item.label for item in part]
                    task.apply_async(kwargs=kwargs, kwargsrepr=shown(kwargs, labels), producer=producer)
            sent += len(items)
    return sent
