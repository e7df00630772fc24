"""Steering campaigns: who drives each one (a lease), cancel, pause and resume, priorities, trial records.

A campaign has at most one live driver: taking it is a conditional UPDATE of the campaign's lease, as a
worker's claim of a trial is. A driver that dies stops renewing, and another takes the campaign once
the lease has expired. Cancel and pause are written here and obeyed everywhere: claims refuse the trials
of a paused campaign, and a cancelled campaign's unfinished trials end as ``cancelled``, which makes the
workers that run them lose their leases and kill their commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, true, update

from fleet.errors import FleetError, NotFound
from fleet.states import DRIVEN, TRIAL_STATES, UNFINISHED, CampaignStatus, ChainState, TrialState
from fleet.store._base import StoreBase, patient, rows_changed
from fleet.store._models import Campaign, Chain, Measurement, Trial, Worker, trials_with_measurements, utcnow


class SteeringError(FleetError):
    """A campaign that cannot be cancelled, paused or resumed in the state it is in."""


@dataclass(frozen=True)
class TrialRecord:
    """One trial as a user reads it: plain values, one row of ``fleet trials`` or ``handle.to_pandas()``."""

    id: int
    problem_id: int
    config: dict[str, Any]
    state: str
    objective: float | None
    valid: bool | None
    samples: list[Any] = field(default_factory=list)
    reason: str | None = None
    worker: str | None = None
    attempts: int = 0
    baseline: bool = False


class SteeringStore(StoreBase):
    """The drivers' leases on campaigns, and the users' cancel, pause, resume and priorities."""

    # -- drivers' leases --------------------------------------------------------------------------------

    @patient
    def take_campaign(self, campaign_id: int, driver: str, lease: float, *, force: bool = False) -> bool:
        """Become ``campaign_id``'s driver for ``lease`` seconds; False while another live driver has it.

        ``force`` takes it even so: the other driver sees that it lost the lease at its next renewal.
        """
        now = utcnow()
        free = or_(Campaign.driver.is_(None), Campaign.driver == driver, Campaign.driver_lease_expires_at < now)
        with self.session() as session:
            taken = rows_changed(
                session.execute(
                    update(Campaign)
                    .where(Campaign.id == campaign_id, Campaign.status.in_(DRIVEN), true() if force else free)
                    .values(driver=driver, driver_lease_expires_at=now + timedelta(seconds=lease))
                )
            )
        return bool(taken)

    @patient
    def renew_campaign(self, campaign_id: int, driver: str, lease: float) -> str | None:
        """Extend ``driver``'s lease; the campaign's status, or None when the driver no longer holds it."""
        expires = utcnow() + timedelta(seconds=lease)
        with self._steps() as connection:
            return connection.scalar(
                update(Campaign)
                .where(Campaign.id == campaign_id, Campaign.driver == driver)
                .values(driver_lease_expires_at=expires)
                .returning(Campaign.status)
            )

    @patient
    def release_campaign(self, campaign_id: int, driver: str) -> None:
        """Let go of a campaign, so that another driver may take it at once."""
        with self.session() as session:
            session.execute(
                update(Campaign)
                .where(Campaign.id == campaign_id, Campaign.driver == driver)
                .values(driver=None, driver_lease_expires_at=None)
            )

    @patient
    def campaigns_to_drive(self, limit: int = 100) -> list[Campaign]:
        """Submitted campaigns that no live driver holds, the highest priority first."""
        now = utcnow()
        with self.session() as session:
            return list(
                session.scalars(
                    select(Campaign)
                    .where(
                        Campaign.submitted.is_(True),
                        Campaign.status.in_(DRIVEN),
                        or_(Campaign.driver.is_(None), Campaign.driver_lease_expires_at < now),
                    )
                    .order_by(Campaign.priority.desc(), Campaign.id)
                    .limit(limit)
                )
            )

    @patient
    def driven(self) -> dict[str, list[Campaign]]:
        """The campaigns each live driver holds, by driver name."""
        with self.session() as session:
            rows = session.scalars(
                select(Campaign)
                .where(Campaign.driver.is_not(None), Campaign.driver_lease_expires_at >= utcnow())
                .order_by(Campaign.id)
            )
            held: dict[str, list[Campaign]] = {}
            for campaign in rows:
                held.setdefault(campaign.driver or "", []).append(campaign)
        return held

    @patient
    def share(self, campaign_id: int, target: str) -> float:
        """This campaign's share of its target's evaluation slots: its priority over that of every driven one.

        Campaigns count while a live driver holds them and they are not paused.
        """
        now = utcnow()
        active = and_(
            Campaign.target == target,
            Campaign.status == CampaignStatus.RUNNING,
            or_(Campaign.id == campaign_id, Campaign.driver_lease_expires_at >= now),
        )
        total = select(func.sum(Campaign.priority)).where(active).scalar_subquery()
        mine = select(Campaign.priority).where(Campaign.id == campaign_id).scalar_subquery()
        with self._steps() as connection:
            row = connection.execute(select(mine, total)).one()
        mine_value, total_value = row[0] or 0.0, row[1] or 0.0
        return mine_value / total_value if total_value > 0 else 1.0

    @patient
    def eval_slots(self, target: str, within: float) -> int:
        """Evaluation slots of ``target``: the concurrency of its live evaluation workers."""
        since = utcnow() - timedelta(seconds=within)
        with self._steps() as connection:
            total = connection.scalar(
                select(func.sum(Worker.concurrency)).where(
                    Worker.target == target,
                    Worker.role == "eval",
                    Worker.heartbeat_at >= since,
                    Worker.stopped_at.is_(None),
                )
            )
        return int(total or 0)

    # -- the users' steering ----------------------------------------------------------------------------

    @patient
    def submit_campaign(self, campaign_id: int, priority: float | None = None) -> None:
        """Hand a campaign to the fleet's drivers (with a new priority when one is given)."""
        values: dict[str, Any] = {"submitted": True}
        if priority is not None:
            values["priority"] = priority
        with self.session() as session:
            session.execute(update(Campaign).where(Campaign.id == campaign_id).values(**values))

    @patient
    def set_priority(self, campaign_id: int, priority: float) -> None:
        if priority <= 0:
            raise SteeringError(f"a priority is a weight above 0, not {priority}")
        with self.session() as session:
            session.execute(update(Campaign).where(Campaign.id == campaign_id).values(priority=priority))

    @patient
    def cancel_campaign(self, ref: str | int) -> dict[str, int]:
        """Cancel a running or paused campaign; its unfinished trials end as ``cancelled`` (counts by former state)."""
        campaign = self._steerable(ref, "cancel", DRIVEN)
        now = utcnow()
        with self.session() as session:
            session.execute(
                update(Campaign)
                .where(Campaign.id == campaign.id)
                .values(status=CampaignStatus.CANCELLED, finished_at=now, driver=None, driver_lease_expires_at=None)
            )
            # A chain's next step is sent by the worker of its last one: a cancelled chain sends none.
            session.execute(
                update(Chain)
                .where(Chain.campaign_id == campaign.id, Chain.state == ChainState.RUNNING)
                .values(state=ChainState.CANCELLED)
            )
        return self.cancel_trials(campaign.id)

    @patient
    def cancel_trials(self, campaign_id: int) -> dict[str, int]:
        """End a cancelled campaign's unfinished trials: the ones a late driver wrote as well."""
        now = utcnow()
        counts: dict[str, int] = {}
        with self.session() as session:
            for state in UNFINISHED:
                counts[state] = rows_changed(
                    session.execute(
                        update(Trial)
                        .where(Trial.campaign_id == campaign_id, Trial.state == state)
                        .values(
                            state=TrialState.CANCELLED,
                            reason=f"cancelled while {state}",
                            worker=None,
                            lease_expires_at=None,
                            finished_at=now,
                        )
                    )
                )
        return {state: n for state, n in counts.items() if n}

    @patient
    def pause_campaign(self, ref: str | int) -> Campaign:
        """Hold a running campaign: no new trial starts; running ones finish."""
        campaign = self._steerable(ref, "pause", (CampaignStatus.RUNNING,))
        self._set_status(campaign.id, CampaignStatus.PAUSED, CampaignStatus.RUNNING)
        return campaign

    @patient
    def resume_campaign(self, ref: str | int) -> Campaign:
        """Let a paused campaign go on; its driver sends the trials whose messages the pause dropped."""
        campaign = self._steerable(ref, "resume", (CampaignStatus.PAUSED,))
        self._set_status(campaign.id, CampaignStatus.RUNNING, CampaignStatus.PAUSED)
        return campaign

    @patient
    def reopen_campaign(self, ref: str | int) -> tuple[Campaign, int]:
        """Let a cancelled campaign go on (``fleet resume --force``): it runs again, and the trials its cancel
        ended are new again, to be sent once more; returns the campaign and how many trials were reopened."""
        campaign = self._steerable(ref, "reopen", (CampaignStatus.CANCELLED,))
        with self.session() as session:
            changed = rows_changed(
                session.execute(
                    update(Campaign)
                    .where(Campaign.id == campaign.id, Campaign.status == CampaignStatus.CANCELLED)
                    .values(status=CampaignStatus.RUNNING, finished_at=None, reason=None)
                )
            )
            if not changed:
                raise SteeringError(f"campaign {campaign.id} changed state meanwhile; look at `fleet status`")
            session.execute(
                update(Chain)
                .where(Chain.campaign_id == campaign.id, Chain.state == ChainState.CANCELLED)
                .values(state=ChainState.RUNNING)
            )
            reopened = rows_changed(
                session.execute(
                    update(Trial)
                    .where(Trial.campaign_id == campaign.id, Trial.state == TrialState.CANCELLED)
                    .values(state=TrialState.NEW, reason=None, worker=None, lease_expires_at=None, finished_at=None)
                )
            )
        return self.campaign(campaign.id), reopened  # type: ignore[attr-defined]  # a mixin of Store, which has campaign()

    @patient
    def fail_campaign(self, campaign_id: int, reason: str) -> None:
        """End a campaign a driver cannot go on with, keeping why."""
        with self.session() as session:
            session.execute(
                update(Campaign)
                .where(Campaign.id == campaign_id, Campaign.status.in_(DRIVEN))
                .values(
                    status=CampaignStatus.FAILED,
                    reason=reason,
                    finished_at=utcnow(),
                    driver=None,
                    driver_lease_expires_at=None,
                )
            )

    def _set_status(self, campaign_id: int, status: str, was: str) -> None:
        with self.session() as session:
            changed = rows_changed(
                session.execute(
                    update(Campaign).where(Campaign.id == campaign_id, Campaign.status == was).values(status=status)
                )
            )
        if not changed:
            raise SteeringError(f"campaign {campaign_id} changed state meanwhile; look at `fleet status`")

    def _steerable(self, ref: str | int, action: str, allowed: Sequence[str]) -> Campaign:
        campaign = self.campaign(ref)  # type: ignore[attr-defined]  # a mixin of Store, which has campaign()
        if campaign.status not in allowed:
            hint = {
                CampaignStatus.PAUSED: "it is paused already" if action == "pause" else "resume it first",
                CampaignStatus.RUNNING: "it is not paused",
            }.get(campaign.status, f"it has ended ({campaign.status})")
            raise SteeringError(f"cannot {action} campaign {campaign.name!r}: {hint}")
        return campaign

    # -- a driver that takes over -------------------------------------------------------------------------

    @patient
    def tried_configs(self, campaign_id: int) -> list[tuple[int, str, bool]]:
        """(problem id, configuration key, baseline) of each trial of a campaign: what a driver that takes the
        campaign over counts against its budget, whatever its own searcher proposes again."""
        with self.transaction() as connection:
            rows = connection.execute(
                select(Trial.problem_id, Trial.config_key, Trial.baseline).where(Trial.campaign_id == campaign_id)
            ).all()
        return [(r.problem_id, r.config_key, bool(r.baseline)) for r in rows]

    @patient
    def unfinished_trials(self, campaign_id: int) -> list[tuple[int, int]]:
        """(trial id, problem id) of a campaign's trials that have not ended: those an earlier driver sent and
        its successor's searcher did not propose again, which the campaign waits for before it is done."""
        with self.transaction() as connection:
            rows = connection.execute(
                select(Trial.id, Trial.problem_id).where(Trial.campaign_id == campaign_id, Trial.state.in_(UNFINISHED))
            ).all()
        return [(r.id, r.problem_id) for r in rows]

    # -- records ----------------------------------------------------------------------------------------

    @patient
    def trial_records(self, campaign_id: int, state: str | None = None) -> list[TrialRecord]:
        """The trials of a campaign with their measurements (a reused trial shows the measurement it reused)."""
        if state is not None and state not in TRIAL_STATES:
            raise NotFound(f"no trial state {state!r}: one of {', '.join(TRIAL_STATES)}")
        query = (
            trials_with_measurements(Trial, Measurement.objective, Measurement.valid, Measurement.samples)
            .where(Trial.campaign_id == campaign_id)
            .order_by(Trial.id)
        )
        if state is not None:
            query = query.where(Trial.state == state)
        with self.session() as session:
            rows = session.execute(query).all()
        return [
            TrialRecord(
                id=t.id,
                problem_id=t.problem_id,
                config=t.config,
                state=t.state,
                objective=objective,
                valid=valid,
                samples=list(samples or []),
                reason=t.reason,
                worker=t.worker,
                attempts=t.attempts,
                baseline=t.baseline,
            )
            for t, objective, valid, samples in rows
        ]
