"""The default strategy: a bandit over several techniques, as OpenTuner's AUC bandit meta-technique.

Its defaults were chosen by replaying the recorded GPU tuning spaces of ../shared/tuning-spaces/ and scoring
as the autotuning methodology of Willemsen et al. (FGCS 2024) does. Annealing and random sampling as members
lowered the score (they spend proposals the others put to better use); the genetic algorithm first in the
tie-breaking order raised it clearly over local search first: while neither has found a new best lately,
the generation's diverse members go before the climb, which otherwise spends its time in whatever basin the
first configurations fell in.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleet.errors import SpecError
from fleet.search.anneal import Annealing
from fleet.search.genetic import Evolving
from fleet.search.local import Climbing
from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher
from fleet.search.random_search import Sampling
from fleet.space import Space

WINDOW = 500
"""Recent uses of a technique that its credit is computed over (OpenTuner's window)."""

EXPLORATION = 0.05
"""Weight of the exploration term against the credit (OpenTuner's C)."""


def _optuna(grid: Grid, history: History, rng: random.Random) -> Technique:
    from fleet.search.optuna_search import Modelling

    return Modelling(grid, history, rng)


TECHNIQUES: dict[str, Callable[[Grid, History, random.Random], Technique]] = {
    "genetic": lambda grid, history, rng: Evolving(grid, history, rng),
    "local": lambda grid, history, rng: Climbing(grid, history, rng),
    "optuna": _optuna,
    "anneal": lambda grid, history, rng: Annealing(grid, history, rng),
    "random": lambda grid, history, rng: Sampling(grid, history, rng),
}

DEFAULT = ("genetic", "local", "optuna")
"""The default techniques, in the order that breaks ties (it matters: see the module docstring)."""


def optuna_installed() -> bool:
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


class Auto(TechniqueSearcher):
    """For a user who does not know which strategy to pick: a bandit that gives each proposal to the technique
    that has lately found new bests most often.

    The techniques (by default the genetic algorithm, local search, and Optuna's TPE when Optuna is installed)
    share one history: each sees every run, so local search climbs from a best that the genetic algorithm
    found, and the model learns from all of them. For each proposal, the techniques are ranked by OpenTuner's
    AUC bandit score: the area under the curve of "this proposal of mine was a new overall best" over its last
    uses, recent ones weighing more, plus an exploration term; the first in rank that has something to
    propose proposes. Known-good configurations given as ``seed_configs`` are measured first.

    N evaluation slots: each slot is filled by the best-ranked technique that has a proposal ready (members of
    the current generation, neighbours of the current best, model samples), so N configurations are in flight
    from several techniques at once; a technique that waits for its own runs passes the slot to the next.

    Parameters
    ----------
    techniques:
        Names among genetic, local, optuna, anneal, random, in tie-breaking order; default genetic, local and
        (when installed) optuna.
    seed_configs:
        Configurations to measure first, e.g. the best known for similar problems; those not in the space, or
        that the space rules out, are skipped.
    """

    name = "auto"

    def __init__(
        self,
        space: Space | None = None,
        *,
        techniques: Sequence[str] | None = None,
        seed_configs: Sequence[Mapping[str, Any]] | None = None,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        if techniques is None:
            techniques = [name for name in DEFAULT if name != "optuna" or optuna_installed()]
        if isinstance(techniques, str) or not techniques:
            raise SpecError("strategy 'auto': techniques must be a list of names")
        for name in techniques:
            if name not in TECHNIQUES:
                known = ", ".join(TECHNIQUES)
                raise SpecError(f"strategy 'auto': unknown technique {name!r} (known: {known})")
        if "optuna" in techniques:
            from fleet.search.optuna_search import load_optuna

            load_optuna()
        self.techniques = list(dict.fromkeys(techniques))
        if seed_configs is not None and (
            isinstance(seed_configs, str | Mapping) or not all(isinstance(c, Mapping) for c in seed_configs)
        ):
            raise SpecError("strategy 'auto': seed_configs must be a list of configurations (objects)")
        self.seed_configs = [dict(c) for c in seed_configs or ()]

    def first_points(self, grid: Grid) -> list[Point]:
        points = (grid.encode(config) for config in self.seed_configs)
        return [p for p in points if p is not None]

    def technique(self, grid: Grid, history: History) -> Technique:
        return Bandit(
            grid,
            history,
            random.Random(self.seed),
            {name: TECHNIQUES[name](grid, history, random.Random(f"{self.seed}:{name}")) for name in self.techniques},
        )


class Bandit(Technique):
    """OpenTuner's AUC bandit over techniques that share one history (see :class:`Auto`).

    Parameters
    ----------
    techniques:
        The techniques by name, in the order that breaks ties.
    window:
        Recent uses of each technique its credit counts.
    exploration:
        Weight of the exploration term.
    """

    def __init__(
        self,
        grid: Grid,
        history: History,
        rng: random.Random,
        techniques: Mapping[str, Technique],
        *,
        window: int = WINDOW,
        exploration: float = EXPLORATION,
    ) -> None:
        super().__init__(grid, history, rng)
        self.techniques = dict(techniques)
        self.exploration = exploration
        self.results: dict[str, deque[bool]] = {name: deque(maxlen=window) for name in self.techniques}
        self.owner: dict[Point, str] = {}
        self.proposed: dict[str, int] = dict.fromkeys(self.techniques, 0)

    def score(self, name: str) -> float:
        """Credit (area under the curve of new bests, later uses weighing more) plus exploration."""
        results = self.results[name]
        uses = len(results)
        if not uses:
            return math.inf
        credit = sum(i for i, new_best in enumerate(results, 1) if new_best) / (uses * (uses + 1) / 2)
        total = sum(len(r) for r in self.results.values())
        return credit + self.exploration * math.sqrt(2 * math.log(total) / uses)

    def ranked(self) -> list[str]:
        # Untried techniques rank first (their score is inf), in the given order; sorted() keeps ties in order.
        return sorted(self.techniques, key=lambda name: -self.score(name))

    def propose(self) -> Point | None:
        for name in self.ranked():
            point = self.techniques[name].propose()
            if point is not None:
                self.owner[point] = name
                self.proposed[name] += 1
                return point
        return None

    def observe(self, point: Point, value: float) -> None:
        name = self.owner.pop(point, None)
        if name is not None:
            # History recorded the point first: it is the best now exactly when it beat every earlier one.
            self.results[name].append(self.history.best == point and math.isfinite(value))
        for technique in self.techniques.values():
            technique.observe(point, value)
