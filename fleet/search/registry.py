"""The strategies by name, and :func:`make_searcher`. The package's ``__init__`` fills the table, so that a
strategy built of others (the composer) can make them without importing the package that imports it."""

from __future__ import annotations

from typing import Any

from fleet.errors import SpecError
from fleet.search.base import Searcher
from fleet.space import Space

STRATEGIES: dict[str, type[Searcher]] = {}


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
