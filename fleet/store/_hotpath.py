"""The statements of the workers' hot path: claims, leases, builds and results."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    BindParameter,
    Boolean,
    DateTime,
    Float,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from fleet.states import ArtifactState, CampaignStatus, TrialState
from fleet.store._models import Artifact, Blob, Campaign, Measurement, Trial, utcnow

# An evaluation claim brings an artifact up to this size along: reading it back from a worker's disk
# cache would cost more than the bytes.
INLINE_BYTES = 64 * 1024


def _default(column: str) -> Any:
    default = Measurement.__table__.c[column].default
    return default.arg if default is not None and default.is_scalar else None


# What a worker measured, as :meth:`Store.record` takes it, with the model's default for each field it leaves out.
MEASURED = {
    name: _default(name)
    for name in (
        "objective_name", "maximize", "objective", "valid", "samples", "metrics", "objectives", "toolchain", "node",
        "gpu", "device_kind", "device", "worker",
    )
}  # fmt: skip


def claim_params(trial_id: int, worker: str, lease: float) -> dict[str, Any]:
    """The parameters of a claim statement: the trial, its new holder, now and when the lease expires."""
    now = utcnow()
    return {"trial": trial_id, "owner": worker, "now": now, "expires": now + timedelta(seconds=lease)}


class _Binds(NamedTuple):
    """The parameters that the hot path's statements share, by name."""

    trial: BindParameter[Any]
    owner: BindParameter[Any]
    key: BindParameter[Any]
    now: BindParameter[Any]
    expires: BindParameter[Any]


# The columns a new artifact's row is given from parameters (create_build) or from the claimed trial (claim_and_create).
_CREATED = ("build_key", "problem_id", "target", "build_config", "toolchain", "state", "worker")


