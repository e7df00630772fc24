"""A genetic algorithm: tournament selection, uniform crossover, mutation."""

from __future__ import annotations

import math
import random
from typing import Any

from fleet.errors import SpecError
from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher
from fleet.space import Space

POPULATION = 20
TOURNAMENT = 2
TRIES = 20
"""Children drawn before one that is valid and new is given up for a random configuration."""


def check_breeding(strategy: str, population: Any, mutation: Any) -> None:
    """SpecError unless ``population`` is an integer >= 2 and ``mutation`` a probability (or None, the default).

    Parameters
    ----------
    strategy:
        The strategy's name, for the message.
    population, mutation:
        Its options.
    """
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        raise SpecError(f"strategy {strategy!r}: population must be an integer >= 2, not {population!r}")
    if mutation is not None and (
        isinstance(mutation, bool) or not isinstance(mutation, int | float) or not 0 <= mutation <= 1
    ):
        raise SpecError(f"strategy {strategy!r}: mutation must be a probability, not {mutation!r}")


class Genetic(TechniqueSearcher):
    """A generational genetic algorithm over the knobs' value indices.

    The first generation is ``population`` random configurations. Each next one is bred from the best
    ``population`` configurations measured so far (failed runs left out): two parents by tournament, a child
    by uniform crossover (each knob from either parent), then each knob mutated with probability ``mutation``
    (to a neighbouring value half the time, else to any other). A child that the space rules out or that was
    measured already is drawn again; after a few tries, a random new configuration takes its place.

    N evaluation slots: a generation's members are independent, so N of them are measured at once; the next
    generation is bred when the whole current one has come back.

    Parameters
    ----------
    population:
        Configurations per generation, and the size of the pool parents are drawn from.
    mutation:
        Probability that a knob of a child mutates; default 1 / the number of knobs with several values.
    tournament:
        Configurations drawn for each tournament; the best of them is a parent.
    """

    name = "genetic"

    def __init__(
        self,
        space: Space | None = None,
        *,
        population: int = POPULATION,
        mutation: float | None = None,
        tournament: int = TOURNAMENT,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        check_breeding(self.name, population, mutation)
        if isinstance(tournament, bool) or not isinstance(tournament, int) or tournament < 1:
            raise SpecError(f"strategy 'genetic': tournament must be a positive integer, not {tournament!r}")
        self.population, self.mutation, self.tournament = population, mutation, tournament

    def technique(self, grid: Grid, history: History) -> Technique:
        return Evolving(
            grid,
            history,
            random.Random(self.seed),
            population=self.population,
            mutation=self.mutation,
            tournament=self.tournament,
        )


class Evolving(Technique):
    """The genetic algorithm as a technique (see :class:`Genetic`)."""

    def __init__(
        self,
        grid: Grid,
        history: History,
        rng: random.Random,
        *,
        population: int = POPULATION,
        mutation: float | None = None,
        tournament: int = TOURNAMENT,
    ) -> None:
        super().__init__(grid, history, rng)
        self.size = population
        tunable = grid.tunable()
        self.mutation = mutation if mutation is not None else 1 / max(1, len(tunable))
        self.tournament = tournament
        self.pool: list[tuple[float, int, Point]] = []  # (loss, arrival, point): the best measured, sorted
        self.arrivals = 0
        self.todo: list[Point] = []
        self.mine: set[Point] = set()

    def propose(self) -> Point | None:
        while True:
            while self.todo:
                point = self.todo.pop(0)
                if point not in self.history.seen:
                    self.mine.add(point)
                    return point
            if self.mine:
                return None  # the generation is still out
            self.todo = self._breed()
            if not self.todo:
                return None  # nothing new left in the space

    def _breed(self) -> list[Point]:
        children: list[Point] = []
        taken = set(self.history.seen)
        for _ in range(self.size):
            child = self._child(taken) if self.pool else None
            if child is None:
                child = self.grid.random_point(self.rng, taken)
            if child is None:
                break
            taken.add(child)
            children.append(child)
        return children

    def _child(self, taken: set[Point]) -> Point | None:
        tunable = self.grid.tunable()
        for _ in range(TRIES):
            first, second = self._select(), self._select()
            child = tuple(a if self.rng.random() < 0.5 else b for a, b in zip(first, second, strict=True))
            for knob in tunable:
                if self.rng.random() < self.mutation:
                    child = self.grid.mutate(child, knob, self.rng)
            if child not in taken and self.grid.is_valid(child):
                return child
        return None

    def _select(self) -> Point:
        # The pool is sorted, so the best of k random entries is the one with the lowest position.
        return self.pool[min(self.rng.randrange(len(self.pool)) for _ in range(self.tournament))][2]

    def observe(self, point: Point, value: float) -> None:
        self.mine.discard(point)
        if not math.isfinite(value):
            return
        if len(self.pool) >= self.size and value >= self.pool[-1][0]:
            return
        self.arrivals += 1
        self.pool.append((value, self.arrivals, point))
        self.pool.sort()
        del self.pool[self.size :]
