"""The store's builds: artifacts, build claims, and a compile task's start and finish."""

from __future__ import annotations

import hashlib
import json
from collections import namedtuple
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, update

from fleet.canonical import build_part
from fleet.states import LEASED, ArtifactState, TrialState
from fleet.store._base import patient
from fleet.store._hotpath import claim_params
from fleet.store._models import Artifact, Trial, utcnow
from fleet.store._trials import TrialStore
from fleet.store._types import CompileStart, NewTrial, Requeue, TrialWork

# An artifact's row as a statement that creates it returns it.
ARTIFACT_FIELDS = [column.key for column in Artifact.__table__.columns]
ArtifactRow = namedtuple("ArtifactRow", ARTIFACT_FIELDS)  # type: ignore[misc]  # the table's columns: no literal list


class BuildStore(TrialStore):
    """Artifacts and their builds; a build is claimed with the trial that needs it."""

    @patient
    def start_compile(
        self,
        trial_id: int,
        worker: str,
        lease: float,
        max_attempts: int,
        toolchains: Mapping[int, str] | None = None,
    ) -> CompileStart:
        """Everything a compile task does before it builds (in one transaction on SQLite; see :meth:`_steps`).

        The trial is claimed and so is its build (see :meth:`claim_build`); a trial whose artifact is
        already built moves straight on to ``compiled``. On PostgreSQL, the claim creates the artifact
        in the same statement when it is new, as it is for most trials.

        ``toolchains`` is the toolchain the worker found for each campaign it has met, by campaign id: the
        artifact is the one of the trial's build key built with it. A trial of a campaign it does not name is
        claimed without its build: the start is ``claimed`` with no artifact, and the worker, once it knows
        the toolchain, calls :meth:`claim_build`. None stands for an empty toolchain for every campaign.
        """
        fallback = "" if toolchains is None else None
        with self._steps() as connection:
            params = claim_params(trial_id, worker, lease)
            merged = self._hot.claim_and_create is not None
            if merged:
                params |= {"toolchains": json.dumps({str(k): v for k, v in (toolchains or {}).items()})}
                params |= {"fallback": fallback}
            row = self._run(connection, "claim_and_create" if merged else "claim_compile", params).first()
            if row is None:
                return CompileStart("skipped")
            work = self._work(connection, row, "compile")
            toolchain = (toolchains or {}).get(work.campaign_id, fallback)
            if toolchain is None:
                return CompileStart("claimed", work)
            if not merged:
                artifact = self._claim_build(connection, work, toolchain, worker, lease, max_attempts)
            elif row.artifact_id is not None:
                created = ArtifactRow(*(getattr(row, f"artifact_{name}") for name in ARTIFACT_FIELDS))
                return CompileStart("claimed", work, created)
            else:
                artifact = self._take_build(connection, work.build_key, toolchain, worker, lease, max_attempts)
            if artifact.state == ArtifactState.BUILT:
                params = {"trial": trial_id, "owner": worker, "now": utcnow(), "built_with": toolchain}
                connection.execute(self._hot.compiled, params)
                return CompileStart(TrialState.COMPILED)
            return CompileStart("claimed", work, artifact)

    def add_trials(
        self, campaign_id: int, target: str, trials: Sequence[NewTrial], *, remeasure: bool = False
    ) -> list[tuple[int, str]]:
        """As :meth:`TrialStore.add_trials`; trials to be measured again (``remeasure``) are built again too.

        A build's failure is remembered for its key and toolchain, and ends every later trial that needs it
        without a build. A campaign that remeasures (``fleet tune --remeasure``, ``fleet call --remeasure``)
        builds such a key once more: see :meth:`forget_failed_builds`.
        """
        added = super().add_trials(campaign_id, target, trials, remeasure=remeasure)
        if remeasure and trials:
            self.forget_failed_builds(campaign_id, {t.build_key for t in trials})
        return added

    @patient
    def forget_failed_builds(self, campaign_id: int, build_keys: Iterable[str], until: datetime | None = None) -> int:
        """Forget the failed builds of ``build_keys`` that failed before the campaign's first trial of their key
        (before ``until``, when given: Tuna's jobs run again, whose first trials are the ones that failed).

        Its next trial of such a key builds it again (with whatever toolchain its worker has): once per campaign,
        as a failure of this campaign's own build of the key is newer than its first trial of the key, and stays.
        Returns how many were forgotten. The trials that failure ended keep their reason and log.
        """
        keys = sorted(set(build_keys))
        if not keys:
            return 0
        first = (
            select(func.min(Trial.created_at))
            .where(Trial.campaign_id == campaign_id, Trial.build_key == Artifact.build_key)
            .scalar_subquery()
        )
        failed_at = func.coalesce(Artifact.built_at, Artifact.created_at)
        before = failed_at < (first if until is None else until)
        forget = delete(Artifact).where(Artifact.build_key.in_(keys), Artifact.state == ArtifactState.FAILED, before)
        with self._steps() as connection:
            return connection.execute(forget).rowcount

    @patient
    def claim_build(self, work: TrialWork, worker: str, lease: float, max_attempts: int, toolchain: str = "") -> Any:
        """The artifact of ``work``'s build key and ``toolchain`` (the worker's), claimed by ``worker`` when nobody
        holds a live lease on it.

        The caller owns the build when the returned artifact is ``building`` with ``worker`` as its worker;
        ``built`` and ``failed`` are final; ``building`` by another worker means wait for it. Returns a row
        with the artifact's columns. A build whose lease expired ``max_attempts`` times is ``failed``.
        """
        with self._steps() as connection:
            return self._claim_build(connection, work, toolchain, worker, lease, max_attempts)

    def _claim_build(
        self, connection: Connection, work: TrialWork, toolchain: str, worker: str, lease: float, max_attempts: int
    ) -> Any:
        now = utcnow()
        created = self._run(
            connection,
            "create_build",
            {
                "build_key": work.build_key,
                "problem_id": work.problem_id,
                "target": work.target,
                "build_config": build_part(work.space, work.config),
                "toolchain": toolchain,
                "state": ArtifactState.BUILDING,
                "worker": worker,
                "expires": now + timedelta(seconds=lease),
                "now": now,
            },
        ).first()
        if created is not None:
            return created
        return self._take_build(connection, work.build_key, toolchain, worker, lease, max_attempts)

    def _take_build(
        self, connection: Connection, build_key: str, toolchain: str, worker: str, lease: float, max_attempts: int
    ) -> Any:
        """An artifact that exists: as it is, or taken over (or failed) when its builder's lease expired."""
        hot = self._hot
        now = utcnow()
        key = {"key": build_key, "built_with": toolchain}
        artifact = connection.execute(hot.build, key).one()
        if artifact.state != ArtifactState.BUILDING or artifact.lease_expires_at >= now:
            return artifact
        if artifact.attempts >= max_attempts:
            why = f"the build was lost {max_attempts} times (its worker died)"
            taken = connection.execute(hot.fail_build, key | {"now": now, "why": why}).first()
        else:
            expires = now + timedelta(seconds=lease)
            taken = connection.execute(hot.take_build, key | {"now": now, "owner": worker, "expires": expires}).first()
        return taken or connection.execute(hot.build, key).one()

    @patient
    def artifact(self, build_key: str, toolchain: str | None = None) -> Artifact | None:
        """The artifact of ``build_key`` built with ``toolchain``; with None, the first one built of that key."""
        query = select(Artifact).where(Artifact.build_key == build_key)
        if toolchain is not None:
            query = query.where(Artifact.toolchain == toolchain)
        with self.session() as session:
            return session.scalars(query.order_by(Artifact.id)).first()

    @patient
    def artifacts(self, build_key: str) -> list[Artifact]:
        """Every artifact of ``build_key``: one per toolchain that built it."""
        with self.session() as session:
            return list(session.scalars(select(Artifact).where(Artifact.build_key == build_key).order_by(Artifact.id)))

    @patient
    def finish_build(
        self,
        build_key: str,
        worker: str,
        *,
        data: bytes | None,
        reason: str | None = None,
        log_tail: str | None = None,
        seconds: float | None = None,
        trial_id: int | None = None,
        toolchain: str = "",
        handed: list[int] | None = None,
        took: float | None = None,
    ) -> bool:
        """Record the build this worker owns: ``data`` when it succeeded, ``reason`` when it failed.

        ``toolchain`` is the one it built with (its artifact's). With ``trial_id``, the trial this worker holds
        moves to ``compiled`` with it (``took``: the seconds its compile held the slot); with ``handed`` too, so
        do the trials other compiles handed to this build (:meth:`hand_to_builder`), whose ids are appended to
        it, when the build succeeded.
        """
        now = utcnow()
        blob = None if data is None else hashlib.sha256(data).hexdigest()
        params: dict[str, Any] = {
            "key": build_key,
            "owner": worker,
            "final": ArtifactState.BUILT if data is not None else ArtifactState.FAILED,
            "blob": blob,
            "why": reason,
            "log": log_tail,
            "seconds": seconds,
            "now": now,
            "built_with": toolchain,
            "took": took,
        }
        with self._steps() as connection:
            if data is not None and trial_id is not None and self._hot.built_and_compiled is not None:
                params |= {"trial": trial_id, "blob_size": len(data), "blob_data": data, "sweep": handed is not None}
                row = self._run(connection, "built_and_compiled", params).first()
                if handed is not None:
                    handed += sorted(row.handed or [])
                return bool(row.builds)
            # In this order, so that a worker stopped between two statements leaves a trial that its lease
            # gives back.
            if data is not None:
                connection.execute(
                    self._hot.put_blob, {"digest": blob, "size": len(data), "data": data, "created_at": now}
                )
            done = connection.execute(self._hot.finish_build, params).rowcount
            if done and data is not None and trial_id is not None:
                compiled = {"trial": trial_id, "owner": worker, "now": now, "built_with": toolchain, "took": took}
                connection.execute(self._hot.compiled, compiled)
                if handed is not None:
                    handed += sorted(connection.scalars(self._hot.compile_handed, params | {"trial": trial_id}))
            return bool(done)

    @patient
    def hand_to_builder(
        self, trial_id: int, worker: str, build_key: str, toolchain: str, builder: str, lease: float
    ) -> bool:
        """Give the trial this worker holds to ``builder``, which is building its artifact right now.

        The trial's compile then ends with that build (:meth:`finish_build` with ``handed``), and this worker's
        build slot is free meanwhile. ``builder`` renews the trial's lease with its own, so if it dies the trial
        comes back like any other. False when that build is no longer running (built, failed or taken over):
        the caller goes on itself.
        """
        # The caller looks at the build again afterwards (see compile_trial): a build that ended just as the
        # trial was handed to it may not have seen the trial.
        building = select(Artifact.id).where(
            Artifact.build_key == build_key,
            Artifact.toolchain == toolchain,
            Artifact.state == ArtifactState.BUILDING,
            Artifact.worker == builder,
        )
        handed = (
            update(Trial)
            .where(Trial.id == trial_id, Trial.worker == worker, Trial.state == TrialState.COMPILING, building.exists())
            .values(worker=builder, lease_expires_at=utcnow() + timedelta(seconds=lease))
        )
        with self._steps() as connection:
            return bool(connection.execute(handed).rowcount)

    @patient
    def take_back(self, trial_id: int, worker: str, builder: str, lease: float) -> bool:
        """Take back a trial this worker handed to ``builder``, if that build has not ended its compile."""
        taken = (
            update(Trial)
            .where(Trial.id == trial_id, Trial.worker == builder, Trial.state == TrialState.COMPILING)
            .values(worker=worker, lease_expires_at=utcnow() + timedelta(seconds=lease))
        )
        with self._steps() as connection:
            return bool(connection.execute(taken).rowcount)

    @patient
    def handed_trials(self, trial_id: int, build_key: str, worker: str) -> list[int]:
        """The trials other compiles handed to this worker's build of ``build_key`` for ``trial_id``
        (:meth:`hand_to_builder`), still this worker's: those of a build that failed, for it to record.

        A successful build's :meth:`finish_build` moves them to ``compiled``. A trial handed just as the build
        ended, and not seen there, is taken back by its own compile (see ``fleet.workers.execute.compile_trial``).
        """
        handed = select(Trial.id).where(
            Trial.build_key == build_key,
            Trial.worker == worker,
            Trial.state == TrialState.COMPILING,
            Trial.id != trial_id,
        )
        with self._steps() as connection:
            return list(connection.scalars(handed.order_by(Trial.id)))

    @patient
    def give_back(
        self,
        trial_id: int,
        worker: str,
        phase: str,
        build_key: str | None = None,
        toolchain: str | None = None,
        fault: bool = True,
    ) -> list[Requeue]:
        """Send a trial this worker holds back to its queue: its node's fault (``fault``), or a message that
        brought it to a worker of another target; never its configuration's.

        The trial waits again as before its claim, with ``node_faults`` counted for a fault, and its evaluation
        attempt returned. The build this worker was making for it (``build_key`` with ``toolchain``) is forgotten, never
        recorded as failed, and so are the trials other compiles handed to that build: they wait again too.
        Returns what to send.
        """
        waiting, running = (
            (TrialState.NEW, TrialState.COMPILING)
            if phase == "compile"
            else (TrialState.COMPILED, TrialState.EVALUATING)
        )
        held = and_(Trial.worker == worker, Trial.state == running)
        mine = Trial.id == trial_id
        if build_key is not None:
            mine = or_(mine, Trial.build_key == build_key)
        with self.session() as session:
            if build_key is not None:
                building = [
                    Artifact.build_key == build_key,
                    Artifact.state == ArtifactState.BUILDING,
                    Artifact.worker == worker,
                ]
                if toolchain is not None:
                    building.append(Artifact.toolchain == toolchain)
                session.execute(delete(Artifact).where(*building))
            rows = session.execute(
                update(Trial)
                .where(mine, held)
                .values(
                    state=waiting,
                    worker=None,
                    lease_expires_at=None,
                    queued_at=utcnow(),
                    node_faults=Trial.node_faults + (1 if fault else 0),
                    attempts=Trial.attempts - (1 if phase == "evaluate" else 0),
                )
                .returning(Trial.id, Trial.target)
            ).all()
        return [Requeue(row.id, row.target, phase) for row in rows]

    def give_back_lost(self, trial_ids: Sequence[int], owner: str) -> list[Requeue]:
        """Give back what the lost worker process ``owner`` held of ``trial_ids``: its node's fault.

        Each trial it was compiling or evaluating waits again as :meth:`give_back` leaves it (``node_faults``
        counted, the evaluation attempt returned), and the builds it was making are forgotten. Trials it had
        finished, or that another process holds, are left as they are.
        """
        with self.session() as session:
            held = session.execute(
                select(Trial.id, Trial.state, Trial.build_key, Trial.toolchain).where(
                    Trial.id.in_(list(trial_ids)),
                    Trial.worker == owner,
                    Trial.state.in_(LEASED),
                )
            ).all()
        given: list[Requeue] = []
        for trial_id, state, build_key, toolchain in held:
            if state == TrialState.COMPILING:
                given += self.give_back(trial_id, owner, "compile", build_key, toolchain)
            else:
                given += self.give_back(trial_id, owner, "evaluate")
        return given
