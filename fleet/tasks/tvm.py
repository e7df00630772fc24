"""The ``tvm_measure`` task: build, time and check one TVM trial on an evaluation worker, in one message.

It follows the trial rules of ``compile`` and ``evaluate`` by calling the same worker code: the trial is claimed
with a lease in the database, its (configuration-only) artifact is recorded, then the evaluation claim counts an
attempt and the measurement is recorded once, by the lease holder only. A duplicate delivery is refused by the
claims; work whose lease expired goes back through the reaper as ``compile``/``evaluate``, which the ``tvm``
workload serves as well.
"""

from __future__ import annotations

from celery import Task

from fleet.celery_app import app
from fleet.states import TrialState
from fleet.tasks.lifecycle import context
from fleet.tasks.sending import send


@app.task(name="fleet.tvm_measure", bind=True, Request="fleet.tasks.lost:NodeAwareRequest")
def tvm_measure(self: Task, trial_id: int, target: str) -> str:
    """Build the trial's schedule for this worker's target, time it, check it against NumPy, record it."""
    from fleet.workers.execute import compile_trial, evaluate_trial

    ctx = context(self.request.hostname)
    ctx.lap()  # the build's time on the slot runs from here, then the measurement's from the build's end
    outcome = compile_trial(ctx, trial_id)
    if outcome == "skipped" and ctx.store.trial(trial_id).state != TrialState.COMPILED:
        return outcome  # another worker holds it, or it is finished
    if outcome in (TrialState.COMPILED, "skipped"):
        outcome = evaluate_trial(ctx, trial_id)
    send(ctx.given_back())  # a node's fault, or a trial of another target: back to its queue
    return outcome
