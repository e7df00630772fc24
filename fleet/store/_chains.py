"""The store's annealing chains and their steps."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from fleet.errors import NotFound
from fleet.states import CampaignStatus, ChainState
from fleet.store._base import StoreBase, patient
from fleet.store._models import Campaign, Chain, ChainStep, utcnow
from fleet.store._workers import served_targets


class ChainStore(StoreBase):
    """Annealing chains: one per start configuration, moved on one step at a time."""

    # -- annealing chains -------------------------------------------------------------------------------

    @patient
    def create_chains(
        self,
        campaign_id: int,
        problem_id: int,
        starts: Sequence[dict[str, Any]],
        *,
        seed: int,
        steps: int,
        temperature: float,
    ) -> list[int]:
        """Create (or find, when resubmitted) one chain per start configuration; return their ids."""
        now = utcnow()
        rows = [
            {
                "campaign_id": campaign_id,
                "problem_id": problem_id,
                "index": index,
                "seed": seed + index,
                "steps": steps,
                "step": 0,
                "config": config,
                "temperature": temperature,
                "state": ChainState.RUNNING,
                "created_at": now,
                "updated_at": now,
            }
            for index, config in enumerate(starts)
        ]
        with self.transaction() as connection:
            connection.execute(self.insert(Chain).on_conflict_do_nothing(), rows)
            return list(
                connection.scalars(
                    select(Chain.id)
                    .where(Chain.campaign_id == campaign_id, Chain.problem_id == problem_id)
                    .order_by(Chain.index)
                )
            )

    @patient
    def chain(self, chain_id: int) -> Chain:
        with self.session() as session:
            chain = session.get(Chain, chain_id)
        if chain is None:
            raise NotFound(f"no chain {chain_id}")
        return chain

    @patient
    def chains(self, campaign_id: int) -> list[Chain]:
        with self.session() as session:
            return list(
                session.scalars(
                    select(Chain).where(Chain.campaign_id == campaign_id).order_by(Chain.problem_id, Chain.index)
                )
            )

    @patient
    def finish_chain_step(
        self,
        chain: Chain,
        *,
        trial_id: int,
        config: dict[str, Any],
        objective: float | None,
        accepted: bool,
        temperature: float,
        worker: str,
        seconds: float,
        maximize: bool,
    ) -> bool:
        """Record step ``chain.step`` and move the chain on; False if another run of the same step did first.

        The chain's step number makes this idempotent: a step that ran twice (a redelivered message) is
        recorded once, and only that run sends the next step.
        """
        now = utcnow()
        values: dict[str, Any] = {"step": chain.step + 1, "temperature": temperature, "updated_at": now}
        if chain.step + 1 >= chain.steps:
            values["state"] = ChainState.DONE
        if accepted:
            values |= {"config": config, "objective": objective}
        better = objective is not None and (
            chain.best_objective is None
            or (objective > chain.best_objective if maximize else objective < chain.best_objective)
        )
        if better:
            values |= {"best_config": config, "best_objective": objective}
        last = values.get("state") == ChainState.DONE
        with self.transaction() as connection:
            if last:
                # The campaign's row first, locked, so that of two chains ending at once the later sees the
                # earlier ended (both in READ COMMITTED would see the other still running, and neither end it).
                connection.execute(select(Campaign.id).where(Campaign.id == chain.campaign_id).with_for_update())
            moved = connection.execute(
                update(Chain)
                .where(Chain.id == chain.id, Chain.step == chain.step, Chain.state == ChainState.RUNNING)
                .values(**values)
            ).rowcount
            if moved:
                connection.execute(
                    self.insert(ChainStep).values(
                        chain_id=chain.id,
                        step=chain.step,
                        trial_id=trial_id,
                        config=config,
                        objective=objective,
                        accepted=accepted,
                        temperature=chain.temperature,
                        worker=worker,
                        seconds=seconds,
                        created_at=now,
                    )
                )
            if moved and last:
                self._end_if_chains_ended(connection, chain.campaign_id, now)
        return bool(moved)

    @staticmethod
    def _end_if_chains_ended(connection: Any, campaign_id: int, now: Any) -> None:
        """A running campaign whose chains have all ended is done, with no driver watching: a detached
        campaign's chains drive themselves to their end, and its end is theirs (a paused or cancelled one
        stays as it is)."""
        running = select(Chain.id).where(Chain.campaign_id == campaign_id, Chain.state == ChainState.RUNNING).exists()
        connection.execute(
            update(Campaign)
            .where(Campaign.id == campaign_id, Campaign.status == CampaignStatus.RUNNING, ~running)
            .values(status=CampaignStatus.DONE, finished_at=now)
        )

    @patient
    def chain_steps(self, campaign_id: int) -> list[tuple[Chain, ChainStep]]:
        """Every recorded step of the campaign's chains, in order."""
        with self.session() as session:
            return [
                (chain, step)
                for chain, step in session.execute(
                    select(Chain, ChainStep)
                    .join(ChainStep, ChainStep.chain_id == Chain.id)
                    .where(Chain.campaign_id == campaign_id)
                    .order_by(Chain.problem_id, Chain.index, ChainStep.step)
                ).all()
            ]

    @patient
    def stale_chains(
        self, older_than: float, campaign_id: int | None = None, served_within: float | None = None
    ) -> list[tuple[int, int, str]]:
        """Running chains that have not moved for ``older_than`` seconds: (chain id, step, target) to send again.

        Their message may have been lost; a duplicate step is harmless (see :meth:`finish_chain_step`).
        ``served_within``: only chains of a target that a live worker serves (see :meth:`stale`).
        """
        now = utcnow()
        cutoff = now - timedelta(seconds=older_than)
        query = (
            update(Chain)
            .where(Chain.state == ChainState.RUNNING, Chain.updated_at < cutoff)
            .values(updated_at=now)
            .returning(Chain.id, Chain.step, Chain.campaign_id)
        )
        if campaign_id is not None:
            query = query.where(Chain.campaign_id == campaign_id)
        if served_within is not None:
            served = select(Campaign.id).where(Campaign.target.in_(served_targets(served_within)))
            query = query.where(Chain.campaign_id.in_(served))
        with self.transaction() as connection:
            rows = connection.execute(query).all()
            targets = dict(connection.execute(select(Campaign.id, Campaign.target)).all()) if rows else {}
        return [(r.id, r.step, targets[r.campaign_id]) for r in rows]
