"""Driving a searcher through its generator protocol, as the campaign driver and the replay simulator both do."""

from __future__ import annotations

from collections import deque
from typing import Any

from fleet.search.base import WAIT, Proposals, Run
from fleet.space import Config

_EMPTY = object()


class Feed:
    """One problem's searcher, driven through its generator protocol.

    Runs wait in an inbox and go in one per ``send``, so a proposal that a send returns is never lost.
    """

    def __init__(self, proposals: Proposals) -> None:
        self.proposals = proposals
        self.started = False
        self.done = False
        self.pending: Any = _EMPTY
        self.inbox: deque[Run] = deque()

    def ask(self) -> Config | None:
        """The next configuration, or None when the searcher waits for runs or has finished."""
        while not self.done:
            if self.pending is not _EMPTY and self.pending is not WAIT:
                config, self.pending = self.pending, _EMPTY
                return config
            if self.pending is WAIT and not self.inbox:
                return None
            try:
                if not self.started:
                    self.started = True
                    self.pending = next(self.proposals)
                else:
                    self.pending = self.proposals.send(self.inbox.popleft() if self.inbox else None)
            except StopIteration:
                self.done = True
        return None

    @property
    def blocked(self) -> bool:
        """Waiting for runs that have all been delivered already: this searcher can do no more."""
        return self.pending is WAIT and not self.inbox
