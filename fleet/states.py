"""Where trials, campaigns, chains and artifacts stand: each state named once, and the groups the code asks about.

The members are ``StrEnum``s, so a state read back from the database (a plain string) compares equal to its
member, and a member written to the database, a JSON message or a CLI line is its plain value. Nothing else in
``fleet`` writes a state as a bare string (``tests/unit/test_states.py``); the migrations keep their literals,
since a migration must not change when the code does.
"""

from __future__ import annotations

from enum import StrEnum


class TrialState(StrEnum):
    """A trial's lifecycle: ``new -> compiling -> compiled -> evaluating -> evaluated``, or one of the ends."""

    NEW = "new"
    COMPILING = "compiling"
    COMPILED = "compiled"
    EVALUATING = "evaluating"
    EVALUATED = "evaluated"
    ERRORED = "errored"  # with the reason: the build or the run failed
    INVALID = "invalid"  # measured, but its output or its configuration was wrong
    CANCELLED = "cancelled"  # its campaign was cancelled before it ended


class CampaignStatus(StrEnum):
    """``running -> done``, or paused (no new trials; resumable), cancelled, or failed (with the reason)."""

    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


class ChainState(StrEnum):
    """A simulated-annealing chain: it runs until its steps are spent, or its campaign is cancelled."""

    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"  # with its campaign; reopening the campaign runs it again


class ArtifactState(StrEnum):
    BUILDING = "building"
    BUILT = "built"
    FAILED = "failed"


TRIAL_STATES: tuple[TrialState, ...] = tuple(TrialState)
# Waiting for a task to be sent: to be compiled, or compiled and waiting for an evaluation slot.
WAITING = (TrialState.NEW, TrialState.COMPILED)
# Leased to a worker, which is building or measuring it.
LEASED = (TrialState.COMPILING, TrialState.EVALUATING)
# Where a trial ends: nothing moves it on from there.
TERMINAL = (TrialState.EVALUATED, TrialState.ERRORED, TrialState.INVALID, TrialState.CANCELLED)
UNFINISHED = tuple(state for state in TrialState if state not in TERMINAL)
# Ended by a worker (a cancelled trial was never finished by one).
FINISHED = (TrialState.EVALUATED, TrialState.ERRORED, TrialState.INVALID)
# Ended with a run's samples and metrics: an invalid run keeps them too.
MEASURED = (TrialState.EVALUATED, TrialState.INVALID)
# Ended without a valid measurement, for a reason worth showing.
FAILED = (TrialState.ERRORED, TrialState.INVALID)

CAMPAIGN_STATUSES: tuple[CampaignStatus, ...] = tuple(CampaignStatus)
# A driver's work to do: a paused campaign is still driven (its running trials end), it only sends no new ones.
DRIVEN = (CampaignStatus.RUNNING, CampaignStatus.PAUSED)
ENDED = (CampaignStatus.DONE, CampaignStatus.CANCELLED, CampaignStatus.FAILED)
