"""A space-filling first design: a Latin hypercube over the knobs' value indices, snapped to valid configurations.

Why not random draws, and why not Optuna's QMC sampler: a few dozen evaluations is the whole horizon on some
recorded spaces, and there a design that spreads its points over every knob's range is the safest start (it is
random search's equal in expectation and never a cluster). Optuna's ``QMCSampler`` needs scipy and knows nothing
of a space's constraints; a Latin hypercube on the value indices needs neither, and each point it places on an
invalid configuration moves one knob at a time to the nearest valid one it finds, keeping the other knobs'
strata.
"""

from __future__ import annotations

import random

from fleet.search.points import Grid, History, Point, Technique

REPAIR_TRIES = 30
"""Single-knob moves tried on a design point that the space rules out (or that was measured) before a random
valid configuration takes its place."""


def latin_hypercube(grid: Grid, count: int, rng: random.Random, seen: dict[Point, None] | None = None) -> list[Point]:
    """``count`` distinct valid points not in ``seen``, spread as a Latin hypercube over each knob's values.

    Each knob's range is cut into ``count`` equal strata and each stratum gets one point, in an independent random
    order per knob: with ``count`` at most a knob's number of values, no two points share its value; with more,
    each value gets ``count / size`` points, give or take one. A point the space rules out is repaired (see
    :data:`REPAIR_TRIES`); fewer than ``count`` points come back only when the space has fewer left.

    Parameters
    ----------
    grid:
        The space's points.
    count:
        How many points.
    rng:
        The random generator (the design is a pure function of its state).
    seen:
        Points not to propose (measured already).
    """
    taken: dict[Point, None] = dict(seen or {})
    columns = []
    for size in grid.sizes:
        order = list(range(count))
        rng.shuffle(order)
        columns.append([min(size - 1, int((stratum + rng.random()) * size / count)) for stratum in order])
    points: list[Point] = []
    for row in range(count):
        point = _repair(grid, tuple(column[row] for column in columns), rng, taken)
        if point is None:
            break
        taken[point] = None
        points.append(point)
    return points


def _repair(grid: Grid, point: Point, rng: random.Random, taken: dict[Point, None]) -> Point | None:
    if point not in taken and grid.is_valid(point):
        return point
    tunable = grid.tunable()
    moved = point
    for _ in range(REPAIR_TRIES if tunable else 0):
        # A walk of single-knob moves: constraints such as "x * y <= 1024" often need two knobs changed.
        moved = grid.mutate(moved, rng.choice(tunable), rng)
        if moved not in taken and grid.is_valid(moved):
            return moved
    return grid.random_point(rng, taken)


class Designing(Technique):
    """A Latin hypercube design as a technique: its points, in order, then nothing.

    Parameters
    ----------
    count:
        Points in the design.
    """

    def __init__(self, grid: Grid, history: History, rng: random.Random, *, count: int) -> None:
        super().__init__(grid, history, rng)
        self.count = count
        self.todo: list[Point] | None = None

    def propose(self) -> Point | None:
        if self.todo is None:
            self.todo = latin_hypercube(self.grid, self.count, self.rng, self.history.seen)
        while self.todo:
            point = self.todo.pop(0)
            if point not in self.history.seen:
                return point
        return None
