"""What ``fleet report`` reads of a campaign, through the store (SQLAlchemy): :class:`StoredReads`.

The page reads the database through an object with these methods: a :class:`fleet.glance.Glance` where the command
can take one (its SQL text, without importing SQLAlchemy), else this, which reads the same through the store.
``tests/integration/test_report.py`` holds the two to the same page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Text, cast, func, select

from fleet.glance import ReportFacts
from fleet.report.data import microseconds
from fleet.states import ArtifactState
from fleet.store import Artifact, Measurement, Store, Trial


class StoredReads:
    """The reads of :mod:`fleet.report.data` through ``store``; its other methods are the store's.

    Parameters
    ----------
    store:
        The store to read.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def report_rows(self, campaign_id: int) -> tuple[Iterator[list[tuple[Any, ...]]], Callable[[], ReportFacts]]:
        """The trials of :func:`trials_query` in one list, and a function that gives :meth:`report_facts`."""
        rows = [(*row[:6], _microseconds(row[6]), *row[7:]) for row in self.store.plain_rows(trials_query(campaign_id))]
        return iter([rows]), lambda: self.report_facts(campaign_id)

    def report_facts(self, campaign_id: int) -> ReportFacts:
        """As :meth:`fleet.glance.Glance.report_facts` reads them."""
        mine = Trial.campaign_id == campaign_id
        start = select(func.coalesce(func.min(Trial.started_at), func.min(Trial.created_at)), func.count(Trial.history))
        recorded = (
            select(Measurement.objective_name, Measurement.maximize)
            .select_from(Trial)
            .join(Measurement, Measurement.trial_id == Trial.measured_in)
            .where(mine, Measurement.objective_name.is_not(None), Measurement.maximize.is_not(None))
            .order_by(Trial.id.desc())
        )
        with self.store.transaction() as connection:
            first, proposed = connection.execute(start.where(mine)).one()
            objective = connection.execute(recorded.limit(1)).first()
        return first, proposed > 0, (str(objective[0]), bool(objective[1])) if objective else None

    def chain_trials(self, campaign_id: int) -> list[tuple[int, int]]:
        return [(chain.index, step.trial_id) for chain, step in self.store.chain_steps(campaign_id)]

    def trial_outputs(self, trial_ids: Sequence[int]) -> list[tuple[Any, ...]]:
        query = (
            select(
                Trial.id,
                Trial.build_key,
                Trial.stdout_tail,
                Trial.stderr_tail,
                Measurement.samples,
                Measurement.metrics,
            )
            .outerjoin(Measurement, Measurement.trial_id == Trial.measured_in)
            .where(Trial.id.in_(trial_ids))
        )
        with self.store.transaction() as connection:
            return [tuple(row) for row in connection.execute(query)]

    def failed_build_logs(self, build_keys: Sequence[str]) -> dict[str, str]:
        query = select(Artifact.build_key, Artifact.log_tail).where(
            Artifact.build_key.in_(build_keys), Artifact.state == ArtifactState.FAILED
        )
        with self.store.transaction() as connection:
            return {key: log or "" for key, log in connection.execute(query)}


def _microseconds(finished: datetime | str | None) -> int | None:
    """A trial's finish as the driver gives it (SQLite's is text) in microseconds since the epoch, as the glance
    reads it."""
    if finished is None:
        return None
    return microseconds(datetime.fromisoformat(finished) if isinstance(finished, str) else finished)


def trials_query(campaign_id: int) -> Select[*tuple[Any, ...]]:
    """The campaign's trials, each with what the page shows of its measurement, in trial order, as the driver gives
    them (:meth:`~fleet.store.Store.plain_rows`)."""
    # Columns, not ORM objects, and only those the page uses for every trial: of a measurement's JSON only
    # the chain (a series), its samples and other metrics are read for the trials the tables show (see _details).
    return (
        select(
            Trial.id,
            Trial.problem_id,
            cast(Trial.config, Text).label("config"),
            Trial.state,
            Trial.reason,
            Trial.baseline,
            Trial.finished_at,
            Trial.source_trial_id,
            Measurement.objective,
            Measurement.valid,
            cast(Measurement.metrics["chain"], Text).label("chain"),  # JSON text: decoded with the configurations
            Measurement.node,
            Measurement.gpu,
            Measurement.worker,
            Measurement.toolchain,
            Measurement.device,
        )
        .outerjoin(Measurement, Measurement.trial_id == Trial.measured_in)
        .where(Trial.campaign_id == campaign_id)
        .order_by(Trial.id)
    )
