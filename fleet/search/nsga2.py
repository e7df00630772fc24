"""NSGA-II over the knobs' value indices: a search for the Pareto front of several objectives."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from fleet.search.base import WAIT, Proposals, Run, Searcher
from fleet.search.design import latin_hypercube
from fleet.search.genetic import check_breeding
from fleet.search.pareto import Loss, Objective, crowding_distance, finite, loss_vector, non_dominated_sort
from fleet.search.points import Grid, Point
from fleet.space import Space

POPULATION = 6
"""Configurations per generation: chosen out of sample by ``fleet bench pareto --cv`` (docs/strategies.md)."""

CROSSOVER = 0.9
"""Probability that a child is bred by crossover of its two parents rather than copied from the first (Deb's)."""

TRIES = 20
"""Children drawn before one that is valid and new is given up for a random configuration."""


class NSGA2(Searcher):
    """NSGA-II (Deb et al., 2002): each generation is bred from the best ``population`` configurations measured so
    far, "best" by Pareto rank and, within a rank, by crowding distance, so that the front is both pushed forward
    and kept spread out.

    The first generation is a Latin hypercube of ``population`` configurations (:mod:`fleet.search.design`). When
    a whole generation is back, the survivors are chosen from the previous survivors and the new generation
    (elitism): non-dominated sorting ranks them, the fronts go in by rank, and the last front that fits only in
    part gives its most isolated points (the largest crowding distance). The next generation's children are bred
    from the survivors: two parents by binary tournament (lower rank wins, then larger crowding distance), a child
    by uniform crossover (with probability :data:`CROSSOVER`, else a copy of the first), then each knob mutated
    with probability ``mutation`` (to a neighbouring value half the time, else to any other). A child that the
    space's constraints rule out, or that was measured already, is drawn again; after a few tries a random valid
    configuration takes its place. A run that failed (errored, invalid, an objective missing) never survives.

    Deterministic for a seed, whatever order the runs of a generation come back in: the survivors are chosen from
    the whole generation, sorted by configuration.

    N evaluation slots: a generation's members are independent, so N of them are measured at once; the next one is
    bred when the whole generation is back.

    Parameters
    ----------
    objectives:
        The campaign's objectives, in order (a run's ``objectives`` are keyed by their names); None or one: the
        run's single objective, which makes this a plain elitist genetic algorithm.
    population:
        Configurations per generation, and survivors kept.
    mutation:
        Probability that a knob of a child mutates; default 1 / the number of knobs with several values.
    """

    name = "nsga2"
    is_dynamic = True
    pareto = True

    def __init__(
        self,
        space: Space | None = None,
        *,
        objectives: Sequence[Objective] | None = None,
        population: int = POPULATION,
        mutation: float | None = None,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        check_breeding(self.name, population, mutation)
        self.objectives = list(objectives) if objectives else [Objective("objective", maximize)]
        self.population, self.mutation = population, mutation

    def losses(self, run: Run) -> Loss:
        """The run's loss vector; all inf when it failed or a predicate rejects it."""
        if not self.accepts(run):
            return (math.inf,) * len(self.objectives)
        if len(self.objectives) == 1 and not run.objectives:
            return loss_vector({self.objectives[0].name: run.objective}, self.objectives)
        return loss_vector(run.objectives, self.objectives)

    def generate(self) -> Proposals:
        grid = Grid(self.space)
        rng = random.Random(self.seed)
        mutation = self.mutation if self.mutation is not None else 1 / max(1, len(grid.tunable()))
        seen: dict[Point, None] = {}  # proposed, in order
        out: set[Point] = set()  # proposed, not back yet
        measured: dict[Point, Loss] = {}  # back with every objective
        survivors: list[Point] = []
        rank: dict[Point, tuple[int, float]] = {}  # a survivor's (front, -crowding): lower is better
        todo = latin_hypercube(grid, self.population, rng, seen)
        proposed = 0
        run: Run | None = None
        while self.budget is None or proposed < self.budget:
            if run is not None:
                point = grid.encode(run.config)
                if point is not None and point in out:
                    out.discard(point)
                    loss = self.losses(run)
                    if finite(loss):
                        measured[point] = loss
            todo = [p for p in todo if p not in seen]
            if not todo:
                if out:
                    run = yield WAIT  # the generation is still out
                    continue
                # The pool is the last survivors and the generation just back: measured keeps only those.
                survivors, rank = self._select(measured)
                measured = {p: measured[p] for p in survivors}
                todo = self._breed(grid, survivors, rank, seen, rng, mutation)
                if not todo:
                    return  # nothing new left in the space
            point = todo.pop(0)
            seen[point] = None
            out.add(point)
            proposed += 1
            run = yield grid.decode(point)

    def _select(self, measured: dict[Point, Loss]) -> tuple[list[Point], dict[Point, tuple[int, float]]]:
        """The next survivors among ``measured`` (the last survivors and the generation just back), with each one's
        rank."""
        pool = sorted(measured)  # sorted: the order the runs came back in is moot
        fronts = non_dominated_sort([measured[p] for p in pool])
        chosen: list[Point] = []
        rank: dict[Point, tuple[int, float]] = {}
        for number, members in enumerate(fronts):
            distance = crowding_distance([measured[pool[i]] for i in members])
            order = sorted(range(len(members)), key=lambda k: (-distance[k], pool[members[k]]))
            for k in order[: self.population - len(chosen)]:
                chosen.append(pool[members[k]])
                rank[pool[members[k]]] = (number, -distance[k])
            if len(chosen) >= self.population:
                break
        return chosen, rank

    def _breed(
        self,
        grid: Grid,
        survivors: list[Point],
        rank: dict[Point, tuple[int, float]],
        seen: dict[Point, None],
        rng: random.Random,
        mutation: float,
    ) -> list[Point]:
        children: list[Point] = []
        taken = dict(seen)
        tunable = grid.tunable()
        for _ in range(self.population):
            child = None
            for _ in range(TRIES if survivors else 0):
                first, second = self._tournament(survivors, rank, rng), self._tournament(survivors, rank, rng)
                if rng.random() < CROSSOVER:
                    drawn = tuple(a if rng.random() < 0.5 else b for a, b in zip(first, second, strict=True))
                else:
                    drawn = first
                for knob in tunable:
                    if rng.random() < mutation:
                        drawn = grid.mutate(drawn, knob, rng)
                if drawn not in taken and grid.is_valid(drawn):
                    child = drawn
                    break
            if child is None:
                child = grid.random_point(rng, taken)
            if child is None:
                break
            taken[child] = None
            children.append(child)
        return children

    @staticmethod
    def _tournament(survivors: list[Point], rank: dict[Point, tuple[int, float]], rng: random.Random) -> Point:
        a, b = survivors[rng.randrange(len(survivors))], survivors[rng.randrange(len(survivors))]
        return a if rank[a] <= rank[b] else b
