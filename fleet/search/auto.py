"""The default strategy: a space-filling design, then a bandit over several techniques, as OpenTuner's AUC
bandit meta-technique, with each technique's credit counted per second its proposals cost.

Its defaults are judged out of sample: ``fleet bench search --cv`` chooses the design's size on all recorded
spaces but one and scores it on the one left out (docs/strategies.md has the figures). Annealing and random
sampling as members lowered the score (they spend proposals the others put to better use); the genetic
algorithm first in the tie-breaking order raised it over local search first.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleet.errors import SpecError
from fleet.search.anneal import Annealing
from fleet.search.design import Designing
from fleet.search.genetic import Evolving
from fleet.search.history import Transferred, first_count, from_options
from fleet.search.local import Climbing
from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher
from fleet.search.random_search import Sampling
from fleet.space import Space

WINDOW = 500
"""Recent uses of a technique that its credit is computed over (OpenTuner's window)."""

EXPLORATION = 0.05
"""Weight of the exploration term against the credit (OpenTuner's C)."""

MODEL_MEMORY = 200
"""Trials Optuna's model keeps before it starts again from the best half: bounds what each proposal costs."""

INIT = 20
"""Points of the first design (a Latin hypercube): chosen out of sample by ``fleet bench search --cv``."""

PATIENCE = 10
"""With history, when history's best beat every point of the first design, a climb from it goes next, while one of
its last this many runs found a new overall best: where history is nearly right the climb finishes its work
(dedispersion_milo__A100: 0.88, 0.62 without history); where it is not, it stops after this many runs, and the
search is today's (docs/strategies.md)."""

CREDITS = ("time", "count")
"""How a technique's credit is counted: new bests per second its proposals cost, or per proposal (OpenTuner)."""


def _optuna(grid: Grid, history: History, rng: random.Random) -> Technique:
    from fleet.search.optuna_search import Modelling

    return Modelling(grid, history, rng, memory=MODEL_MEMORY)


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
    """For a user who does not know which strategy to pick: a space-filling design, then a bandit that gives
    each proposal to the technique that has lately found new bests at the least cost.

    The first ``init`` proposals are a Latin hypercube over the valid configurations
    (:func:`fleet.search.design.latin_hypercube`): spread over every knob's range, never a cluster, so that
    however short the budget, the start is as good as random search's. Then the techniques (by default the
    genetic algorithm, local search, and Optuna's TPE when Optuna is installed) take over. They share one
    history: each sees every run, the design's included, so the genetic algorithm breeds from the design's best,
    local search climbs from the best so far, and the model learns from all of them. For each proposal, the
    techniques are ranked by OpenTuner's AUC bandit score: the area under the curve of "this proposal of mine
    was a new overall best" over its last uses, recent ones weighing more, divided (``credit="time"``) by what
    those proposals cost relative to everyone's mean cost, plus an exploration term; the first in rank that has
    something to propose proposes. A run's cost is its ``simulated_s`` metric, else ``compile_s`` +
    ``benchmark_s``; when runs carry neither, each counts as one. Known-good configurations given as
    ``seed_configs`` are measured before everything.

    N evaluation slots: the design's points are independent, so N run at once; after it, each slot is filled by
    the best-ranked technique that has a proposal ready (members of the current generation, neighbours of the
    current best, model samples), so N configurations are in flight from several techniques at once.

    Parameters
    ----------
    techniques:
        Names among genetic, local, optuna, anneal, random, in tie-breaking order; default genetic, local and
        (when installed) optuna.
    seed_configs:
        Configurations to measure first, e.g. the best known for similar problems; those not in the space, or
        that the space rules out, are skipped.
    history:
        What related problems found best (:func:`fleet.search.history.to_options`, which the campaign driver
        fills from the store): its ``first`` best configurations are measured first (by default as many as the
        sources' leaders make, see :func:`fleet.search.history.first_count`) and hidden from the techniques;
        then the design; then, when the best of them beat every design point, a climb from it while it pays
        (:data:`PATIENCE`); then the bandit, whose techniques see neither history's trials nor the climb's, but
        for the climb's best where it improved on history. Empty or absent: today's behaviour.
    init:
        Points of the first design (0 for none).
    credit:
        ``time`` (new bests per second of the technique's proposals) or ``count`` (per proposal, as OpenTuner).
    exploration:
        Weight of the bandit's exploration term.
    """

    name = "auto"

    def __init__(
        self,
        space: Space | None = None,
        *,
        techniques: Sequence[str] | None = None,
        seed_configs: Sequence[Mapping[str, Any]] | None = None,
        history: Mapping[str, Any] | None = None,
        init: int = INIT,
        credit: str = "time",
        exploration: float = EXPLORATION,
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
        if isinstance(init, bool) or not isinstance(init, int) or init < 0:
            raise SpecError(f"strategy 'auto': init must be an integer >= 0, not {init!r}")
        if credit not in CREDITS:
            raise SpecError(f"strategy 'auto': credit must be one of {', '.join(CREDITS)}, not {credit!r}")
        if isinstance(exploration, bool) or not isinstance(exploration, int | float) or exploration < 0:
            raise SpecError(f"strategy 'auto': exploration must be a number >= 0, not {exploration!r}")
        self.init, self.credit, self.exploration = init, credit, float(exploration)
        self.history, first = from_options(history)
        self.history_first = first_count(self.history) if first is None else first
        # The points proposed because history recommended them, with what it said (see :meth:`origin`).
        self.from_history: dict[tuple[Any, ...], Transferred] = {}
        self._by_key: dict[tuple[Any, ...], Transferred] | None = None
        self._rank = {id(item): rank for rank, item in enumerate(self.history, 1)}

    def origin(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """What history said of ``config`` when this searcher proposed it from history, else None."""
        try:
            item = self.from_history.get(tuple(config[name] for name in self.space.names))
        except (KeyError, TypeError):
            return None
        if item is None:
            return None
        return {"rank": self._rank[id(item)], "score": round(item.score, 4), "sources": list(item.sources)}

    def _remember(self, grid: Grid, point: Point) -> None:
        config = grid.decode(point)
        key = tuple(config[name] for name in self.space.names)
        if self._by_key is None:
            names = self.space.names
            self._by_key = {tuple(t.config.get(n) for n in names): t for t in self.history}
        item = self._by_key.get(key)
        if item is not None:
            self.from_history[key] = item

    def _history_points(self, grid: Grid) -> list[Point]:
        points = (grid.encode(item.config) for item in self.history)
        return [p for p in points if p is not None and grid.is_valid(p)]

    def first_points(self, grid: Grid) -> list[Point]:
        points = [p for p in (grid.encode(config) for config in self.seed_configs) if p is not None]
        first = self._history_points(grid)[: self.history_first]
        for point in first:
            self._remember(grid, point)
        return points + first

    def technique(self, grid: Grid, history: History) -> Technique:
        first = set(self.first_points(grid)[len(self.seed_configs) :]) if self.history else set()
        # With history: its first trials, the design, then (when history's best beat the whole design) a climb
        # from history's best for as long as it finds new overall bests, then the bandit. The techniques see every
        # run but history's and the climb's (but for the climb's best, where it improved on history): a related
        # problem's best may sit in a basin that is not the best here, and breeding or climbing from it would keep
        # the search there (convolution_milo__A100 scored 0.74 so, 0.83 without history). What history costs is
        # then its first trials and the climb's last runs.
        blind = History(grid) if first else history
        if first:
            blind.seen, blind.pending = history.seen, history.pending
        techniques = {
            name: TECHNIQUES[name](grid, blind, random.Random(f"{self.seed}:{name}")) for name in self.techniques
        }
        return Bandit(
            grid,
            blind,
            random.Random(self.seed),
            techniques,
            design=Designing(grid, blind, random.Random(f"{self.seed}:design"), count=self.init),
            exploration=self.exploration,
            by_time=self.credit == "time",
            hidden=first,
            lead=Climbing(grid, history, random.Random(f"{self.seed}:refine")) if first else None,
            full=history,
        )


class Bandit(Technique):
    """OpenTuner's AUC bandit over techniques that share one history (see :class:`Auto`).

    Parameters
    ----------
    techniques:
        The techniques by name, in the order that breaks ties.
    design:
        A technique whose proposals all go first, credited to no one.
    hidden:
        Runs the techniques do not see (history's first trials): only ``lead`` does.
    lead:
        A technique that goes after the design and before the others, credited to no one, when the best run
        after the design is a hidden one (history's best beat every design point), and then while it pays: until
        ``patience`` of its runs are back, then while one of its last ``patience`` was a new best of ``full``.
        Its runs are hidden from the techniques too, but for its best, handed over when it is the best of all.
    patience:
        See ``lead``.
    full:
        Every run, hidden ones included (default ``history``): what the lead's runs are judged against.
    window:
        Recent uses of each technique its credit counts.
    exploration:
        Weight of the exploration term.
    by_time:
        Divide each technique's credit by the relative cost of its proposals.
    """

    def __init__(
        self,
        grid: Grid,
        history: History,
        rng: random.Random,
        techniques: Mapping[str, Technique],
        *,
        design: Technique | None = None,
        window: int = WINDOW,
        exploration: float = EXPLORATION,
        by_time: bool = True,
        hidden: set[Point] | None = None,
        lead: Technique | None = None,
        patience: int = PATIENCE,
        full: History | None = None,
    ) -> None:
        super().__init__(grid, history, rng)
        self.hidden = set(hidden or ())
        self.lead, self.patience = lead, patience
        self.lead_results: deque[bool] = deque(maxlen=patience)  # per run of the lead's: a new overall best?
        self.lead_out: set[Point] = set()
        self.trusted: bool | None = None
        self.lead_points: set[Point] = set()
        self.handed = False
        self.full = full if full is not None else history
        self.techniques = dict(techniques)
        self.design = design
        self.exploration = exploration
        self.by_time = by_time
        # Per use: whether it was a new overall best, and what it cost (None when the run did not say).
        self.results: dict[str, deque[tuple[bool, float | None]]] = {
            name: deque(maxlen=window) for name in self.techniques
        }
        self.owner: dict[Point, str] = {}
        self.proposed: dict[str, int] = dict.fromkeys(self.techniques, 0)

    def _mean_cost(self) -> float | None:
        costs = [c for results in self.results.values() for _, c in results]
        if not costs or any(c is None for c in costs):
            return None
        mean = sum(costs) / len(costs)  # type: ignore[arg-type]  # no None left: checked above
        return mean if mean > 0 else None

    def score(self, name: str, mean_cost: float | None = None) -> float:
        """Credit (area under the curve of new bests, later uses weighing more; per unit of cost when costs are
        known, ``mean_cost`` being everyone's mean) plus exploration."""
        results = self.results[name]
        uses = len(results)
        if not uses:
            return math.inf
        weights = uses * (uses + 1) / 2
        credit = sum(i for i, (new_best, _) in enumerate(results, 1) if new_best) / weights
        if self.by_time and mean_cost is not None and credit > 0:
            # The same weights over the costs: a technique whose recent proposals cost twice everyone's mean
            # earns half the credit for the same new bests.
            mine = sum(i * (c or 0.0) for i, (_, c) in enumerate(results, 1)) / weights  # by_time: every cost known
            if mine > 0:
                credit *= mean_cost / mine
        total = sum(len(r) for r in self.results.values())
        return credit + self.exploration * math.sqrt(2 * math.log(total) / uses)

    def ranked(self) -> list[str]:
        # Untried techniques rank first (their score is inf), in the given order; sorted() keeps ties in order.
        mean_cost = self._mean_cost() if self.by_time else None
        return sorted(self.techniques, key=lambda name: -self.score(name, mean_cost))

    def leading(self) -> bool:
        """Whether the lead goes next (see the class docstring); asked once the design is out."""
        if self.lead is None:
            return False
        if self.trusted is None:
            # Decided once: the space's first samples are the judge of whether history knows this space.
            self.trusted = self.full.best in self.hidden
        if not self.trusted:
            return False
        return len(self.lead_results) + len(self.lead_out) < self.patience or any(self.lead_results)

    def propose(self) -> Point | None:
        if self.design is not None:
            point = self.design.propose()
            if point is not None:
                return point
            self.design = None
        if self.leading():
            point = self.lead.propose()  # type: ignore[union-attr]  # leading() means there is a lead
            if point is not None:
                self.lead_out.add(point)
                self.lead_points.add(point)
                return point
        elif self.trusted and not self.handed:
            # The climb is over. Where it improved on history, the basin holds something here: its best run (that
            # one, not the basin's others) is handed to the techniques to build on. Where it did not, history's
            # best is a local optimum here, and nothing of it is handed over.
            self.handed = True
            best = self.full.best
            if best in self.lead_points and best not in self.history.losses:
                self.history.record(best, self.full.best_loss, self.full.costs.get(best))
                for technique in self.techniques.values():
                    technique.observe(best, self.full.best_loss)
        for name in self.ranked():
            point = self.techniques[name].propose()
            if point is not None:
                self.owner[point] = name
                self.proposed[name] += 1
                return point
        return None

    def observe(self, point: Point, value: float) -> None:
        if self.lead is not None:
            self.lead.observe(point, value)
        if point in self.lead_out:
            self.lead_out.discard(point)
            # The searcher recorded the run in full first: it is the best now exactly when it beat every other.
            self.lead_results.append(self.full.best == point and math.isfinite(value))
            return  # hidden from the techniques, as history's trials are
        if point in self.hidden:
            return  # the techniques' own history leaves out the hidden runs; the searcher recorded every run
        if self.full is not self.history:
            self.history.record(point, value, self.full.costs.get(point))
        name = self.owner.pop(point, None)
        if name is not None:
            # History recorded the point first: it is the best now exactly when it beat every earlier one.
            new_best = self.history.best == point and math.isfinite(value)
            self.results[name].append((new_best, self.history.costs.get(point)))
        for technique in self.techniques.values():
            technique.observe(point, value)
