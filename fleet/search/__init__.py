"""Search strategies: plain Python, no database and no Celery."""

from __future__ import annotations

from typing import Any

from fleet.errors import SpecError
from fleet.search.base import WAIT, Proposals, Run, Searcher
from fleet.search.grid import CartesianProduct
from fleet.search.random_search import RandomSearch
from fleet.space import Space

STRATEGIES: dict[str, type[Searcher]] = {
    "grid": CartesianProduct,
    "random": RandomSearch,
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
    cls = STRATEGIES[name]
    try:
        return cls(space, budget=budget, maximize=maximize, seed=seed, **(options or {}))
    except TypeError as error:
        raise SpecError(f"strategy {name!r}: {error}") from None


__all__ = ["STRATEGIES", "WAIT", "CartesianProduct", "Proposals", "RandomSearch", "Run", "Searcher", "make_searcher"]
