"""The searcher interface, after MLPerf's autotuner ``SearcherInterface``.

``generate()`` is a generator. It yields configurations; the driver sends back, through ``send()``, the
run of some earlier configuration, or ``None`` when it only wants another proposal. A searcher that cannot
propose anything until more runs come back yields :data:`WAIT`, and only while some of its proposals are
still out. Searchers are plain Python: no database, no Celery, so they are pure functions of the runs they
have been sent.

``terms()`` is the same protocol for MLPerf's partial configurations ("cross-terms"): a searcher of one knob
yields ``{knob: value}``; :class:`~fleet.search.composer.Composer` merges the terms of several searchers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleet.errors import SpecError
from fleet.space import Config, Space, Value

WAIT = None
"""Yielded by a dynamic searcher that needs more runs before it can propose again."""


@dataclass(frozen=True)
class Run:
    """One finished trial as a searcher sees it.

    Parameters
    ----------
    config:
        The configuration that ran.
    objective:
        The measured objective, or None when the trial errored or was invalid.
    valid:
        Whether the measurement counts.
    metrics:
        Extra metrics (GFLOPS, seconds, ...).
    reason:
        Why the trial errored or is invalid.
    objectives:
        With several objectives, the value of each by name (the first is ``objective`` too); empty with one.
    """

    config: Config
    objective: float | None
    valid: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    objectives: dict[str, float] = field(default_factory=dict)

    @property
    def stats(self) -> dict[str, Any]:
        """The metrics under MLPerf's name, so that its predicates (``r.stats["result_validity"]``) run as they are."""
        return self.metrics


Proposals = Generator[Config | None, Run | None, None]
Terms = Generator[dict[str, Value] | None, Run | None, None]
Predicate = Callable[[Run], bool]


class Searcher(ABC):
    """Proposes configurations of one problem.

    Parameters
    ----------
    space:
        The space to search. A searcher built without one (as a spec file's ``META_search_callback()`` may
        build it) gets it from :meth:`bind` before it generates.
    budget:
        Most configurations to propose; None for no limit beyond the space.
    maximize:
        True when a larger objective is better (GFLOPS), False for times.
    seed:
        Seed of any randomness, so that a resumed campaign proposes the same sequence.
    """

    name: ClassVar[str]
    is_dynamic: ClassVar[bool] = False
    pareto: ClassVar[bool] = False
    """Searches for the Pareto front of several objectives (it takes ``objectives``); a static searcher proposes
    the same with one objective or several, and a dynamic one that is not ``pareto`` optimises one."""

    def __init__(
        self, space: Space | None = None, *, budget: int | None = None, maximize: bool = False, seed: int = 0
    ) -> None:
        self._space = space
        self.budget = budget
        self.maximize = maximize
        self.seed = seed

    @property
    def space(self) -> Space:
        if self._space is None:
            raise SpecError(f"strategy {self.name!r} has no space: bind() it to one before generating")
        return self._space

    @space.setter
    def space(self, space: Space) -> None:
        self._space = space

    def bind(self, space: Space) -> Searcher:
        """Give a searcher built without a space the campaign's space; return the searcher."""
        if self._space is None:
            self._space = space
        return self

    @abstractmethod
    def generate(self) -> Proposals:
        """Yield configurations; see the module docstring for the protocol."""

    def terms(self) -> Terms:
        """Yield partial configurations under the same protocol; whole ones unless the searcher owns a few knobs."""
        return self.generate()

    def tests(self) -> list[Predicate]:
        """The predicates a run must pass to count, besides being valid: a :class:`Step`'s or :class:`Bisect`'s
        own (MLPerf's ``r.stats["result_validity"] == "VALID"``); none for a searcher that has none."""
        predicate = getattr(self, "predicate", None)
        return [predicate] if callable(predicate) else []

    def accepts(self, run: Run) -> bool:
        """Whether ``run`` counts as a result of this search: valid, with an objective, and passing every one of
        :meth:`tests`, so that a campaign's best is never a run its searcher's predicate failed. A predicate
        that raises on a run (it reads a metric the run does not have) fails it."""
        if not run.valid or run.objective is None:
            return False
        try:
            return all(passes(test, run) for test in self.tests())
        except Exception:  # the user's predicate: what it raises on one run says only that the run fails
            return False

    def better(self, a: float, b: float) -> bool:
        """Whether objective ``a`` beats ``b``."""
        return a > b if self.maximize else a < b


def run_predicate(
    predicate: Predicate | None = None, valid_metric: str | None = None, valid_value: Any = None
) -> Predicate:
    """The test a run must pass: ``predicate`` itself when given, else one built from JSON options.

    Parameters
    ----------
    predicate:
        A callable from a Python spec file.
    valid_metric:
        A metric the run must have true (or equal to ``valid_value``), e.g. MLPerf's ``result_validity``.
    valid_value:
        The value ``valid_metric`` must equal, e.g. ``"VALID"``.

    With neither, a run passes when it is valid.
    """
    if predicate is not None:
        if not callable(predicate):
            raise SpecError(f"predicate {predicate!r} is not callable")
        return predicate
    if valid_metric is None:
        return lambda run: run.valid and run.objective is not None
    if valid_value is None:
        return lambda run: run.valid and bool(run.metrics.get(valid_metric))
    return lambda run: run.valid and run.metrics.get(valid_metric) == valid_value


def passes(predicate: Predicate, run: Run) -> bool:
    """Whether ``run`` passes ``predicate``; a run with neither objective nor metrics (it errored, or the space
    ruled it out) fails without asking, since a predicate on its stats would have nothing to read."""
    if run.objective is None and not run.metrics:
        return False
    return bool(predicate(run))


def knob_option(space: Space | None, knob: str | None, search_param: str | None, strategy: str) -> str:
    """The one knob a searcher walks, given as ``knob`` or by MLPerf's name ``search_param``."""
    if knob is not None and search_param is not None and knob != search_param:
        raise SpecError(f"strategy {strategy!r}: give 'knob' or 'search_param', not both")
    name = knob if knob is not None else search_param
    if not isinstance(name, str):
        raise SpecError(f'strategy {strategy!r} needs the knob to walk: options {{"knob": NAME}}')
    if space is not None:
        space.knob(name)  # raises SpecError when it is not a knob
    return name


def overlay(space: Space, base: Mapping[str, Value] | None, term: Mapping[str, Value]) -> Config:
    """A whole configuration: ``term`` over ``base`` over each knob's first value, in space order."""
    config: dict[str, Value] = {k.name: k.values[0] for k in space.knobs}
    config.update(base or {})
    config.update(term)
    return space.check(config)
