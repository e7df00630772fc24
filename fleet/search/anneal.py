"""Simulated annealing: several independent chains, each walking to neighbours accepted by temperature.

:func:`neighbour`, :func:`accept` and :func:`temperature` are pure functions of their arguments, so that the
``anneal_step`` task runs the same chains on the fleet, one step per task, with no driver.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fleet.errors import SpecError
from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher
from fleet.space import Config, Space

TEMPERATURE = 0.05
"""Default starting temperature: a run 5% worse than the chain's current one is accepted with p = 1/e. On the
recorded GPU spaces, starting temperatures from 0.02 to 0.1 scored alike, and 1.0 far worse: chains that
accept much worse kernels spend their time measuring slow ones."""

COOLING = 0.95
"""Default factor the temperature is multiplied by at each step of a chain."""

RESTART = 30
"""Default steps without improving the chain's best before the chain starts again from a random point."""

FREE_MOVES = 20
"""Neighbours already measured (taken or refused at no cost) before a chain gives up and starts again."""


def neighbour(space: Space, config: Config, rng: random.Random) -> Config:
    """A random valid configuration one knob away from ``config``.

    The knob is drawn uniformly among those with several values; it moves to a neighbouring value half the
    time, else to any other. When no such move is valid, a random valid configuration; ``config`` itself only
    when the space offers nothing else.
    """
    grid = Grid(space)
    point = grid.encode(config)
    if point is None:
        raise SpecError(f"configuration {config} is not in the space")
    moved = neighbour_point(grid, point, rng) or grid.random_point(rng, {point: None})
    return grid.decode(moved) if moved is not None else dict(config)


def neighbour_point(grid: Grid, point: Point, rng: random.Random, tries: int = 20) -> Point | None:
    """:func:`neighbour` on points: a few random moves, then any valid move; None when there is none."""
    tunable = grid.tunable()
    if not tunable:
        return None
    for _ in range(tries):
        moved = grid.mutate(point, rng.choice(tunable), rng)
        if grid.is_valid(moved):
            return moved
    moves = grid.moves(point)
    return rng.choice(moves) if moves else None


def accept(
    current: float | None, candidate: float | None, temperature: float, rng: random.Random, maximize: bool = False
) -> bool:
    """Whether a chain at objective ``current`` moves to ``candidate`` (None: the run failed).

    A better or equal candidate is taken; a worse one with probability exp(-d / temperature), where d is how
    much worse it is relative to the current objective (0.1 for 10% slower), so the temperature means the
    same on any scale. A failed run is never taken, unless the chain stands on a failed one too.
    """
    if candidate is None:
        return current is None
    if current is None:
        return True
    worse = current - candidate if maximize else candidate - current
    if worse <= 0:
        return True
    if temperature <= 0:
        return False
    relative = worse / (abs(current) or 1.0)
    return rng.random() < math.exp(-relative / temperature)


def temperature(step: int, start: float = TEMPERATURE, cooling: float = COOLING) -> float:
    """The temperature of a chain at step ``step``: geometric cooling from ``start``."""
    return start * cooling**step


@dataclass
class _Chain:
    current: Point | None = None
    current_loss: float = math.inf
    waiting: Point | None = None
    step: int = 0
    best_loss: float = math.inf
    stale: int = 0


