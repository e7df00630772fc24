"""Greedy local search with random restarts."""

from __future__ import annotations

import math
import random

from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher


class Local(TechniqueSearcher):
    """Hill-climb over neighbours; restart from a random configuration at a local optimum.

    The neighbours of a configuration are those one knob away: first those at a neighbouring value of the
    knob, then the others, each group in random order. The climb moves to the first neighbour that beats the
    current configuration and goes on from there; when every neighbour has been measured and none is better,
    that is a local optimum, and the climb starts again from a new random configuration. A new overall best
    that it hears of (in ``auto``, found by another technique) becomes its current configuration.

    N evaluation slots: up to N neighbours of the current configuration are measured at once; the climb moves
    as soon as one comes back better, and waits only when the current one has no neighbour left to try, or for
    the first run of a restart.
    """

    name = "local"

    def technique(self, grid: Grid, history: History) -> Technique:
        return Climbing(grid, history, random.Random(self.seed))


class Climbing(Technique):
    """The climb as a technique (see :class:`Local`)."""

    def __init__(self, grid: Grid, history: History, rng: random.Random) -> None:
        super().__init__(grid, history, rng)
        self.current: Point | None = None
        self.current_loss = math.inf
        self.start: Point | None = None  # a restart, out
        self.followed: Point | None = None  # the last overall best climbed from
        self.queue: list[Point] = []
        self.mine: set[Point] = set()

    def _go(self, point: Point, value: float) -> None:
        self.current, self.current_loss = point, value
        near, far = self.grid.split_moves(point)
        self.rng.shuffle(near)
        self.rng.shuffle(far)
        self.queue = near + far

    def propose(self) -> Point | None:
        best = self.history.best
        if best is not None and best != self.followed and self.history.best_loss < self.current_loss:
            self.followed = best
            self._go(best, self.history.best_loss)
        if self.current is None:
            if self.start is not None:
                return None  # the restart is out: its neighbours come after it
            self.start = self.random_point()
            if self.start is not None:
                self.mine.add(self.start)
            return self.start
        while self.queue:
            point = self.queue.pop(0)
            if point not in self.history.seen:
                self.mine.add(point)
                return point
        if self.mine:
            return None  # neighbours still out may yet move the climb
        # A local optimum: start again.
        self.current, self.current_loss = None, math.inf
        return self.propose()

    def observe(self, point: Point, value: float) -> None:
        if point not in self.mine:
            return
        self.mine.discard(point)
        if point == self.start:
            self.start = None
        if value < self.current_loss:
            self._go(point, value)
