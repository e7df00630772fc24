"""``fleet call anneal-step`` waits for its chain's first step: a step recorded as the chain stops is never missed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fleet.ops.call import wait
from fleet.states import ChainState


class StepsThenStop:
    """A chain whose first step is recorded, and which stops, just after each read of its steps: the moment at which
    the steps read before the state missed the step (the state read after said it had stopped)."""

    def __init__(self) -> None:
        self.stopped = False

    def chain(self, chain_id: int) -> Any:
        return SimpleNamespace(
            id=chain_id, campaign_id=1, state=ChainState.DONE if self.stopped else ChainState.RUNNING
        )

    def chain_steps(self, campaign_id: int) -> list[tuple[Any, Any]]:
        found = [(SimpleNamespace(id=7), SimpleNamespace(step=0, trial_id=3))] if self.stopped else []
        self.stopped = True
        return found


def test_a_step_recorded_as_its_chain_stops_is_the_answer() -> None:
    done = wait(StepsThenStop(), "step", 7, poll=0.01, timeout=5)
    assert done is not None and (done.step, done.trial_id) == (0, 3)


def test_a_chain_that_stopped_without_the_step_answers_none() -> None:
    store = StepsThenStop()
    store.stopped = True
    assert wait(store, "step", 8, poll=0.01, timeout=5) is None  # chain 8 has no step of its own
