"""The store's history: the best measurements of problems related to a campaign's, wherever they were taken.

Related means the same problem kind, on any target, any problem parameters, any toolchain; imported
measurements (MIOpen databases, Kernel Tuner cache files) count as any other, since they are stored as trials
of campaigns too. One query returns each source's (problem and target's) best runs: on PostgreSQL a lateral
join reads the first rows of each source from ``ix_measurements_problem_target_objective`` (problem, target,
objective), so its cost grows with the sources and not with the measurements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select, true

from fleet.store._base import StoreBase, patient
from fleet.store._models import (
    Campaign,
    CampaignProblem,
    Measurement,
    Problem,
    ProblemTag,
    Trial,
    trials_with_measurements,
)

PER_SOURCE = 10
"""Best runs returned per source (see :data:`fleet.search.history.TOP`)."""


@dataclass
class HistorySource:
    """The best measurements of one related problem on one target.

    Parameters
    ----------
    problem_id, kind, params:
        The problem.
    target:
        Where it was measured.
    device:
        The device it was measured on, when sources are told apart by device (:meth:`HistoryStore.history`'s
        ``by_device``); "" otherwise, or where the measurements named none.
    toolchains:
        The toolchains of those measurements ("" for one that recorded none).
    runs:
        (configuration, objective), best first.
    """

    problem_id: int
    kind: str
    params: dict[str, Any]
    target: str
    device: str = ""
    toolchains: list[str] = field(default_factory=list)
    runs: list[tuple[dict[str, Any], float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """Provenance in a few words: ``problem 3 {"n": 512} on sm_80 (nvcc 12.4)``, or ``... on sm_86, NVIDIA RTX
        A4000 (...)`` when sources are told apart by device."""
        tools = ", ".join(t for t in self.toolchains if t)
        params = json.dumps(self.params, sort_keys=True, separators=(", ", ": "))
        where = f"{self.target}, {self.device}" if self.device else self.target
        return f"problem {self.problem_id} {params} on {where}" + (f" ({tools})" if tools else "")


class HistoryStore(StoreBase):
    """What related problems measured: where a new campaign's search may start."""

    @patient
    def history(
        self,
        kind: str,
        *,
        maximize: bool = False,
        exclude_campaign: int | None = None,
        targets: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
        per_source: int = PER_SOURCE,
        by_device: bool = False,
        campaigns: Sequence[int] | None = None,
    ) -> list[HistorySource]:
        """The best valid measurements of every problem of ``kind`` on every target, per problem and target (and
        device, with ``by_device``).

        Parameters
        ----------
        kind:
            The problem kind.
        maximize:
            The campaign's direction: only measurements of the same direction count, best first.
        exclude_campaign:
            A campaign whose own trials are not history (the campaign asking, when it is resumed).
        targets:
            Only these targets (None: every one).
        tags:
            Only problems with one of these tags (None: every one).
        per_source:
            Best runs per problem and target.
        by_device:
            One source per problem, target and device (the measurements' ``device_kind``): two GPUs of one target
            (an RTX A4000 and an RTX A6000 are both sm_86) are two sources, not one whose best runs mix them. Read
            by a window over every measurement of the kind, not the index's first rows: for benchmarks and
            imports, not a campaign's start.
        campaigns:
            Only what these campaigns' trials measured (those its asker trusts: fleet.trust); None, every campaign's.
        """
        sources, chosen = _related(kind, maximize, exclude_campaign, targets, tags, campaigns)
        order = Measurement.objective.desc() if maximize else Measurement.objective.asc()
        if self.dialect == "postgresql" and not by_device:
            query = _best_lateral(sources, chosen, order, per_source)
        else:
            query = _best_numbered(sources, chosen, order, per_source, by_device)
        with self.transaction() as connection:
            rows = connection.execute(query).all()
            problems = {
                row.id: row
                for row in connection.execute(
                    select(Problem.id, Problem.kind, Problem.params).where(
                        Problem.id.in_({row.problem_id for row in rows})
                    )
                )
            }
        return _grouped(rows, problems, maximize, by_device)

    @patient
    def history_trials(self, campaign_id: int) -> list[tuple[int, int, dict[str, Any], float | None]]:
        """The trials of a campaign proposed from history: (trial id, problem id, what history said, objective)."""
        query = (
            trials_with_measurements(Trial.id, Trial.problem_id, Trial.history, Measurement.objective, valid=True)
            .where(Trial.campaign_id == campaign_id, Trial.history.is_not(None))
            .order_by(Trial.id)
        )
        with self.transaction() as connection:
            return [(row[0], row[1], dict(row[2]), row[3]) for row in connection.execute(query)]


