"""The store's trials: adding them, claims and leases, results, and giving back lost work."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, func, select, update
from sqlalchemy.orm import aliased

from fleet.canonical import digest
from fleet.errors import NotFound
from fleet.states import UNFINISHED, WAITING, TrialState
from fleet.store._base import StoreBase, patient, rows_changed
from fleet.store._hotpath import MEASURED, claim_params
from fleet.store._models import (
    Artifact,
    Campaign,
    Measurement,
    Problem,
    Trial,
    trials_with_measurements,
    utcnow,
)
from fleet.store._types import NewTrial, Requeue, TrialResult, TrialWork
from fleet.store._workers import served_targets


@dataclass(frozen=True)
class TrialRow:
    """One line of a campaign's trial table: a trial, its problem's kind, and its measurement's objective."""

    id: int
    problem_id: int
    problem_kind: str
    config: dict[str, Any]
    state: str
    reason: str | None
    objective: float | None
    worker: str | None
    attempts: int
    baseline: bool
    source_trial_id: int | None
    history: dict[str, Any] | None = None  # what history said of it, when it was proposed from there
    objectives: dict[str, Any] | None = None  # with several objectives, each one's value by name


def _ranks_before(result: TrialResult, other: TrialResult, maximize: bool) -> bool:
    """Whether ``result`` is a better best than ``other``: a better objective, or the same and an earlier trial."""
    mine, theirs = result.objective, other.objective
    assert mine is not None and theirs is not None  # a best candidate has a valid objective
    if mine != theirs:
        return mine > theirs if maximize else mine < theirs
    return result.trial_id < other.trial_id


@dataclass(frozen=True)
class ProblemTally:
    """A problem's finished trials in a campaign: its best valid one, and how many ended in each state.

    ``counts`` has every finished trial, ``baselines`` the baseline trials among them; both list the states in
    the order of their first trial, as counting the campaign's results one by one would.
    """

    best: TrialResult | None
    counts: dict[str, int]
    baselines: dict[str, int]


@dataclass(frozen=True)
class TrialDetail:
    """Everything recorded about one trial: the trial, its campaign and problem, its measurement and artifact.

    A trial reused from an earlier measurement has ``source``, the trial that ran; its measurement is that one's.
    """

    trial: Trial
    campaign: Campaign
    problem: Problem
    source: Trial | None
    measurement: Measurement | None
    artifact: Artifact | None