class HotPath:
    """The statements of the workers' hot path, built once per store.

    Building a SQLAlchemy statement costs more than running it; a statement built once is compiled once
    and found in the engine's cache on every later execution.
    """

    def __init__(self, insert: Callable[[type], Any], dialect: str) -> None:
        binds = _Binds(
            trial=bindparam("trial"),
            owner=bindparam("owner"),
            key=bindparam("key"),
            now=bindparam("now", type_=DateTime()),
            expires=bindparam("expires", type_=DateTime()),
        )
        self._claims(binds)
        self._trial_ends(insert, binds)
        self.record_measured: Select[int] | None = None
        if dialect == "postgresql":
            self._record_measured(insert, binds)
        self._builds(insert, binds)
        self.built_and_compiled: Select[Any, Any] | None = None
        self.claim_and_create: Select[*tuple[Any, ...]] | None = None
        if dialect == "postgresql":
            self._built_and_compiled(insert, binds)
            self._claim_and_create(insert, binds)

    def _claims(self, b: _Binds) -> None:
        """``claim_compile`` and ``claim_evaluate``: a trial taken for its compile, or for its evaluation."""
        trial, owner, now, expires = b.trial, b.owner, b.now, b.expires
        claimed = (
            Trial.id,
            Trial.campaign_id,
            Trial.problem_id,
            Trial.target,
            Trial.config,
            Trial.build_key,
            Trial.measure_key,
            Trial.attempts,
            Trial.toolchain,
            Trial.remeasure,
        )

        # A paused campaign's trials wait: their messages are dropped, and resuming sends them again.
        paused = exists().where(Campaign.id == Trial.campaign_id, Campaign.status == CampaignStatus.PAUSED)

        def claim(waiting: str, running: str, **values: Any) -> Any:
            free = or_(Trial.state == waiting, and_(Trial.state == running, Trial.lease_expires_at < now))
            return (
                update(Trial)
                .where(Trial.id == trial, free, ~paused)
                .values(
                    state=running,
                    worker=owner,
                    lease_expires_at=expires,
                    started_at=func.coalesce(Trial.started_at, now),
                    **values,
                )
            )

        self.claim_compile = claim(TrialState.NEW, TrialState.COMPILING).returning(*claimed)
        # Spelled out: SQLite's RETURNING renders columns unqualified, and ``build_key = build_key`` would
        # compare the artifact with itself. The artifact is the one its compile took: built with its toolchain.
        artifact = and_(
            Artifact.build_key == literal_column("trials.build_key"),
            Artifact.toolchain == literal_column("trials.toolchain"),
        )
        digest = select(Artifact.blob_digest).where(artifact)
        small = (
            select(Blob.data)
            .join(Artifact, Artifact.blob_digest == Blob.digest)
            .where(artifact, Blob.size <= INLINE_BYTES)
        )
        # A measurement this evaluation may reuse instead of measuring: the same measure key, taken with the
        # same toolchain on the same kind of device (the claiming worker's, a parameter). Found in the claim,
        # so that reuse costs no statement of its own.
        same = (
            Measurement.measure_key == literal_column("trials.measure_key"),
            Measurement.toolchain == literal_column("trials.toolchain"),
            Measurement.device_kind == bindparam("device_kind", None, type_=Text),
        )
        reusable = select(Measurement.id).where(*same).order_by(Measurement.id).limit(1)
        self.claim_evaluate = (
            claim(TrialState.COMPILED, TrialState.EVALUATING, attempts=Trial.attempts + 1)
            .where(Trial.attempts < bindparam("max_attempts"))
            .returning(
                *claimed,
                digest.scalar_subquery().label("artifact_digest"),
                small.scalar_subquery().label("artifact_data"),
                reusable.with_only_columns(Measurement.trial_id).scalar_subquery().label("reuse"),
                reusable.with_only_columns(Measurement.valid).scalar_subquery().label("reuse_valid"),
            )
        )

    def _trial_ends(self, insert: Callable[[type], Any], b: _Binds) -> None:
        """A held trial compiled, its lease renewed, its run ended; a measurement stored."""
        trial, owner, now, expires = b.trial, b.owner, b.now, b.expires
        held = (Trial.id == trial, Trial.worker == owner)
        self.compiled = (
            update(Trial)
            .where(*held, Trial.state == TrialState.COMPILING)
            .values(
                state=TrialState.COMPILED,
                worker=None,
                lease_expires_at=None,
                queued_at=now,
                toolchain=bindparam("built_with", type_=Text),
                compile_seconds=bindparam("took", None, type_=Float),
            )
        )
        # Not IN (...): SQLAlchemy expands an IN list on every execution.
        running = or_(Trial.state == TrialState.COMPILING, Trial.state == TrialState.EVALUATING)
        self.renew_trial = update(Trial).where(*held, running).values(lease_expires_at=expires)
        self.finish_trial = (
            update(Trial)
            .where(*held, running)
            .values(
                state=bindparam("final"),
                reason=bindparam("why"),
                lease_expires_at=None,
                finished_at=now,
                stdout_tail=bindparam("out"),
                stderr_tail=bindparam("err"),
                # The trial whose measurement it reused, or None.
                source_trial_id=bindparam("source", None, type_=Integer),
                eval_seconds=bindparam("took", None, type_=Float),
            )
            .returning(Trial.id, Trial.problem_id, Trial.target, Trial.measure_key)
        )
        self.put_measurement = insert(Measurement).on_conflict_do_nothing()

    def _record_measured(self, insert: Callable[[type], Any], b: _Binds) -> None:
        """``record_measured`` (PostgreSQL only): ``finish_trial`` and its measurement's insert in one statement."""
        now = b.now
        # Atomic without a transaction. The measurement's parameters are prefixed: an UPDATE sets every column
        # named in the parameters.
        done = self.finish_trial.cte("finished")
        columns = Measurement.__table__.columns
        measured = (
            insert(Measurement)
            .from_select(
                ["trial_id", "problem_id", "target", "measure_key", "created_at", *MEASURED],
                select(
                    done.c.id,
                    done.c.problem_id,
                    done.c.target,
                    done.c.measure_key,
                    cast(now, DateTime()),
                    # Cast: a prepared statement cannot tell a bare select-list parameter's type.
                    *(cast(bindparam(f"m_{name}", type_=columns[name].type), columns[name].type) for name in MEASURED),
                ),
            )
            .on_conflict_do_nothing()
            .cte("measured")
        )
        self.record_measured = select(func.count()).select_from(done).add_cte(measured)

    def _builds(self, insert: Callable[[type], Any], b: _Binds) -> None:
        """An artifact's build: found, created, taken over, renewed with the trials handed to it, failed or ended."""
        trial, owner, key, now, expires = b.trial, b.owner, b.key, b.now, b.expires
        columns = Artifact.__table__.columns
        # Not named "toolchain": an UPDATE keeps the names of its columns for its SET clause.
        built_with = bindparam("built_with", type_=Text)
        mine = (Artifact.build_key == key, Artifact.toolchain == built_with)
        building = (*mine, Artifact.state == ArtifactState.BUILDING)
        self.build = select(*columns).where(*mine)
        self.create_build = (
            insert(Artifact)
            .values(
                **{name: bindparam(name) for name in _CREATED}, lease_expires_at=expires, attempts=1, created_at=now
            )
            .on_conflict_do_nothing()
            .returning(*columns)
        )
        expired = update(Artifact).where(*building, Artifact.lease_expires_at < now)
        self.take_build = expired.values(
            worker=owner, lease_expires_at=expires, attempts=Artifact.attempts + 1
        ).returning(*columns)
        self.fail_build = expired.values(state=ArtifactState.FAILED, reason=bindparam("why")).returning(*columns)
        # By key and holder: a worker builds one artifact at a time, so its toolchain need not be named.
        self.renew_build = (
            update(Artifact)
            .where(Artifact.build_key == key, Artifact.state == ArtifactState.BUILDING, Artifact.worker == owner)
            .values(lease_expires_at=expires)
        )
        # The trials other compiles handed to that build (Store.hand_to_builder) are held with it, and compiled
        # with it (``trial``: the build's own, which ``compiled`` moves).
        # 'compiling' as a literal, not a parameter: a prepared statement's generic plan may then use the
        # partial index ix_trials_compiling_build. Without it, each build read every trial compiled since the
        # last vacuum (82 to 393 us a build within a round of fleet bench dispatch).
        handed = (
            Trial.build_key == key,
            Trial.worker == owner,
            Trial.state == literal_column(f"'{TrialState.COMPILING}'"),
        )
        self.renew_handed = update(Trial).where(*handed).values(lease_expires_at=expires)
        self.compile_handed = (
            update(Trial)
            .where(*handed, Trial.id != trial)
            .values(state=TrialState.COMPILED, worker=None, lease_expires_at=None, queued_at=now, toolchain=built_with)
            .returning(Trial.id)
        )
        self.put_blob = insert(Blob).on_conflict_do_nothing()
        self.finish_build = (
            update(Artifact)
            .where(*building, Artifact.worker == owner)
            .values(
                state=bindparam("final"),
                blob_digest=bindparam("blob"),
                reason=bindparam("why"),
                log_tail=bindparam("log"),
                build_seconds=bindparam("seconds"),
                built_at=now,
                lease_expires_at=None,
            )
        )

    def _built_and_compiled(self, insert: Callable[[type], Any], b: _Binds) -> None:
        """``built_and_compiled`` (PostgreSQL only): a successful build's blob, artifact and trials in one statement."""
        now = b.now
        # The blob's parameters are not named after columns, which an UPDATE would set.
        stored = (
            insert(Blob)
            .values(digest=bindparam("blob"), size=bindparam("blob_size"), data=bindparam("blob_data"), created_at=now)
            .on_conflict_do_nothing()
            .cte("stored")
        )
        built = self.finish_build.returning(Artifact.build_key).cte("built_now")
        compiled = self.compiled.where(select(built.c.build_key).exists()).cte("compiled_now")
        # The trials other compiles handed to this build (Store.hand_to_builder), when the caller sends their
        # evaluations (``sweep``): compiled in the same statement, as a round trip more per build would cost
        # a build worker a third of its rate on cheap trials.
        handed_now = (
            self.compile_handed.where(bindparam("sweep", type_=Boolean), select(built.c.build_key).exists())
        ).cte("handed")
        self.built_and_compiled = select(
            select(func.count()).select_from(built).scalar_subquery().label("builds"),
            select(func.array_agg(handed_now.c.id)).scalar_subquery().label("handed"),
        ).add_cte(stored, compiled)

    def _claim_and_create(self, insert: Callable[[type], Any], b: _Binds) -> None:
        """``claim_and_create`` (PostgreSQL only): a compile claim and its artifact's creation in one statement."""
        owner, now, expires = b.owner, b.now, b.expires
        columns = Artifact.__table__.columns
        # The artifact's build-time knobs are fleet.canonical.build_part's, in SQL: those of the trial's
        # configuration that the campaign's space has and does not mark ``build: false``.
        trial_claimed = self.claim_compile.cte("claimed")
        knob = (
            func.jsonb_each(Campaign.space.op("->")(literal_column("'knobs'")))
            .table_valued("key", "value")
            .render_derived(name="knob")
        )
        value = trial_claimed.c.config.op("->")(knob.c.key)
        build_flag = cast(knob.c.value.op("->>")(literal_column("'build'")), Boolean)
        build_config = (
            select(func.coalesce(func.jsonb_object_agg(knob.c.key, value), literal_column("'{}'::jsonb")))
            .where(value.is_not(None), func.coalesce(build_flag, true()))
            .scalar_subquery()
        )
        # The toolchain this worker found for the trial's campaign (``toolchains``: a JSON object by campaign
        # id), or ``fallback``. A campaign it has not met yet gets no artifact here: the worker learns the
        # toolchain from the claimed trial, and creates the artifact with claim_build.
        known = cast(bindparam("toolchains", type_=Text), JSONB).op("->>")(cast(trial_claimed.c.campaign_id, Text))
        toolchain = func.coalesce(known, cast(bindparam("fallback", None, type_=Text), Text))
        created_artifact = (
            insert(Artifact)
            .from_select(
                [*_CREATED, "lease_expires_at", "attempts", "created_at"],
                select(
                    trial_claimed.c.build_key,
                    trial_claimed.c.problem_id,
                    trial_claimed.c.target,
                    build_config,
                    toolchain,
                    literal_column(f"'{ArtifactState.BUILDING}'"),
                    cast(owner, Text),  # Cast: see record_measured.
                    cast(expires, DateTime()),
                    literal_column("1"),
                    cast(now, DateTime()),
                )
                .join_from(trial_claimed, Campaign, Campaign.id == trial_claimed.c.campaign_id)
                .where(toolchain.is_not(None)),
            )
            .on_conflict_do_nothing()
            .returning(*columns)
            .cte("created")
        )
        self.claim_and_create = select(
            *trial_claimed.c, *(c.label(f"artifact_{c.key}") for c in created_artifact.c)
        ).select_from(trial_claimed.outerjoin(created_artifact, true()))
