"""Search strategies: plain Python, no database and no Celery."""

from __future__ import annotations

from typing import Any

from fleet.errors import SpecError
from fleet.search.anneal import Anneal
from fleet.search.auto import Auto
from fleet.search.base import WAIT, Proposals, Run, Searcher
from fleet.search.bisect import Bisect
from fleet.search.composer import Composer
from fleet.search.genetic import Genetic
from fleet.search.grid import CartesianProduct
from fleet.search.local import Local
from fleet.search.optuna_search import OptunaSearch
from fleet.search.random_search import RandomSearch
from fleet.search.step import Step
from fleet.space import Space

STRATEGIES: dict[str, type[Searcher]] = {
    "grid": CartesianProduct,
    "random": RandomSearch,
    "step": Step,
    "bisect": Bisect,
    "composer": Composer,
    "anneal": Anneal,
    "local": Local,
    "genetic": Genetic,
    "optuna": OptunaSearch,
    "auto": Auto,
}


def make_searcher(
    name: str,
    space: Space,
    *,
    budget: int | None = None,
    maximize: bool = False,
    seed: int = 0,
    options: dict[str, Any] | None = None,
) -> Searcher:
    """Build the searcher called ``name``.

    Parameters
    ----------
    name:
        A key of :data:`STRATEGIES`.
    options:
        Extra keyword arguments of that searcher.
    """
    if not isinstance(name, str) or name not in STRATEGIES:
        known = ", ".join(sorted(STRATEGIES))
        raise SpecError(f"unknown strategy {name!r} (known: {known})")
    if options is not None and not isinstance(options, dict):
        raise SpecError(f"strategy {name!r}: options must be an object")
    cls = STRATEGIES[name]
    try:
        # By keyword: MLPerf's Composer takes its searchers first.
        return cls(space=space, budget=budget, maximize=maximize, seed=seed, **(options or {}))
    except TypeError as error:
        raise SpecError(f"strategy {name!r}: {error}") from None


__all__ = [
    "STRATEGIES",
    "WAIT",
    "Anneal",
    "Auto",
    "Bisect",
    "CartesianProduct",
    "Composer",
    "Genetic",
    "Local",
    "OptunaSearch",
    "Proposals",
    "RandomSearch",
    "Run",
    "Searcher",
    "Step",
    "make_searcher",
]
