"""A campaign's space as its driver and its summary rebuild it, and the best runs its searchers accept.

Apart from :mod:`fleet.driving.summary`, which imports this only for a campaign whose searcher judges its runs
(``step``, ``bisect``, ``composer``, a space file's): the searchers' modules are most of its import (issue 42,
item 12).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from fleet.errors import FleetError, SpecError
from fleet.search import Run, Searcher
from fleet.space import Space
from fleet.space_files import VERDICT_LIMIT, load_space_file, predicate_from_verdicts
from fleet.spec.campaign import new_searcher
from fleet.spec.workloads import load_workload_spec
from fleet.store import Campaign, Store, TrialResult


def campaign_space(campaign: Campaign, user_code: bool = False) -> tuple[Space, Callable[[Space], Searcher] | None]:
    """A stored campaign's space, with the predicate and searcher of its space file when it has one.

    Parameters
    ----------
    user_code:
        True only in the submitting user's own process (``fleet tune``, ``fleet resume``): a Python space file is
        run again there, for its searcher. Elsewhere (a ``fleet driver``, an operator's ``fleet status``) no user
        code runs: the predicate comes from the verdicts stored at submit.
    """
    source = campaign.options.get("space_file")
    if not source:
        return Space.from_dict(campaign.space), None
    path = Path(source["path"])
    if user_code or path.suffix != ".py":
        try:
            loaded = load_space_file(path, source.get("base"), digest=source["digest"])
        except SpecError as error:
            raise SpecError(f"campaign {campaign.name!r}: {error}") from None
        return loaded.space, loaded.searcher
    factory = _no_user_searcher(campaign.name) if source.get("searcher") else None
    space = Space.from_dict(campaign.space)
    if "rejected" not in source:
        return space, factory
    if source["rejected"] is None:
        raise SpecError(
            f"campaign {campaign.name!r}: its space file's META_is_config_valid was not evaluated at submit (over "
            f"{VERDICT_LIMIT} configurations): drive it with `fleet resume` in the submitter's own process"
        )
    return Space.from_dict(campaign.space, predicate_from_verdicts(space.names, source["rejected"])), factory


def _no_user_searcher(name: str) -> Callable[[Space], Searcher]:
    """What stands for a space file's own searcher where no user code runs: it refuses, in one line."""

    def refuse(space: Space) -> Searcher:
        raise SpecError(
            f"campaign {name!r}: its space file's META_search_callback is the submitter's code, which no driver "
            "runs: drive it with `fleet resume` in the submitter's own process"
        )

    return refuse


def searched(result: TrialResult) -> Run:
    """The run a searcher is sent for ``result``: its objective, and with several objectives every one."""
    return Run(result.config, result.objective, result.valid, result.metrics, result.reason, result.objectives)


def judged_bests(
    store: Store, campaign: Campaign, maximize: bool, given: Sequence[Searcher] | None = None
) -> dict[int, TrialResult] | None:
    """Per problem, the best run that its searcher accepts; None when the searchers test nothing but validity
    (the database's best is then the answer, without reading every result)."""
    problems = store.campaign_problems(campaign.id)
    if given is not None:
        searchers = {p.id: searcher for p, searcher in zip(problems, given, strict=False)}
    else:
        try:
            space, factory = campaign_space(campaign)
            objectives = load_workload_spec(campaign.workload).objectives
            searchers = {
                p.id: new_searcher(
                    campaign.strategy, space, maximize=maximize, index=i, factory=factory, objectives=objectives
                )
                for i, p in enumerate(problems)
            }
        except FleetError:
            return None  # a space file that changed, or whose searcher is code that runs only where it was submitted
    if not any(searcher.tests() for searcher in searchers.values()):
        return None
    bests: dict[int, TrialResult] = {}
    for result in store.results(campaign_id=campaign.id):
        searcher = searchers.get(result.problem_id)
        run = searched(result)
        if searcher is None or not searcher.accepts(run):
            continue
        current = bests.get(result.problem_id)
        # The workload's goal, not the searcher's: a space file's searcher is built without it.
        objective, best = result.objective, None if current is None else current.objective
        if best is None or (objective > best if maximize else objective < best):  # type: ignore[operator]  # only results with an objective are compared
            bests[result.problem_id] = result
    return bests
