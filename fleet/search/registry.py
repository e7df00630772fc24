"""The strategies by name, and :func:`make_searcher`. The package's ``__init__`` fills the table, so that a
strategy built of others (the composer) can make them without importing the package that imports it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.errors import SpecError, did_you_mean
from fleet.search.base import Searcher
from fleet.search.pareto import Objective
from fleet.space import Space

STRATEGIES: dict[str, type[Searcher]] = {}

PARETO = "nsga2"
"""What ``auto`` runs for several objectives: the searcher of the Pareto front (docs/strategies.md)."""


def make_searcher(
    name: str,
    space: Space,
    *,
    budget: int | None = None,
    maximize: bool = False,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    objectives: Sequence[Objective] = (),
) -> Searcher:
    """Build the searcher called ``name``.

    Parameters
    ----------
    name:
        A key of :data:`STRATEGIES`.
    options:
        Extra keyword arguments of that searcher.
    objectives:
        The campaign's objectives when it has several: ``auto`` is then :data:`PARETO`, a searcher of the Pareto
        front gets them, a static one (grid, random) proposes as it would for one, and any other is refused, since
        it would optimise the first only.
    """
    if not isinstance(name, str) or name not in STRATEGIES:
        known = ", ".join(sorted(STRATEGIES))
        raise SpecError(f"unknown strategy {name!r} (known: {known})")
    if options is not None and not isinstance(options, dict):
        raise SpecError(f"strategy {name!r}: options must be an object")
    shown = repr(name)
    several = len(objectives) > 1
    if several and name == "auto":
        name, shown = PARETO, f"auto (which is {PARETO} for several objectives)"
    cls = STRATEGIES[name]
    extra: dict[str, Any] = {}
    if cls.pareto:
        extra["objectives"] = list(objectives)
    elif several and cls.is_dynamic:
        names = ", ".join(o.name for o in objectives)
        raise SpecError(
            f"strategy {name!r} optimises one objective, and the workload names several ({names}): "
            f"use {PARETO} (auto chooses it), random or grid"
        )
    _refuse_unknown_options(cls, shown, options or {})
    try:
        # By keyword: MLPerf's Composer takes its searchers first.
        return cls(space=space, budget=budget, maximize=maximize, seed=seed, **extra, **(options or {}))
    except TypeError as error:
        raise SpecError(f"strategy {shown}: {error}") from None


_GIVEN = {"self", "space", "budget", "maximize", "seed", "objectives"}
"""What :func:`make_searcher` gives every searcher itself: not options a spec names."""


def _refuse_unknown_options(cls: type[Searcher], shown: str, options: dict[str, Any]) -> None:
    """One line naming an option ``cls`` does not take and the one it probably meant (``populaton``), rather than
    Python's ``__init__() got an unexpected keyword argument``."""
    import inspect

    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # it passes its options on (the composer's searchers): they say for themselves
    known = sorted(set(parameters) - _GIVEN)
    for name in options:
        if name not in known:
            takes = f"; it takes {', '.join(known)}" if known else "; it takes none"
            raise SpecError(f"strategy {shown} has no option {name!r}{did_you_mean(name, known)}{takes}")
