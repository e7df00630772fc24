"""What the dynamic searchers share: configurations as points, the history of runs, and the driving loop.

A point is the tuple of a configuration's value indices, one per knob in space order: cheap to hash,
compare and move along. Each dynamic searcher is a :class:`Technique` (propose a point, observe a finished
one) wrapped by :class:`TechniqueSearcher`, which plays the generator protocol, keeps the budget, and never
proposes a point twice. The ``auto`` bandit drives several techniques over one shared :class:`History`.
"""

from __future__ import annotations

import itertools
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from fleet.search.base import WAIT, Proposals, Run, Searcher
from fleet.space import Config, Space, Value

Point = tuple[int, ...]

RANDOM_TRIES = 200
"""Uniform draws from the product of the knobs before falling back to a list of every valid point."""

MOST_LISTED = 2_000_000
"""Largest product of the knobs that the fallback lists."""

HUGE_TRIES = 20_000
"""Uniform draws from a product too large to list before a point is given up (the space taken as exhausted)."""


def loss(run: Run, maximize: bool) -> float:
    """What every technique minimises: the objective (negated when larger is better); inf when the run failed."""
    objective = run.objective
    if not run.valid or objective is None or not math.isfinite(objective):
        return math.inf
    return -objective if maximize else objective


COST_METRICS = ("compile_s", "benchmark_s")
"""Metrics whose sum is what a run cost, when it has no ``simulated_s`` (the replay workload's total)."""


def cost(run: Run) -> float | None:
    """Seconds the run cost, from its metrics: ``simulated_s``, else compile + benchmark seconds; None when it
    says nothing of its time (the searcher then counts each run as one unit)."""
    metrics = run.metrics or {}
    total = metrics.get("simulated_s")
    if total is None:
        # Numbers only: a run's JSON may hold strings and bools too (MLPerf's "result_validity").
        parts = [metrics[name] for name in COST_METRICS if _number(metrics.get(name))]
        total = sum(parts) if parts else None
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
        return None
    return float(total)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _value_key(value: Value) -> tuple[type, Value]:
    # The type keeps True, 1 and 1.0 apart: a knob may list them as different values.
    return (type(value), value)


class Grid:
    """A space seen as points: encode, decode, validity (cached), random points, neighbours.

    Parameters
    ----------
    space:
        The space.
    """

    def __init__(self, space: Space) -> None:
        self.space = space
        self.names = space.names
        self.sizes = [len(k.values) for k in space.knobs]
        self._values = [k.values for k in space.knobs]
        self._index = [{_value_key(v): i for i, v in enumerate(k.values)} for k in space.knobs]
        self._valid: dict[Point, bool] = {}
        self._listed: list[Point] | None = None
        self._cursor = 0

    def encode(self, config: Mapping[str, Any]) -> Point | None:
        """The point of ``config``, or None when it is not a configuration of the space."""
        point = []
        for name, index, values in zip(self.names, self._index, self._values, strict=True):
            if name not in config:
                return None
            value = config[name]
            try:
                found = index.get(_value_key(value))
            except TypeError:  # an unhashable value
                return None
            if found is None:
                # A value that came back through JSON as another type (2.0 for 2): equal, and not a bool for a number.
                found = next(
                    (i for i, v in enumerate(values) if v == value and isinstance(v, bool) == isinstance(value, bool)),
                    None,
                )
            if found is None:
                return None
            point.append(found)
        return tuple(point)

    def decode(self, point: Point) -> Config:
        return {name: values[i] for name, values, i in zip(self.names, self._values, point, strict=True)}

    def is_valid(self, point: Point) -> bool:
        valid = self._valid.get(point)
        if valid is None:
            valid = self._valid[point] = self.space.is_valid(self.decode(point))
        return valid

    def random_point(self, rng: random.Random, seen: set[Point] | Mapping[Point, Any]) -> Point | None:
        """A uniformly drawn valid point not in ``seen``, or None when there is none left (or none found)."""
        huge = self.space.size > MOST_LISTED
        for _ in range(HUGE_TRIES if huge else RANDOM_TRIES):
            point = tuple(rng.randrange(size) for size in self.sizes)
            if point not in seen and self.is_valid(point):
                return point
        if huge:
            return None
        # Most draws hit seen or invalid points: walk a shuffled list of the valid ones instead.
        if self._listed is None:
            self._listed = [p for p in itertools.product(*(range(s) for s in self.sizes)) if self.is_valid(p)]
            rng.shuffle(self._listed)
        while self._cursor < len(self._listed):
            point = self._listed[self._cursor]
            self._cursor += 1
            if point not in seen:
                return point
        return None

    def moves(self, point: Point) -> list[Point]:
        """Every valid point that differs from ``point`` in one knob: neighbouring values of the knob first."""
        near, far = self.split_moves(point)
        return near + far

    def split_moves(self, point: Point) -> tuple[list[Point], list[Point]]:
        """The valid points one knob away from ``point``: to a neighbouring value of the knob, and the others."""
        near: list[Point] = []
        far: list[Point] = []
        for knob, size in enumerate(self.sizes):
            here = point[knob]
            for other in range(size):
                if other == here:
                    continue
                moved = (*point[:knob], other, *point[knob + 1 :])
                if self.is_valid(moved):
                    (near if abs(other - here) == 1 else far).append(moved)
        return near, far

    def mutate(self, point: Point, knob: int, rng: random.Random) -> Point:
        """``point`` with knob ``knob`` moved: to a neighbouring value half the time, else to any other value."""
        size, here = self.sizes[knob], point[knob]
        if size < 2:
            return point
        if rng.random() < 0.5:
            other = here + rng.choice((-1, 1))
            if not 0 <= other < size:
                other = here - (other - here)
        else:
            other = rng.randrange(size - 1)
            other += other >= here
        return (*point[:knob], other, *point[knob + 1 :])

    def tunable(self) -> list[int]:
        """The knobs with more than one value."""
        return [knob for knob, size in enumerate(self.sizes) if size > 1]