class Anneal(TechniqueSearcher):
    """Simulated annealing with several independent chains.

    Each chain starts at a random configuration and proposes a neighbour of its current one (:func:`neighbour`),
    moves there by :func:`accept` at the chain's temperature, and cools geometrically (:func:`temperature`).
    A neighbour measured already is taken or refused at no cost. A chain that has not improved its best for
    ``restart`` steps, or finds no new neighbour, starts again from a new random configuration, hot again.

    N evaluation slots: N chains in flight, one step each. A chain is started whenever the driver asks for a
    configuration and every chain is waiting for its run, so there are as many chains as slots (or ``chains``
    when given).

    Parameters
    ----------
    chains:
        The number of chains; default one per evaluation slot.
    temperature:
        Starting temperature (see :func:`accept`).
    cooling:
        Factor applied to the temperature at each step.
    restart:
        Steps without improvement before a chain starts again.
    on_fleet:
        Run the chains as ``anneal_step`` tasks on the fleet, with no driver (the campaign layer's choice).
    """

    name = "anneal"

    def __init__(
        self,
        space: Space | None = None,
        *,
        chains: int | None = None,
        temperature: float = TEMPERATURE,
        cooling: float = COOLING,
        restart: int = RESTART,
        on_fleet: bool = False,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        if chains is not None and (isinstance(chains, bool) or not isinstance(chains, int) or chains < 1):
            raise SpecError(f"strategy 'anneal': chains must be a positive integer, not {chains!r}")
        if not (isinstance(temperature, int | float) and temperature >= 0):
            raise SpecError(f"strategy 'anneal': temperature must be a number >= 0, not {temperature!r}")
        if not (isinstance(cooling, int | float) and 0 < cooling <= 1):
            raise SpecError(f"strategy 'anneal': cooling must be in (0, 1], not {cooling!r}")
        if isinstance(restart, bool) or not isinstance(restart, int) or restart < 1:
            raise SpecError(f"strategy 'anneal': restart must be a positive integer, not {restart!r}")
        self.chains, self.temperature, self.cooling, self.restart = chains, temperature, cooling, restart
        self.on_fleet = on_fleet

    def technique(self, grid: Grid, history: History) -> Technique:
        return Annealing(
            grid,
            history,
            random.Random(self.seed),
            chains=self.chains,
            start=self.temperature,
            cooling=self.cooling,
            restart=self.restart,
        )


class Annealing(Technique):
    """The annealing chains as a technique (see :class:`Anneal`)."""

    def __init__(
        self,
        grid: Grid,
        history: History,
        rng: random.Random,
        *,
        chains: int | None = None,
        start: float = TEMPERATURE,
        cooling: float = COOLING,
        restart: int = RESTART,
    ) -> None:
        super().__init__(grid, history, rng)
        self.most = chains
        self.start, self.cooling, self.restart = start, cooling, restart
        self.chains: list[_Chain] = []

    def propose(self) -> Point | None:
        for chain in self.chains:
            if chain.waiting is None:
                point = self._step(chain)
                if point is not None:
                    return point
        if self.most is None or len(self.chains) < self.most:
            chain = _Chain()
            point = self._step(chain)
            if point is not None:
                self.chains.append(chain)
            return point
        return None

    def _step(self, chain: _Chain) -> Point | None:
        """The chain's next point to measure, taking or refusing measured neighbours on the way."""
        for _ in range(FREE_MOVES):
            if chain.current is None:
                break
            candidate = neighbour_point(self.grid, chain.current, self.rng)
            if candidate is None:
                break
            if candidate not in self.history.seen:
                chain.waiting = candidate
                return candidate
            known = self.history.losses.get(candidate)
            if known is not None:
                self._move(chain, candidate, known)
        # A new chain, a restart, or a chain whose neighbourhood is used up: start from a random point.
        chain.current, chain.current_loss, chain.step, chain.stale = None, math.inf, 0, 0
        chain.best_loss = math.inf
        point = self.random_point()
        chain.waiting = point
        return point

    def _move(self, chain: _Chain, point: Point, value: float) -> None:
        chain.step += 1
        heat = temperature(chain.step, self.start, self.cooling)
        current = chain.current_loss if math.isfinite(chain.current_loss) else None
        candidate = value if math.isfinite(value) else None
        if accept(current, candidate, heat, self.rng):
            chain.current, chain.current_loss = point, value
        if value < chain.best_loss:
            chain.best_loss, chain.stale = value, 0
        else:
            chain.stale += 1
        if chain.stale >= self.restart:
            chain.current = None

    def observe(self, point: Point, value: float) -> None:
        for chain in self.chains:
            if chain.waiting == point:
                chain.waiting = None
                if chain.current is None:
                    # The chain's first point: it stands there if it ran.
                    if math.isfinite(value):
                        chain.current, chain.current_loss, chain.best_loss = point, value, value
                else:
                    self._move(chain, point, value)
                return