# What each source's best rows carry, besides the source.
_BEST = (Measurement.objective, Measurement.toolchain, Measurement.device_kind, Trial.config)


def _related(
    kind: str,
    maximize: bool,
    exclude_campaign: int | None,
    targets: Sequence[str] | None,
    tags: Sequence[str] | None,
    campaigns: Sequence[int] | None,
) -> tuple[Select[int, str], list[ColumnElement[bool]]]:
    """The sources (problem and target) of ``kind`` that :meth:`HistoryStore.history` reads, and the conditions
    on their measurements."""
    sources = (
        select(CampaignProblem.problem_id, Campaign.target)
        .join(Campaign, Campaign.id == CampaignProblem.campaign_id)
        .join(Problem, Problem.id == CampaignProblem.problem_id)
        .where(Problem.kind == kind)
        .distinct()
    )
    if targets is not None:
        sources = sources.where(Campaign.target.in_(list(targets)))
    if tags is not None:
        tagged = select(ProblemTag.problem_id).where(ProblemTag.tag.in_(list(tags)))
        sources = sources.where(CampaignProblem.problem_id.in_(tagged))
    chosen: list[ColumnElement[bool]] = [
        Measurement.valid.is_(True),
        Measurement.objective.is_not(None),
        Measurement.maximize.is_(maximize),
    ]
    if exclude_campaign is not None:
        chosen.append(Trial.campaign_id != exclude_campaign)
    if campaigns is not None:
        sources = sources.where(CampaignProblem.campaign_id.in_(list(campaigns)))
        chosen.append(Trial.campaign_id.in_(list(campaigns)))
    return sources, chosen


def _best_lateral(
    sources: Select[int, str], chosen: Sequence[ColumnElement[bool]], order: Any, per_source: int
) -> Select[Any]:
    """Each source's best rows by a lateral join: the first rows of the source in the objective's index."""
    wanted = sources.subquery("sources")
    best = (
        select(*_BEST)
        .join(Trial, Trial.id == Measurement.trial_id)
        .where(Measurement.problem_id == wanted.c.problem_id, Measurement.target == wanted.c.target, *chosen)
        .order_by(order)
        .limit(per_source)
        .lateral("best")
    )
    return select(wanted.c.problem_id, wanted.c.target, best).select_from(wanted).join(best, true())


def _best_numbered(
    sources: Select[int, str], chosen: Sequence[ColumnElement[bool]], order: Any, per_source: int, by_device: bool
) -> Select[Any]:
    """Each source's best rows by numbering every row of each source (and device, with ``by_device``)."""
    # SQLite has no lateral join, and no index leads with the device: number each source's rows instead
    # (an embedded store is small).
    wanted = sources.subquery("sources")
    partition = (Measurement.problem_id, Measurement.target, *([Measurement.device_kind] if by_device else []))
    numbered = (
        select(
            Measurement.problem_id,
            Measurement.target,
            *_BEST,
            func.row_number().over(partition_by=partition, order_by=order).label("rank"),
        )
        .join(Trial, Trial.id == Measurement.trial_id)
        .join(
            wanted,
            and_(wanted.c.problem_id == Measurement.problem_id, wanted.c.target == Measurement.target),
        )
        .where(*chosen)
        .subquery("numbered")
    )
    return select(
        numbered.c.problem_id,
        numbered.c.target,
        numbered.c.objective,
        numbered.c.toolchain,
        numbered.c.device_kind,
        numbered.c.config,
    ).where(numbered.c.rank <= per_source)


def _grouped(rows: Sequence[Any], problems: dict[int, Any], maximize: bool, by_device: bool) -> list[HistorySource]:
    """The rows as sources, each's runs best first, the sources in order of problem, target and device."""
    found: dict[tuple[int, str, str], HistorySource] = {}
    for row in rows:
        problem = problems[row.problem_id]
        device = (row.device_kind or "") if by_device else ""
        source = found.get((row.problem_id, row.target, device))
        if source is None:
            source = found[row.problem_id, row.target, device] = HistorySource(
                row.problem_id, problem.kind, dict(problem.params), row.target, device
            )
        if row.toolchain not in source.toolchains:
            source.toolchains.append(row.toolchain or "")
        source.runs.append((dict(row.config), float(row.objective)))
    for source in found.values():
        source.runs.sort(key=lambda run: -run[1] if maximize else run[1])
    return sorted(found.values(), key=lambda s: (s.problem_id, s.target, s.device))