class History:
    """What has been proposed and what came back, shared by every technique of one searcher.

    Parameters
    ----------
    grid:
        The space's points.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.seen: dict[Point, None] = {}  # proposed, in order (a dict: ordered and fast to test)
        self.pending: dict[Point, None] = {}
        self.losses: dict[Point, float] = {}
        self.costs: dict[Point, float | None] = {}
        self.best: Point | None = None
        self.best_loss = math.inf

    def propose(self, point: Point) -> None:
        self.seen[point] = None
        self.pending[point] = None

    def record(self, point: Point, value: float, seconds: float | None = None) -> None:
        """Record a finished point, its loss, and what it cost (seconds, None when unknown)."""
        self.pending.pop(point, None)
        self.seen[point] = None
        self.losses[point] = value
        self.costs[point] = seconds
        if value < self.best_loss:
            self.best, self.best_loss = point, value

    def worst(self) -> float | None:
        """The worst finite loss so far, or None before any valid run."""
        finite = [v for v in self.losses.values() if math.isfinite(v)]
        return max(finite) if finite else None


class Technique(ABC):
    """One way of choosing the next point, over a history it may share with other techniques.

    Parameters
    ----------
    grid:
        The space's points.
    history:
        Every point proposed and every result, whoever proposed it.
    rng:
        The technique's own random generator.
    """

    def __init__(self, grid: Grid, history: History, rng: random.Random) -> None:
        self.grid = grid
        self.history = history
        self.rng = rng

    @abstractmethod
    def propose(self) -> Point | None:
        """A valid point not seen yet, or None when this technique has nothing to propose until runs come back
        (or the space is exhausted)."""

    def observe(self, point: Point, value: float) -> None:  # noqa: B027 - most techniques use it
        """A finished point and its loss, whoever proposed it."""

    def random_point(self) -> Point | None:
        return self.grid.random_point(self.rng, self.history.seen)

    def unseen_move(self, point: Point, tries: int = 20) -> Point | None:
        """A random valid unseen point one knob away from ``point`` (a few random tries, then every move)."""
        tunable = self.grid.tunable()
        if not tunable:
            return None
        for _ in range(tries):
            moved = self.grid.mutate(point, self.rng.choice(tunable), self.rng)
            if moved not in self.history.seen and self.grid.is_valid(moved):
                return moved
        unseen = [p for p in self.grid.moves(point) if p not in self.history.seen]
        return self.rng.choice(unseen) if unseen else None


class TechniqueSearcher(Searcher):
    """A searcher that plays the generator protocol for a technique: see :mod:`fleet.search.points`."""

    is_dynamic = True

    @abstractmethod
    def technique(self, grid: Grid, history: History) -> Technique:
        """The technique this searcher runs."""

    def first_points(self, grid: Grid) -> list[Point]:
        """Points to propose before the technique's own (the ``auto`` strategy's known-good ones)."""
        return []

    def generate(self) -> Proposals:
        grid = Grid(self.space)
        history = History(grid)
        technique = self.technique(grid, history)
        first = [p for p in self.first_points(grid) if grid.is_valid(p)]
        proposed = 0
        run: Run | None = None
        while self.budget is None or proposed < self.budget:
            if run is not None:
                point = grid.encode(run.config)
                # A run of a point this searcher never proposed (or already heard of) teaches it nothing new.
                if point is not None and point in history.pending:
                    value = loss(run, self.maximize)
                    history.record(point, value, cost(run))
                    technique.observe(point, value)
            while first and first[0] in history.seen:
                first.pop(0)
            point = first.pop(0) if first else technique.propose()
            if point is None:
                if not history.pending:
                    return  # nothing out and nothing to propose: the space is exhausted
                run = yield WAIT
                continue
            history.propose(point)
            proposed += 1
            run = yield grid.decode(point)