class TrialStore(StoreBase):
    """Trials, from their creation to their result: claims, leases, records, and the reaper."""

    # -- trials -----------------------------------------------------------------------------------------

    @patient
    def add_trials(
        self, campaign_id: int, target: str, trials: Sequence[NewTrial], *, remeasure: bool = False
    ) -> list[tuple[int, str]]:
        """Create trials (or find them, when the campaign is resumed); return each one's id and state.

        Whether a configuration measured before is reused is decided when a worker claims its evaluation, not
        here: only then are the toolchain and the device known (see :meth:`claim`). A trial created with
        ``remeasure`` is measured even so, as is every trial of a campaign whose options say ``remeasure``.
        """
        now = utcnow()
        with self.transaction() as connection:
            values = []
            for new in trials:
                row = {
                    "campaign_id": campaign_id,
                    "problem_id": new.problem_id,
                    "target": target,
                    "config": new.config,
                    "config_key": digest(new.config),
                    "build_key": new.build_key,
                    "measure_key": new.measure_key,
                    "seq": new.seq,
                    "baseline": new.baseline,
                    "history": new.history,
                    "remeasure": remeasure,
                    "state": TrialState.NEW,
                    "attempts": 0,
                    "created_at": now,
                    "queued_at": now,
                    "source_trial_id": None,
                    "finished_at": None,
                }
                values.append(row)
            self.insert_many(connection, Trial, values)
            keys = [(t.problem_id, digest(t.config)) for t in trials]
            # Every column of the unique index, so that the lookup reads only these trials: without the
            # problem, it read every trial of the campaign (3 ms a call at 5,000 trials, and growing).
            rows = connection.execute(
                select(Trial.problem_id, Trial.config_key, Trial.id, Trial.state).where(
                    Trial.campaign_id == campaign_id,
                    Trial.problem_id.in_({problem for problem, _ in keys}),
                    Trial.target == target,
                    Trial.config_key.in_({key for _, key in keys}),
                )
            ).all()
        found = {(r.problem_id, r.config_key): (r.id, r.state) for r in rows}
        return [found[key] for key in keys]

    @patient
    def trial(self, trial_id: int) -> Trial:
        with self.session() as session:
            trial = session.get(Trial, trial_id)
        if trial is None:
            raise NotFound(f"no trial {trial_id}")
        return trial

    @patient
    def trials(self, campaign_id: int, states: Sequence[str] | None = None) -> list[Trial]:
        query = select(Trial).where(Trial.campaign_id == campaign_id).order_by(Trial.id)
        if states:
            query = query.where(Trial.state.in_(states))
        with self.session() as session:
            return list(session.scalars(query))

    @patient
    def trial_rows(
        self, campaign_id: int, states: Sequence[str] | None = None, problem_id: int | None = None
    ) -> list[TrialRow]:
        """The trials of a campaign (in ``states``, of ``problem_id``) with their objective, in id order.

        A reused trial shows its source's objective, and its source's reason when it has none of its own.
        """
        # fleet.glance writes this query again (the reason's rule too), for a ``fleet status`` without SQLAlchemy:
        # see Glance.trial_rows for why it is not shared. Change both; tests/integration/test_glance.py compares them.
        source = aliased(Trial)
        query = (
            trials_with_measurements(
                Trial.id,
                Trial.problem_id,
                Problem.kind,
                Trial.config,
                Trial.state,
                func.coalesce(Trial.reason, source.reason).label("reason"),
                Measurement.objective,
                Trial.worker,
                Trial.attempts,
                Trial.baseline,
                Trial.source_trial_id,
                Trial.history,
                Measurement.objectives,
            )
            .join(Problem, Problem.id == Trial.problem_id)
            .outerjoin(source, source.id == Trial.source_trial_id)
            .where(Trial.campaign_id == campaign_id)
            .order_by(Trial.id)
        )
        if states:
            query = query.where(Trial.state.in_(states))
        if problem_id is not None:
            query = query.where(Trial.problem_id == problem_id)
        with self.transaction() as connection:
            return [TrialRow(*row) for row in connection.execute(query)]

    @patient
    def trial_detail(self, trial_id: int) -> TrialDetail:
        """Everything about ``trial_id``; :class:`NotFound` when there is no such trial."""
        with self.session() as session:
            trial = session.get(Trial, trial_id)
            if trial is None:
                raise NotFound(f"no trial {trial_id}")
            source = session.get(Trial, trial.source_trial_id) if trial.source_trial_id is not None else None
            # The artifact its compile took; a trial compiled before toolchains were the workers' has none named.
            built = select(Artifact).where(Artifact.build_key == trial.build_key)
            if trial.toolchain is not None:
                built = built.where(Artifact.toolchain == trial.toolchain)
            return TrialDetail(
                trial=trial,
                campaign=session.get_one(Campaign, trial.campaign_id),
                problem=session.get_one(Problem, trial.problem_id),
                source=source,
                measurement=session.scalar(select(Measurement).where(Measurement.trial_id == trial.measured_in)),
                artifact=session.scalars(built.order_by(Artifact.id)).first(),
            )

    @patient
    def trial_counts(self, campaign_id: int) -> dict[str, int]:
        with self.session() as session:
            rows = session.execute(
                select(Trial.state, func.count()).where(Trial.campaign_id == campaign_id).group_by(Trial.state)
            ).all()
        return {state: count for state, count in rows}

    @patient
    def results(self, trial_ids: Iterable[int] | None = None, campaign_id: int | None = None) -> list[TrialResult]:
        """The trials among ``trial_ids`` (or of a campaign) that reached a terminal state."""
        query = (
            trials_with_measurements(
                Trial.id,
                Trial.problem_id,
                Trial.config,
                Trial.state,
                Trial.reason,
                Trial.baseline,
                Trial.source_trial_id,
                Measurement.objective,
                Measurement.valid,
                Measurement.metrics,
                Measurement.objectives,
                Trial.compile_seconds,
                Trial.eval_seconds,
            )
            # NOT IN, not IN: no index serves it, so the planner finds the trials by id (or campaign) even
            # when its statistics, stale in the middle of a campaign, say that few trials have finished;
            # with IN, it may read every finished trial of the database through the state index instead.
            .where(Trial.state.not_in(UNFINISHED))
            .order_by(Trial.id)
        )
        if trial_ids is not None:
            ids = list(trial_ids)
            if not ids:
                return []
            query = query.where(Trial.id.in_(ids))
        if campaign_id is not None:
            query = query.where(Trial.campaign_id == campaign_id)
        with self._steps() as connection:
            rows = connection.execute(query).all()
        return [
            TrialResult(
                trial_id=r.id,
                problem_id=r.problem_id,
                config=r.config,
                state=r.state,
                reason=r.reason,
                objective=r.objective,
                valid=bool(r.valid and r.state == TrialState.EVALUATED),
                metrics=r.metrics or {},
                baseline=r.baseline,
                reused=r.source_trial_id is not None,
                compile_seconds=r.compile_seconds,
                eval_seconds=r.eval_seconds,
                objectives=r.objectives or {},
            )
            for r in rows
        ]

    @patient
    def tally(self, campaign_id: int, maximize: bool, *, bests: bool = True) -> dict[int, ProblemTally]:
        """Per problem of a campaign that has finished trials: its best valid trial and its counts by state.

        What :meth:`results` of the whole campaign would give, without reading every result: on a large
        campaign that costs seconds and memory in proportion to its trials.

        Parameters
        ----------
        campaign_id:
            The campaign.
        maximize:
            Whether the best objective is the highest (else the lowest); among equals, the earliest trial.
        bests:
            Find each problem's best (see :meth:`_best_candidates`); without it the counts alone.
        """
        counted = (
            select(Trial.problem_id, Trial.state, Trial.baseline, func.count(), func.min(Trial.id).label("first"))
            .where(Trial.campaign_id == campaign_id, Trial.state.not_in(UNFINISHED))
            .group_by(Trial.problem_id, Trial.state, Trial.baseline)
            .order_by("first")
        )
        with self.transaction() as connection:
            groups = connection.execute(counted).all()
            evaluated = sorted({problem_id for problem_id, state, *_ in groups if state == TrialState.EVALUATED})
            candidates: list[tuple[int | None, int | None]] = []
            if bests and evaluated:
                if self.dialect == "postgresql":
                    # Its estimate of the walks below is the cost of ranking everything, which sets off compiling
                    # the query (JIT): a tenth to a third of a second, for a query that takes milliseconds.
                    connection.exec_driver_sql("SET LOCAL jit = off")
                candidates = [
                    (own, reused)
                    for own, reused in connection.execute(self._best_candidates(campaign_id, evaluated, maximize))
                ]
        found: dict[int, TrialResult] = {}
        if candidates:
            for result in self.results([i for pair in candidates for i in pair if i is not None]):
                held = found.get(result.problem_id)
                if held is None or _ranks_before(result, held, maximize):
                    found[result.problem_id] = result
        counts: dict[int, dict[str, int]] = {}
        baselines: dict[int, dict[str, int]] = {}
        for problem_id, state, baseline, n, _ in groups:
            mine = counts.setdefault(problem_id, {})
            mine[state] = mine.get(state, 0) + n
            apart = baselines.setdefault(problem_id, {})
            if baseline:
                apart[state] = apart.get(state, 0) + n
        return {
            problem_id: ProblemTally(found.get(problem_id), counts[problem_id], baselines[problem_id])
            for problem_id in counts
        }

    @staticmethod
    def _best_candidates(campaign_id: int, problem_ids: Sequence[int], maximize: bool) -> Any:
        """Per problem of ``problem_ids`` (those of a campaign with evaluated trials), the two trials that may be its
        best: the best of those measured themselves and the best of those that reused an earlier measurement (None
        where it has none).

        The best of a problem is its lowest (or highest) valid objective, among equals the earliest trial. Those
        measured themselves are found down the measurements' (problem, objective, trial) index, stopping at the
        first of this campaign, rather than by ranking every valid measurement of the campaign: that costs a
        read command (``fleet status CAMPAIGN``, ``fleet best``) a third of a second at 100,000 trials.
        """
        # Not trials_with_measurements: the reuse rule's two halves apart, a trial's own measurement joined by its id
        # and a reused one's by its source's, so that each walk has its index (the measurements', ix_trials_reused).
        objective = Measurement.objective.desc() if maximize else Measurement.objective.asc()
        usable = (Trial.state == TrialState.EVALUATED, Measurement.valid.is_(True), Measurement.objective.is_not(None))
        problems = select(Problem.id.label("problem_id")).where(Problem.id.in_(problem_ids)).subquery()
        own_measurement = (
            Measurement.problem_id == problems.c.problem_id,
            Trial.campaign_id == campaign_id,
            Trial.source_trial_id.is_(None),
            *usable,
        )
        # Two walks down the index, as it is ordered: the best value, then the earliest trial that has it.
        value = (
            select(Measurement.objective)
            .join(Trial, Trial.id == Measurement.trial_id)
            .where(*own_measurement)
            .order_by(objective)
            .limit(1)
            .correlate(problems)  # two levels down: SQLAlchemy correlates one level by itself
            .scalar_subquery()
        )
        own = (
            select(Trial.id)
            .join(Measurement, Measurement.trial_id == Trial.id)
            .where(*own_measurement, Measurement.objective == value)
            .order_by(Measurement.trial_id)
            .limit(1)
            .scalar_subquery()
        )
        reused = (
            select(Trial.id)
            .join(Measurement, Measurement.trial_id == Trial.source_trial_id)
            .where(Trial.campaign_id == campaign_id, Trial.problem_id == problems.c.problem_id, *usable)
            .order_by(objective, Trial.id)
            .limit(1)
            .scalar_subquery()
        )
        return select(own, reused).select_from(problems)

    @patient
    def same_run_baseline(
        self, campaign_id: int, problem_id: int, config: Mapping[str, Any], knobs: Sequence[str]
    ) -> TrialResult | None:
        """The earliest valid baseline trial of a campaign's problem whose ``knobs`` have ``config``'s values, else
        (a baseline that pins those knobs to other values) its earliest valid baseline trial.

        Parameters
        ----------
        campaign_id, problem_id:
            Whose baseline trials to look through.
        config:
            The configuration to match (a best trial's), a knob it lacks matching one the baseline lacks.
        knobs:
            The knobs that must match: the run-time ones, for a like-for-like speedup.
        """
        query = (
            trials_with_measurements(Trial.id, Trial.config, measured=True)
            .where(
                Trial.campaign_id == campaign_id,
                Trial.problem_id == problem_id,
                Trial.baseline.is_(True),
                Trial.state == TrialState.EVALUATED,
                Measurement.valid.is_(True),
            )
            .order_by(Trial.id)
        )
        # A campaign has one baseline trial per combination of the run-time knobs the baseline leaves open: few.
        with self.transaction() as connection:
            baselines = connection.execute(query).all()
        found = next(
            (trial_id for trial_id, baseline in baselines if all(baseline.get(n) == config.get(n) for n in knobs)),
            # A baseline that pins a run-time knob (threads=1) matches no best that differs there: it is still
            # the baseline the user asked for, and the speedup over it is what they meant.
            baselines[0][0] if baselines else None,
        )
        return None if found is None else self.results([found])[0]

    # -- claims, leases and results ---------------------------------------------------------------------

    def _definition(self, connection: Connection, campaign_id: int, problem_id: int) -> tuple[dict, dict]:
        """A campaign's and a problem's definitions; both never change, so each process keeps them."""
        campaign = self._campaign_cache.get(campaign_id)
        if campaign is None:
            row = connection.execute(
                select(Campaign.workload, Campaign.space, Campaign.options).where(Campaign.id == campaign_id)
            ).one()
            campaign = self._campaign_cache[campaign_id] = {
                "workload": row.workload,
                "space": row.space,
                "remeasure": bool((row.options or {}).get("remeasure")),
            }
        problem = self._problem_cache.get(problem_id)
        if problem is None:
            row = connection.execute(select(Problem.kind, Problem.params).where(Problem.id == problem_id)).one()
            problem = self._problem_cache[problem_id] = {"kind": row.kind, "params": row.params}
        return campaign, problem

    @patient
    def claim(
        self,
        trial_id: int,
        phase: str,
        worker: str,
        lease: float,
        max_attempts: int,
        device_kind: str | None = None,
    ) -> TrialWork | None:
        """Take ``trial_id`` for ``phase`` (``compile`` or ``evaluate``), or None if it is not this worker's.

        A trial is free in its waiting state (``new`` before compiling, ``compiled`` before evaluating) or
        when the lease of an earlier claim has expired. Evaluation claims count attempts, and stop at
        ``max_attempts``; :meth:`reap` errors such a trial. An evaluation claim also returns the digest of
        the trial's artifact (the one built with the trial's toolchain), and its bytes when it is at most
        ``INLINE_BYTES``; and, in ``reuse``, the trial holding a measurement of the same measure key taken
        with the same toolchain on a device of ``device_kind`` (the claiming worker's), when there is one.
        """
        params = claim_params(trial_id, worker, lease)
        with self._steps() as connection:
            if phase == "compile":
                trial = self._run(connection, "claim_compile", params).first()
            else:
                params |= {"max_attempts": max_attempts, "device_kind": device_kind}
                trial = self._run(connection, "claim_evaluate", params).first()
            return None if trial is None else self._work(connection, trial, phase)

    def _work(self, connection: Connection, trial: Any, phase: str) -> TrialWork:
        """What a worker needs of a trial it claimed (a row of a claim statement)."""
        campaign, problem = self._definition(connection, trial.campaign_id, trial.problem_id)
        return TrialWork(
            trial_id=trial.id,
            campaign_id=trial.campaign_id,
            problem_id=trial.problem_id,
            problem_kind=problem["kind"],
            problem_params=problem["params"],
            target=trial.target,
            config=trial.config,
            build_key=trial.build_key,
            measure_key=trial.measure_key,
            workload=campaign["workload"],
            space=campaign["space"],
            toolchain=trial.toolchain or "",
            attempts=trial.attempts,
            artifact_digest=trial.artifact_digest if phase == "evaluate" else None,
            artifact_data=bytes(trial.artifact_data) if phase == "evaluate" and trial.artifact_data else None,
            reuse=None if phase != "evaluate" or trial.remeasure or campaign["remeasure"] else trial.reuse,
            reuse_valid=bool(phase == "evaluate" and trial.reuse_valid),
        )

    @patient
    def renew(self, trial_id: int, worker: str, lease: float, build_key: str | None = None) -> bool:
        """Extend this worker's lease on a trial (and on the artifact it builds, with the trials handed to that
        build); False if it lost it."""
        params = {"trial": trial_id, "owner": worker, "expires": utcnow() + timedelta(seconds=lease)}
        with self._steps() as connection:
            held = connection.execute(self._hot.renew_trial, params).rowcount
            if build_key is not None:
                connection.execute(self._hot.renew_build, params | {"key": build_key})
                connection.execute(self._hot.renew_handed, params | {"key": build_key})
        return bool(held)

    @patient
    def mark_compiled(self, trial_id: int, worker: str, toolchain: str = "", seconds: float | None = None) -> bool:
        """Move a trial this worker holds to ``compiled``, with the toolchain of the artifact it will evaluate
        and the seconds its compile held the worker's slot."""
        with self._steps() as connection:
            params = {"trial": trial_id, "owner": worker, "now": utcnow(), "built_with": toolchain, "took": seconds}
            return bool(connection.execute(self._hot.compiled, params).rowcount)

    @patient
    def record(
        self,
        trial_id: int,
        worker: str,
        *,
        state: str = TrialState.EVALUATED,
        reason: str | None = None,
        measurement: dict[str, Any] | None = None,
        stdout_tail: str | None = None,
        stderr_tail: str | None = None,
        source: int | None = None,
        seconds: float | None = None,
    ) -> bool:
        """Finish a trial this worker holds: its terminal state, and its measurement if it has one.

        ``source`` is the trial whose measurement it reused instead of measuring (see :meth:`claim`);
        ``seconds`` the time its evaluation held the worker's slot.
        Returns False, writing nothing, when the worker no longer holds the trial (its lease expired and
        the work went to another worker): that worker records it instead.
        """
        now = utcnow()
        params = {
            "trial": trial_id,
            "owner": worker,
            "final": state,
            "why": reason,
            "now": now,
            "out": stdout_tail,
            "err": stderr_tail,
            "source": source,
            "took": seconds,
        }
        if measurement is not None and self._hot.record_measured is not None:
            with self._steps() as connection:
                measured = {f"m_{name}": measurement.get(name, default) for name, default in MEASURED.items()}
                return bool(self._run(connection, "record_measured", params | measured).scalar())
        with self.transaction() as connection:
            trial = connection.execute(self._hot.finish_trial, params).first()
            if trial is not None and measurement is not None:
                row = {
                    "trial_id": trial_id,
                    "problem_id": trial.problem_id,
                    "target": trial.target,
                    "measure_key": trial.measure_key,
                    "created_at": now,
                }
                connection.execute(self._hot.put_measurement, row | measurement)
            return trial is not None

    @patient
    def fail_waiting(self, trial_id: int, reason: str) -> bool:
        """Error a trial that no worker holds (its build failed before it was claimed)."""
        with self.session() as session:
            return bool(
                rows_changed(
                    session.execute(
                        update(Trial)
                        .where(Trial.id == trial_id, Trial.state.in_(WAITING))
                        .values(state=TrialState.ERRORED, reason=reason, finished_at=utcnow())
                    )
                )
            )

    @patient
    def fail_faulted(self, trial_ids: Sequence[int], max_node_faults: int, why: str) -> set[int]:
        """Error the waiting trials of ``trial_ids`` that have met ``max_node_faults`` node faults; their ids."""
        # Counted per fault, not per worker: one worker may have met them all (a fleet of one).
        reason = f"met {max_node_faults} node faults, the last: {why}; the configuration may be the cause"
        with self.session() as session:
            failed = session.scalars(
                update(Trial)
                .where(
                    Trial.id.in_(list(trial_ids)),
                    Trial.state.in_(WAITING),
                    Trial.node_faults >= max_node_faults,
                )
                .values(state=TrialState.ERRORED, reason=reason, finished_at=utcnow())
                .returning(Trial.id)
            ).all()
        return set(failed)

    @patient
    def reap(self, max_attempts: int) -> list[Requeue]:
        """Give back work whose lease expired; error trials that have lost ``max_attempts`` workers."""
        now = utcnow()
        expired = Trial.lease_expires_at < now
        with self.session() as session:
            session.execute(
                update(Trial)
                .where(Trial.state == TrialState.EVALUATING, expired, Trial.attempts >= max_attempts)
                .values(
                    state=TrialState.ERRORED,
                    lease_expires_at=None,
                    finished_at=now,
                    reason=f"lost its worker {max_attempts} times (killed, or the node went away)",
                )
            )
            # Also a `compiled` trial whose attempts ran out while it waited for its lost message.
            session.execute(
                update(Trial)
                .where(Trial.state == TrialState.COMPILED, Trial.attempts >= max_attempts)
                .values(
                    state=TrialState.ERRORED,
                    finished_at=now,
                    reason=f"lost its worker {max_attempts} times (killed, or the node went away)",
                )
            )
            to_evaluate = session.execute(
                update(Trial)
                .where(Trial.state == TrialState.EVALUATING, expired)
                .values(state=TrialState.COMPILED, worker=None, lease_expires_at=None, queued_at=now)
                .returning(Trial.id, Trial.target)
            ).all()
            to_compile = session.execute(
                update(Trial)
                .where(Trial.state == TrialState.COMPILING, expired)
                .values(state=TrialState.NEW, worker=None, lease_expires_at=None, queued_at=now)
                .returning(Trial.id, Trial.target)
            ).all()
        return [Requeue(r.id, r.target, "evaluate") for r in to_evaluate] + [
            Requeue(r.id, r.target, "compile") for r in to_compile
        ]

    @patient
    def stale(
        self, older_than: float, campaign_id: int | None = None, served_within: float | None = None, limit: int = 1000
    ) -> list[Requeue]:
        """Waiting trials whose message went out more than ``older_than`` seconds ago: send them again.

        A message can be lost (a worker killed between a state change and the next send, or a broker
        without acknowledgements); a duplicate costs one refused claim, so sending again is safe.

        ``served_within``: only trials of a target that a worker heard from within that many seconds serves.
        Nobody consumes the queue of another, so its message was not lost, and one more would only make the
        queue grow at every pass; when a worker comes, it takes the message that waits.
        """
        now = utcnow()
        with self.session() as session:
            cutoff = now - timedelta(seconds=older_than)
            query = select(Trial.id).where(Trial.state.in_(WAITING), Trial.queued_at < cutoff)
            if campaign_id is not None:
                query = query.where(Trial.campaign_id == campaign_id)
            if served_within is not None:
                query = query.where(Trial.target.in_(served_targets(served_within)))
            ids = list(session.scalars(query.order_by(Trial.id).limit(limit)))
            if not ids:
                return []
            rows = session.execute(
                update(Trial)
                # Re-checked here: another reaper may have sent them again since the SELECT above.
                .where(Trial.id.in_(ids), Trial.state.in_(WAITING), Trial.queued_at < cutoff)
                .values(queued_at=now)
                .returning(Trial.id, Trial.target, Trial.state)
            ).all()
        return [Requeue(r.id, r.target, "compile" if r.state == TrialState.NEW else "evaluate") for r in rows]

    @patient
    def resend(self, trial_id: int, states: Sequence[str] = WAITING) -> list[Requeue]:
        """The trial, if it waits (in one of ``states``) for a message that nobody may send: what a worker
        whose work was lost sends.

        A worker loses its claim this way when the database crashed and came back without the claim's
        commit (workers commit without waiting for the disk): the trial is waiting again, and the
        message that brought it is gone. Sending it again is safe: a duplicate costs one refused claim.
        """
        with self.session() as session:
            rows = session.execute(
                update(Trial)
                .where(Trial.id == trial_id, Trial.state.in_(tuple(states)))
                .values(queued_at=utcnow())
                .returning(Trial.id, Trial.target, Trial.state)
            ).all()
        return [Requeue(r.id, r.target, "compile" if r.state == TrialState.NEW else "evaluate") for r in rows]

    @patient
    def pending(self, campaign_id: int) -> list[Requeue]:
        """Trials of a campaign waiting for a message that may have been lost: what resuming sends again."""
        with self.session() as session:
            rows = session.execute(
                select(Trial.id, Trial.target, Trial.state)
                .where(Trial.campaign_id == campaign_id, Trial.state.in_(WAITING))
                .order_by(Trial.id)
            ).all()
        return [Requeue(r.id, r.target, "compile" if r.state == TrialState.NEW else "evaluate") for r in rows]
