"""The Pareto front of a campaign of several objectives, and the one point of it a stated preference chooses.

``fleet best`` and the report both show it: per problem, the valid trials no other valid trial beats in every
objective, each with every objective's value, and the chosen point. The preference is an objective and a
tolerance: *the best PREFER among the front's points whose first objective is within WITHIN % of its best there*
("the least energy within 10% of the fastest time"). With no preference, the first objective's best is chosen, as
the campaign's one-objective views (its best, its speedup) rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError, SpecError

if TYPE_CHECKING:  # the store is only passed in: a command that imports this module need not load SQLAlchemy
    from fleet.search.pareto import Objective  # nor every searcher (fleet.search's package), for fleet status
    from fleet.store import Campaign, Store, TrialResult

WITHIN = 10.0
"""The default tolerance of a preference, in percent of the first objective's best."""


@dataclass(frozen=True)
class Preference:
    """Which point of a front to choose: the best ``objective`` within ``within`` % of the first objective's best.

    Parameters
    ----------
    objective:
        The objective to favour (by name).
    within:
        How far, in percent, the first objective may fall behind its best on the front.
    """

    objective: str
    within: float = WITHIN

    def describe(self, objectives: Sequence[Objective]) -> str:
        """The preference in words: "least energy within 10% of the best time"."""
        first, wanted = objectives[0], _named(objectives, self.objective)
        best = "most" if wanted.maximize else "least"
        if wanted == first:
            return f"{best} {first.name}"
        return f"{best} {wanted.name} within {self.within:g}% of the best {first.name}"


@dataclass(frozen=True)
class Front:
    """One problem's front: its points (by the first objective, best first) and the chosen one.

    Parameters
    ----------
    problem_id:
        The problem.
    points:
        The non-dominated valid trials, each with every objective in ``objectives``.
    chosen:
        The point the preference chooses; None when the front is empty.
    measured:
        Every valid trial of the problem, the front's among them (what the report plots).
    """

    problem_id: int
    points: list[TrialResult]
    chosen: TrialResult | None
    measured: list[TrialResult]


def check_preference(preference: Preference, objectives: Sequence[Objective]) -> None:
    """SpecError, in one line, for a preference that names no objective of the campaign or a negative tolerance."""
    if len(objectives) < 2:
        raise SpecError("a preference chooses a point of a Pareto front: this campaign has one objective")
    _named(objectives, preference.objective)
    if not preference.within >= 0:
        raise SpecError(f"the tolerance of a preference is a percentage >= 0, not {preference.within:g}")


def _named(objectives: Sequence[Objective], name: str) -> Objective:
    found = next((o for o in objectives if o.name == name), None)
    if found is None:
        raise SpecError(f"no objective {name!r}: the campaign's are {', '.join(o.name for o in objectives)}")
    return found


def objective_values(result: TrialResult, objectives: Sequence[Objective]) -> dict[str, Any]:
    """Each objective's value of ``result``: its stored objectives, the first being its objective too."""
    return {objectives[0].name: result.objective, **result.objectives}


def front_of(valid: Sequence[TrialResult], objectives: Sequence[Objective]) -> list[TrialResult]:
    """The valid results that no other beats in every objective, best first objective first."""
    from fleet.search.pareto import front, loss_vector

    return [valid[i] for i in front([loss_vector(objective_values(r, objectives), objectives) for r in valid])]


def choose(points: Sequence[TrialResult], objectives: Sequence[Objective], preference: Preference) -> TrialResult:
    """The point of a non-empty front that ``preference`` chooses (see the module docstring)."""
    from fleet.search.pareto import loss_vector

    wanted = _named(objectives, preference.objective)
    losses = [loss_vector(objective_values(p, objectives), objectives)[0] for p in points]
    best = min(losses)
    # Within the tolerance of the best first objective: a loss is the objective or its negation, so the slack is
    # a share of the best's magnitude either way.
    slack = abs(best) * preference.within / 100
    near = [p for p, loss in zip(points, losses, strict=True) if loss <= best + slack]
    index = objectives.index(wanted)
    return min(near, key=lambda p: loss_vector(objective_values(p, objectives), objectives)[index])


def campaign_fronts(
    store: Store, campaign: Campaign, objectives: Sequence[Objective], preference: Preference | None = None
) -> list[Front]:
    """Per problem of ``campaign``, its front and the chosen point (the baseline, measured beside, left out).

    Parameters
    ----------
    store:
        The database.
    campaign:
        A campaign whose workload has several objectives.
    objectives:
        Its objectives.
    preference:
        Which point to choose; None for the first objective's best.
    """
    if len(objectives) < 2:
        raise FleetError(f"campaign {campaign.name!r} has one objective: it has a best, not a front")
    preference = preference or Preference(objectives[0].name)
    by_problem: dict[int, list[TrialResult]] = {p.id: [] for p in store.campaign_problems(campaign.id)}
    for result in store.results(campaign_id=campaign.id):
        if not result.baseline and result.valid and result.objective is not None:
            by_problem.setdefault(result.problem_id, []).append(result)
    fronts = []
    for problem_id, valid in by_problem.items():
        points = front_of(valid, objectives)
        chosen = choose(points, objectives, preference) if points else None
        fronts.append(Front(problem_id, points, chosen, valid))
    return fronts
