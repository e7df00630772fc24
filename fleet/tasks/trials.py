"""The ``compile`` and ``evaluate`` tasks: messages carry trial ids and a target, nothing else.

A message carries several trials when the driver has seen that trials are cheap (see
``fleet.driving.pace``): one message then pays for many, and each trial is still claimed,
leased and recorded on its own, so a dead worker gives each back on its own.
"""

from __future__ import annotations

import ast
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from celery import Task
from celery.exceptions import Retry

from fleet.celery_app import app
from fleet.errors import StoreUnavailable
from fleet.messages import CHEAP_SECONDS, SPLIT_SECONDS
from fleet.settings import get_settings
from fleet.states import TrialState
from fleet.store import Requeue
from fleet.tasks.lifecycle import context
from fleet.tasks.sending import send

T = TypeVar("T")
HAND_BACK_SECONDS = 2.0
"""How long an unhealthy worker waits before it hands a message back, so that other workers take it."""
log = logging.getLogger("fleet.worker")


def _waiting_out_outages(task: Task, work: Callable[[], T], kwargs: dict | None = None) -> T:
    """Run ``work``; when the database stayed down longer than the worker waits, send the task again later.

    By then its lease has run out, so the next delivery claims the trial whether or not the database
    kept this claim (a crash can lose it, and with it the only message that would bring the trial back).
    ``kwargs`` are the retried message's, when they differ from this one's.
    """
    try:
        return work()
    except StoreUnavailable as error:
        raise task.retry(exc=error, kwargs=kwargs, countdown=get_settings().lease_seconds, max_retries=None) from error


def _each(
    task: Task,
    name: str,
    target: str,
    trial_ids: list[int],
    one: Callable[[int], str],
    then: Callable[[int, str], list[Requeue]],
    healthy: Callable[[], bool] = lambda: True,
) -> dict[str, int]:
    """Run ``one`` on each trial of a message in turn; return how many trials ended in each outcome.

    Parameters
    ----------
    name:
        The task (``compile`` or ``evaluate``), to send the rest of the message again as.
    one:
        Works on one trial and returns its outcome.
    then:
        What to send for a trial once ``one`` has returned its outcome.
    healthy:
        Whether this worker's node may take work now; an unhealthy one hands the message's trials back to the
        queue, after a pause, so that another worker takes them (see ``fleet.workers.health``).
    """
    outcomes: Counter[str] = Counter()
    following: list[Requeue] = []
    rest: list[Requeue] = []
    error: Exception | None = None
    started = time.monotonic()
    try:
        for done, trial_id in enumerate(trial_ids):
            if not healthy():
                rest = [Requeue(later, target, name) for later in trial_ids[done:]]
                outcomes["handed back"] += len(rest)
                log.warning("this node is unhealthy: %d trials handed back to %s", len(rest), target)
                time.sleep(HAND_BACK_SECONDS)  # the same messages would come straight back to this worker
                break
            # Trials slower than the driver took them for: the rest go out one per message, for idle slots.
            held = time.monotonic() - started
            if done and held > SPLIT_SECONDS and held > CHEAP_SECONDS * done:
                rest = [Requeue(later, target, name) for later in trial_ids[done:]]
                outcomes["sent on"] += len(rest)
                break
            remaining = {"trial_ids": trial_ids[done:], "target": target}

            def step(trial_id: int = trial_id) -> tuple[str, list[Requeue]]:
                outcome = one(trial_id)
                return outcome, then(trial_id, outcome)

            # One line as each trial starts and ends: what ``fleet logs --trial N`` finds.
            log.info("trial %d %s start (task %s)", trial_id, name, task.request.id)
            began = time.monotonic()

            try:
                outcome, more = _waiting_out_outages(task, step, remaining)
            except Retry:
                raise
            except Exception as failure:  # recorded as the trial's error already; the others still run
                error = error or failure
                outcome, more = "raised", []
            outcomes[outcome] += 1
            following += more
            seconds = time.monotonic() - began
            log.info("trial %d %s end: %s in %.3f s (task %s)", trial_id, name, outcome, seconds, task.request.id)
    finally:
        # Sent even when the database went away: compiled trials' evaluations would be lost otherwise.
        # What this message's trials need next goes out in messages as large as this one: together when the
        # driver found them cheap, one to a message when it did not (the next worker splits it if slow).
        send(following, batch=len(trial_ids))
        send(rest)
    if error is not None:
        raise error
    return dict(outcomes)


