"""How fast a campaign's trials go, as its driver sees them finish: whether they may share messages.

A Celery message costs about what a cheap trial's whole bookkeeping costs, so trials that take a few
milliseconds go several to a message (``fleet.tasks.send``'s ``batch``). Trials that take seconds gain
nothing from it and would lose the slots' parallelism, so they go one to a message. Nothing is known when
a campaign starts: its driver sends a few trials first (:attr:`Pace.probe`) and looks at how long their
workers took over them (a trial's ``eval_seconds``), or, until a worker has timed one, at how soon they
come back. How soon they come back says little once campaigns share a queue: it is mostly the wait behind
the others' trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleet.messages import CHEAP_SECONDS

PROBE_SECONDS = 0.5
"""The first trials coming back within this long are taken to be cheap; none back by then, to be slow."""

MAX_BATCH = 32
"""Most trials in one message: enough that the message costs little per trial."""

MEASURE_SECONDS = 1.0
"""The pace is measured again over each span this long in which trials came back."""

QUIET_SECONDS = 5.0
"""No trial back for this long: the trials are slow. A shorter span without one says little: campaigns that
share a queue see their trials back a message at a time, behind the other campaigns' messages."""

SLOT_DEPTH = 4
"""Messages a submitted campaign's target keeps in flight per evaluation slot: enough that no slot waits on
a driver while trials take seconds."""

HORIZON_SECONDS = 1.0
"""Cheap trials in flight per slot cover this much of its work. A driver polls every quarter second or so:
fewer, and a slot empties its queue between two polls and waits (20 campaigns of cheap trials ran at 0.66 of
their first rate once most had ended, each left with one message in flight). A slot's work is timed by the
workers (a trial's ``eval_seconds``), not by how soon the campaign's trials come back: campaigns sharing a
queue get it in proportion to what they keep in flight, so one that got more saw faster trials and kept
more, and twenty equal campaigns drifted apart until the slowest had done two thirds of its trials when the
first ended."""

MAX_DEPTH = 32
"""Most messages in flight per slot, however cheap the trials."""


class Pace:
    """Trials finished per second per slot, and the batch size that follows from it.

    Parameters
    ----------
    slots:
        The campaign's evaluation slots: its share of its target's, when other campaigns run there too
        (it sees only its own trials finish).
    """

    def __init__(self, slots: float = 1.0) -> None:
        self.slots = slots
        self.seconds: float | None = None  # slot-seconds per trial; None until the first trials say
        self.work: float | None = None  # seconds an evaluation slot spent per trial, as the workers timed them
        self.build: float | None = None  # and a build slot per trial: a build's time, shared by those using it
        self._since: float | None = None
        self._finished = 0
        self._evaluated: list[float] = []
        self._compiled: list[float] = []

    @property
    def probing(self) -> bool:
        """Whether the first trials are still out: the driver then sends no more than :attr:`probe`."""
        return self.seconds is None

    @property
    def probe(self) -> int:
        """Trials to send before the pace is known: two per slot, so that no slot waits meanwhile."""
        return max(2, math.ceil(2 * self.slots))

    @property
    def slot_seconds(self) -> float | None:
        """A slot's seconds per trial: as the workers timed them, else at the pace they came back."""
        return self.work if self.work is not None else self.seconds

    @property
    def cheap(self) -> bool:
        """Whether trials may share messages: cheap to evaluate, and to compile (a grid of compiler flags
        builds for every trial: its messages are compile messages, and its builds are what is slow)."""
        seconds = self.slot_seconds
        building = self.build is not None and self.build > CHEAP_SECONDS
        return seconds is not None and seconds <= CHEAP_SECONDS and not building

    def sent(self, now: float) -> None:
        """Trials were sent at ``now``; the first call starts the clock."""
        if self._since is None:
            self._since = now

    def finished(self, count: int, now: float, evaluated: Sequence[float] = (), compiled: Sequence[float] = ()) -> None:
        """``count`` more trials were seen finished at ``now``.

        Parameters
        ----------
        evaluated, compiled:
            The seconds that evaluation and build slots spent on those of them that workers timed (a trial
            that errored in its build was not evaluated; one handed to another's build did not build).
        """
        if self._since is None:
            return
        self._finished += count
        self._evaluated += evaluated
        self._compiled += compiled
        elapsed = now - self._since
        if self.seconds is None and not self._finished:
            if elapsed > PROBE_SECONDS:
                self.seconds = float("inf")  # none back yet: slow, until trials say otherwise
            return
        if self.seconds is None:
            # Untimed, a first trial back this soon is cheap enough to try: its time is mostly the messages'
            # and the polls' latency, not its work. A worker finding a message's trials slow sends the rest on.
            self.seconds = CHEAP_SECONDS
        elif self._finished and elapsed >= MEASURE_SECONDS:
            self.seconds = self.slots * elapsed / self._finished
        elif elapsed >= QUIET_SECONDS:
            # The trials have become slow, or stopped coming back.
            self.seconds, self.work, self.build = float("inf"), None, None
        else:
            # The first that workers timed (behind another campaign's queue, or after a quiet spell) say how
            # long trials take at once: a second more at the wrong batch size is a second lost.
            self._timed(only_unknown=True)
            return
        self._timed(only_unknown=False)
        self._since, self._finished, self._evaluated, self._compiled = now, 0, [], []

    def _timed(self, only_unknown: bool) -> None:
        """Take the slots' time per trial from the trials timed since the span began."""
        if self._evaluated and not (only_unknown and self.work is not None):
            self.work = sum(self._evaluated) / len(self._evaluated)
        if self._compiled and not (only_unknown and self.build is not None):
            # Per trial back, not per build: a trial whose artifact was built already only looks it up (a
            # compile that is not timed). Per build, one slow build among ten that 5,000 trials shared
            # made a campaign slow, one trial in flight, until its next build, which at that pace never came.
            self.build = sum(self._compiled) / max(self._finished, len(self._compiled))
        elif self.build is not None and not only_unknown:
            self.build = 0.0  # trials back and none built: their artifacts were there

    def depth(self) -> float:
        """Messages to keep in flight per evaluation slot of the target: :data:`SLOT_DEPTH`, or for cheap
        trials enough for :data:`HORIZON_SECONDS` of a slot's work, as the workers timed it (at the pace
        the trials come back until they have)."""
        if not self.cheap:
            return SLOT_DEPTH
        seconds = self.slot_seconds
        assert seconds is not None
        return min(MAX_DEPTH, max(SLOT_DEPTH, HORIZON_SECONDS / (max(seconds, 1e-6) * MAX_BATCH)))

    def batch(self, waiting: int) -> int:
        """Trials per message for ``waiting`` trials about to be sent: several only when trials are cheap,
        and few enough that every slot gets two messages of them."""
        if not self.cheap:
            return 1
        return max(1, min(MAX_BATCH, int(waiting / (2 * self.slots))))
