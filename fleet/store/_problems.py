"""The store's problems (with their tags), blobs, campaigns, and the best measurements of a problem."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update

from fleet.canonical import digest
from fleet.errors import NotFound, StoreError, did_you_mean
from fleet.states import CampaignStatus
from fleet.store._base import StoreBase, patient
from fleet.store._models import Blob, Campaign, CampaignProblem, Measurement, Problem, ProblemTag, Trial, utcnow


class ProblemStore(StoreBase):
    """Problems and their tags, blobs, campaigns, and the best of what was measured."""

    # -- problems and blobs -----------------------------------------------------------------------------

    @patient
    def add_problem(self, kind: str, params: dict[str, Any], tags: Iterable[str] = ()) -> int:
        """The id of the problem (``kind``, ``params``), created if missing, with ``tags`` added."""
        key = digest(params)
        with self.session() as session:
            self._insert_ignore(
                session, Problem, {"kind": kind, "params": params, "params_key": key, "created_at": utcnow()}
            )
            found = session.execute(
                select(Problem.id, Problem.params).where(Problem.kind == kind, Problem.params_key == key)
            ).one()
            # Problems are every team's: a row another login wrote under this key with other parameters would have
            # this campaign tune them. Refused here, in the submitter's own process, rather than taken.
            if digest(found.params) != key:
                raise StoreError(
                    f"problem {found.id} ({kind}) is stored under the key of {params} with other parameters: "
                    "a forged row; ask an operator to remove it"
                )
            for tag in tags:
                self._insert_ignore(session, ProblemTag, {"problem_id": found.id, "tag": tag})
            return int(found.id)

    @patient
    def tag_problems(self, tags: Iterable[tuple[int, Iterable[str]]]) -> None:
        """Add each (problem id, its tags) pair's tags to its problem (those it has stay). On PostgreSQL a team's
        login tags only a problem of its own campaigns (migration 0015): ``fleet submit`` tags its problems once its
        campaign is written."""
        with self.session() as session:
            for problem_id, names in tags:
                for tag in names:
                    self._insert_ignore(session, ProblemTag, {"problem_id": problem_id, "tag": tag})

    @patient
    def problem(self, problem_id: int) -> Problem:
        with self.session() as session:
            problem = session.get(Problem, problem_id)
            if problem is None:
                raise NotFound(f"no problem {problem_id}")
            return problem

    @patient
    def find_problems(
        self, kind: str | None = None, params: dict[str, Any] | None = None, tag: str | None = None
    ) -> list[Problem]:
        """Problems of ``kind`` whose parameters include ``params`` and that carry ``tag``."""
        query = select(Problem).order_by(Problem.id)
        if kind is not None:
            query = query.where(Problem.kind == kind)
        if tag is not None:
            query = query.join(ProblemTag).where(ProblemTag.tag == tag)
        with self.session() as session:
            problems = list(session.scalars(query))
        wanted = params or {}
        return [p for p in problems if all(p.params.get(k) == v for k, v in wanted.items())]

    @patient
    def tags(self, problem_id: int) -> list[str]:
        with self.session() as session:
            return sorted(session.scalars(select(ProblemTag.tag).where(ProblemTag.problem_id == problem_id)))

    @patient
    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once under its SHA-256; return the digest."""
        key = hashlib.sha256(data).hexdigest()
        with self.session() as session:
            self._insert_ignore(session, Blob, {"digest": key, "size": len(data), "data": data, "created_at": utcnow()})
        return key

    @patient
    def get_blob(self, key: str) -> bytes:
        with self.session() as session:
            data = session.scalar(select(Blob.data).where(Blob.digest == key))
        if data is None:
            raise NotFound(f"no blob {key}")
        return bytes(data)

    # -- campaigns --------------------------------------------------------------------------------------

    @patient
    def create_campaign(
        self,
        *,
        name: str,
        target: str,
        problem_ids: Sequence[int],
        space: dict[str, Any],
        strategy: dict[str, Any],
        workload: dict[str, Any],
        options: dict[str, Any],
        provenance: dict[str, Any],
        baseline: dict[str, Any] | None = None,
        team: str | None = None,
    ) -> Campaign:
        """Create a campaign; an existing one of the same name and definition is returned as it is.

        Its team is ``team``, else the one team the login is a member of (see ``TeamStore.owning_team``).
        """
        workload_key = digest({"workload": workload, "provenance": provenance.get("toolchain", "")})
        team = self.owning_team(team)  # type: ignore[attr-defined]  # a mixin of Store, which has owning_team()
        with self.session() as session:
            created = session.scalar(
                self.insert(Campaign)
                .values(
                    name=name,
                    target=target,
                    space=space,
                    strategy=strategy,
                    workload=workload,
                    workload_key=workload_key,
                    options=options,
                    provenance=provenance,
                    baseline=baseline,
                    status=CampaignStatus.RUNNING,
                    created_at=utcnow(),
                    team=team,
                )
                .on_conflict_do_nothing()
                .returning(Campaign.id)
            )
            if created is not None:
                for position, problem_id in enumerate(problem_ids):
                    session.add(CampaignProblem(campaign_id=created, problem_id=problem_id, position=position))
            campaign = session.scalar(select(Campaign).where(Campaign.name == name))
            if campaign is None:  # names are one for the whole fleet: another team has this one
                raise StoreError(f"campaign name {name!r} is taken (by a campaign you may not see): choose another")
            problems = list(
                session.scalars(
                    select(CampaignProblem.problem_id)
                    .where(CampaignProblem.campaign_id == campaign.id)
                    .order_by(CampaignProblem.position)
                )
            )
        # A campaign of this name existed (or a racing submission made it first): resume it if it is the same.
        mine = (campaign.target, campaign.space, campaign.strategy, campaign.workload_key, campaign.baseline, problems)
        same = mine == (target, space, strategy, workload_key, baseline, list(problem_ids))
        if not same:
            raise StoreError(f"campaign {name!r} exists with another definition: choose another name")
        return campaign

    @patient
    def campaign(self, ref: str | int) -> Campaign:
        """The campaign with id or name ``ref``."""
        with self.session() as session:
            query = select(Campaign).where(Campaign.name == str(ref))
            if isinstance(ref, int) or str(ref).isdigit():
                query = select(Campaign).where(or_(Campaign.id == int(ref), Campaign.name == str(ref)))
            campaign = session.scalars(query.order_by(Campaign.id)).first()
            # Only on a miss, and bounded: the names a mistyped one is compared with.
            names = session.scalars(select(Campaign.name).limit(10_000)).all() if campaign is None else []
        if campaign is None:
            raise NotFound(f"no campaign {ref!r}{did_you_mean(ref, names)}")
        return campaign

    @patient
    def campaigns(self) -> list[Campaign]:
        with self.session() as session:
            return list(session.scalars(select(Campaign).order_by(Campaign.id)))

    @patient
    def campaign_problems(self, campaign_id: int) -> list[Problem]:
        with self.session() as session:
            return list(
                session.scalars(
                    select(Problem)
                    .join(CampaignProblem, CampaignProblem.problem_id == Problem.id)
                    .where(CampaignProblem.campaign_id == campaign_id)
                    .order_by(CampaignProblem.position)
                )
            )

    @patient
    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        finished = utcnow() if status == CampaignStatus.DONE else None
        with self.session() as session:
            session.execute(
                update(Campaign).where(Campaign.id == campaign_id).values(status=status, finished_at=finished)
            )

    # -- best -------------------------------------------------------------------------------------------

    @patient
    def best(
        self, problem_id: int, target: str, limit: int = 1, campaigns: Sequence[int] | None = None
    ) -> list[tuple[Measurement, dict[str, Any]]]:
        """The best valid measurements of a problem on a target, with their configurations.

        The objective and its direction are the ones the latest measurement used, so a problem tuned for
        GFLOPS is not ranked against one tuned for seconds. ``campaigns``: only what their trials measured
        (fleet.trust chooses them); None, every campaign's.
        """
        of_campaigns = [] if campaigns is None else [Trial.campaign_id.in_(list(campaigns))]
        with self.session() as session:
            latest = session.execute(
                select(Measurement.objective_name, Measurement.maximize)
                .join(Trial, Trial.id == Measurement.trial_id)
                .where(
                    Measurement.problem_id == problem_id,
                    Measurement.target == target,
                    Measurement.valid.is_(True),
                    *of_campaigns,
                )
                .order_by(Measurement.id.desc())
                .limit(1)
            ).first()
            if latest is None:
                return []
            order = Measurement.objective.desc() if latest.maximize else Measurement.objective.asc()
            rows = session.execute(
                select(Measurement, Trial.config)
                .join(Trial, Trial.id == Measurement.trial_id)
                .where(
                    *_valid_results(problem_id, target),
                    Measurement.objective_name == latest.objective_name,
                    *of_campaigns,
                )
                .order_by(order, Measurement.id)
                .limit(limit)
            ).all()
        return [(m, config) for m, config in rows]

    @patient
    def measuring_campaigns(self, problem_id: int, target: str) -> dict[int, str]:
        """The campaigns whose trials measured ``problem_id`` on ``target`` validly: id -> name."""
        with self.session() as session:
            rows = session.execute(
                select(Campaign.id, Campaign.name)
                .where(
                    Campaign.id.in_(
                        select(Trial.campaign_id)
                        .join(Measurement, Measurement.trial_id == Trial.id)
                        .where(*_valid_results(problem_id, target))
                    )
                )
                .order_by(Campaign.id)
            ).all()
        return {row.id: row.name for row in rows}

    @patient
    def campaigns_of_trials(self, trial_ids: Sequence[int]) -> dict[int, int]:
        """The campaign id of each of ``trial_ids``: what an answer drew on, said with it."""
        with self.session() as session:
            rows = session.execute(select(Trial.id, Trial.campaign_id).where(Trial.id.in_(list(trial_ids)))).all()
        return {row.id: row.campaign_id for row in rows}


def _valid_results(problem_id: int, target: str) -> list[ColumnElement[bool]]:
    """The measurements a best is chosen from: valid ones of ``problem_id`` on ``target``, with an objective."""
    return [
        Measurement.problem_id == problem_id,
        Measurement.target == target,
        Measurement.valid.is_(True),
        Measurement.objective.is_not(None),
    ]