def _labels(task: Task) -> dict[int, str]:
    """The labels this message's trials came with (``fleet.tasks.sending.shown``), by trial id: the evaluations
    it sends carry them on, so Flower shows whose each task is. Empty when the message had none."""
    try:
        shown = ast.literal_eval(getattr(task.request, "kwargsrepr", None) or "")
        return dict(zip(shown["trial_ids"], shown["for"], strict=True))
    except (ValueError, SyntaxError, KeyError, TypeError):  # no labels, or cut short
        return {}


def _ids(trial_ids: list[int] | None, trial_id: int | None) -> list[int]:
    # ``trial_id``: messages from before several trials could share one, and ``celery call`` by hand.
    return list(trial_ids or []) + ([trial_id] if trial_id is not None else [])


@app.task(name="fleet.compile", bind=True, Request="fleet.tasks.lost:NodeAwareRequest")
def compile(self: Task, target: str, trial_ids: list[int] | None = None, trial_id: int | None = None) -> dict:
    """Build (or reuse) each trial's artifact, then send the evaluations of those compiled to ``eval.<target>``."""
    from fleet.workers.execute import compile_trial

    ctx = context(self.request.hostname)
    ctx.lap()  # as in evaluate
    handed: list[int] = []  # trials other compiles gave to this worker's builds, compiled with them
    labels = _labels(self)

    def then(trial_id: int, outcome: str) -> list[Requeue]:
        for other in handed:
            log.info("trial %d compile end: compiled by trial %d's build (task %s)", other, trial_id, self.request.id)
        following = [Requeue(other, target, "evaluate", label=labels.get(other, "")) for other in handed]
        handed.clear()
        if outcome == TrialState.COMPILED:
            following.insert(0, Requeue(trial_id, target, "evaluate", label=labels.get(trial_id, "")))
        elif outcome == "lost":  # a database crash may have taken our claim, and the message with it
            following += ctx.store.resend(trial_id)
        return following + ctx.given_back()

    trials = _ids(trial_ids, trial_id)
    return _each(self, "compile", target, trials, lambda t: compile_trial(ctx, t, handed), then, ctx.healthy)


@app.task(name="fleet.evaluate", bind=True, Request="fleet.tasks.lost:NodeAwareRequest")
def evaluate(self: Task, target: str, trial_ids: list[int] | None = None, trial_id: int | None = None) -> dict:
    """Measure each trial on this worker's device and record it."""
    from fleet.workers.execute import evaluate_trial

    ctx = context(self.request.hostname)
    ctx.lap()  # each trial's time on the slot runs from here, or from the end of the one before it

    def then(trial_id: int, outcome: str) -> list[Requeue]:
        if outcome == "lost":  # as in compile
            return ctx.store.resend(trial_id)
        if outcome == "skipped":
            # An evaluation is sent only once its trial is compiled: a trial found still new was rolled back
            # by a database crash (workers commit without waiting for the disk), and nothing else will send it.
            return ctx.store.resend(trial_id, states=(TrialState.NEW,))
        return ctx.given_back()

    return _each(
        self, "evaluate", target, _ids(trial_ids, trial_id), lambda t: evaluate_trial(ctx, t), then, ctx.healthy
    )


@app.task(name="fleet.anneal_step", bind=True)
def anneal_step(self: Task, chain_id: int, step: int, target: str) -> int | None:
    """One step of an annealing chain: propose, build, measure, accept or reject, record, send the next."""
    from fleet.workers.anneal import anneal_step as run_step

    ctx = context(self.request.hostname)
    following = _waiting_out_outages(self, lambda: run_step(ctx, chain_id, step))
    if following is not None:
        anneal_step.apply_async(kwargs={"chain_id": chain_id, "step": following, "target": target})
    return following
