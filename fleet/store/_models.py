"""SQLAlchemy models. Unique constraints do the deduplication; the lease columns decide who owns work."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Select,
    String,
    Text,
    UniqueConstraint,
    and_,
    false,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from fleet.clock import utcnow
from fleet.states import ArtifactState, CampaignStatus, ChainState, TrialState

JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType}


class Problem(Base):
    """One thing to tune: a kind plus its parameters, unique by kind and canonical parameters."""

    __tablename__ = "problems"
    __table_args__ = (UniqueConstraint("kind", "params_key", name="uq_problem_kind_params"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]]
    params_key: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

    tags: Mapped[list[ProblemTag]] = relationship(back_populates="problem", cascade="all, delete-orphan")


class ProblemTag(Base):
    __tablename__ = "problem_tags"

    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)

    problem: Mapped[Problem] = relationship(back_populates="tags")


class Campaign(Base):
    """Tuning a set of problems on a target over a space with a strategy and a budget."""

    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    target: Mapped[str] = mapped_column(String(64), index=True)
    space: Mapped[dict[str, Any]]
    strategy: Mapped[dict[str, Any]]
    workload: Mapped[dict[str, Any]]
    workload_key: Mapped[str] = mapped_column(String(64))
    baseline: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    options: Mapped[dict[str, Any]]
    provenance: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), default=CampaignStatus.RUNNING)
    # Why a campaign ended in ``failed`` (a driver could not go on with it); shown by ``fleet status``.
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Submitted campaigns are driven by ``fleet driver`` processes; the others by the process that runs them.
    submitted: Mapped[bool] = mapped_column(Boolean, default=False)
    # A weight: campaigns on one target share its evaluation slots in proportion to it.
    priority: Mapped[float] = mapped_column(Float, default=1.0)
    # The one live driver of a campaign holds this lease, and renews it while it drives.
    driver: Mapped[str | None] = mapped_column(String(255), nullable=True)
    driver_lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # The team that owns it: a PostgreSQL role whose members alone read and steer it (row-level security, migration
    # 0014). None on SQLite, and for a campaign submitted before teams or by an operator: only operators see it.
    team: Mapped[str | None] = mapped_column(String(63), nullable=True)


class Team(Base):
    """A team of submitters: a PostgreSQL group role, named here by ``fleet team add`` (see fleet.store._teams)."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class CampaignProblem(Base):
    __tablename__ = "campaign_problems"

    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, default=0)


class Blob(Base):
    """Content-addressed bytes: source bundles and built artifacts."""

    __tablename__ = "blobs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Artifact(Base):
    """What a build produced: one per build key (problem + target + build-time knobs + workload) and toolchain.

    The toolchain is the one the build worker found on its own machine, so two workers with different compilers
    build a key twice, each artifact with its own toolchain; the unique constraint keeps one build per pair.
    """

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("build_key", "toolchain", name="uq_artifact_build"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    build_key: Mapped[str] = mapped_column(String(64))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    target: Mapped[str] = mapped_column(String(64))
    build_config: Mapped[dict[str, Any]]
    toolchain: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default=ArtifactState.BUILDING)
    blob_digest: Mapped[str | None] = mapped_column(ForeignKey("blobs.digest"), nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    build_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    built_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Trial(Base):
    """One configuration of one problem on one target in a campaign (Tuna's job)."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("campaign_id", "problem_id", "target", "config_key", name="uq_trial_config"),
        Index("ix_trials_state_lease", "state", "lease_expires_at"),
        # A campaign's counts by problem, state and baseline read from the index alone (Store.tally).
        Index("ix_trials_campaign_state", "campaign_id", "state", "problem_id", "baseline", "id"),
        # The trials that reused an earlier measurement, ranked apart from those measured themselves (Store.tally).
        Index(
            "ix_trials_reused",
            "campaign_id",
            "problem_id",
            postgresql_where=text("source_trial_id IS NOT NULL"),
            sqlite_where=text("source_trial_id IS NOT NULL"),
        ),
        # The compiles handed to a build (Store.hand_to_builder), found by its key at each build's end. Partial:
        # a trial's row enters it once, as its compile starts, not at each change of its state.
        Index(
            "ix_trials_compiling_build",
            "build_key",
            postgresql_where=text(f"state = '{TrialState.COMPILING}'"),
            sqlite_where=text(f"state = '{TrialState.COMPILING}'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    target: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]]
    config_key: Mapped[str] = mapped_column(String(64))
    # Not indexed: nothing looks a trial up by these, and every state change would write the indexes.
    build_key: Mapped[str] = mapped_column(String(64))
    measure_key: Mapped[str] = mapped_column(String(64))
    # The toolchain its artifact was built with, set when it is compiled: the evaluation takes that artifact.
    toolchain: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Measure it even when a measurement of the same key, toolchain and device kind exists (--remeasure).
    remeasure: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    seq: Mapped[int] = mapped_column(Integer, default=0)
    baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default=TrialState.NEW)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Times a node's fault (a full disk, an unwritable cache, a sandbox that would not start) gave it back to
    # its queue: counted here, never as an attempt against the configuration.
    node_faults: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    source_trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"), nullable=True)
    stdout_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    stderr_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    queued_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Seconds a build slot and an evaluation slot spent on it (fleet.workers.execute.WorkerContext.lap): what a
    # trial costs, whoever else shares the queue. Its driver batches and sizes its window from them
    # (fleet.driving.pace).
    # No compile time for a trial handed to another's build: that build's trial has it.
    compile_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    eval_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Set when the searcher proposed it from history (fleet.search.history): its rank there, its score and the
    # sources that ranked it; shown by ``fleet trial`` and the report.
    history: Mapped[dict[str, Any] | None] = mapped_column(
        JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql"), nullable=True
    )

    # A reused trial's measurement is its source's: it has no measurement row of its own. Every read of a trial's
    # measurement goes through this, in Python (a loaded trial) and in SQL: trials_with_measurements below, or
    # ``Measurement.trial_id == Trial.measured_in`` (aliases too) where a query cannot start from it.
    @hybrid_property
    def measured_in(self) -> int:
        """The trial whose measurement this one has: the one it reused, else itself."""
        return self.source_trial_id if self.source_trial_id is not None else self.id

    @measured_in.inplace.expression
    @classmethod
    def _measured_in(cls) -> ColumnElement[int]:
        return func.coalesce(cls.source_trial_id, cls.id)


class Measurement(Base):
    """The samples of one evaluation, its objective and extra metrics, and where it ran."""

    __tablename__ = "measurements"
    # With the objective: a problem and target's best measurements are its first rows (fleet.store._history).
    __table_args__ = (
        Index("ix_measurements_problem_target_objective", "problem_id", "target", "objective"),
        # A problem's measurements best first, earliest first among equals: its best in a campaign (Store.tally).
        Index("ix_measurements_problem_objective", "problem_id", "objective", "trial_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), unique=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    target: Mapped[str] = mapped_column(String(64))
    measure_key: Mapped[str] = mapped_column(String(64), index=True)
    objective_name: Mapped[str] = mapped_column(String(64))
    maximize: Mapped[bool] = mapped_column(Boolean, default=False)
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    valid: Mapped[bool] = mapped_column(Boolean, default=True)
    samples: Mapped[list[Any]]
    metrics: Mapped[dict[str, Any]]
    # A workload of several objectives: each one's value by name (the first is ``objective`` too); {} with one.
    objectives: Mapped[dict[str, Any] | None]
    toolchain: Mapped[str] = mapped_column(Text, default="")
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    gpu: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The device it ran on, as the evaluation worker found it: the model (what reuse compares) and the model
    # with its driver and runtime versions (provenance).
    device_kind: Mapped[str | None] = mapped_column(String(255), nullable=True)
    device: Mapped[str | None] = mapped_column(Text, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


def trials_with_measurements(*columns: Any, measured: bool = False, valid: bool = False) -> Select[Any]:
    """``SELECT columns FROM trials`` joined to each trial's measurement: its own, or a reused trial's source's.

    The query family that reads trials with what they measured; more joins, filters and an order go on the result.

    Parameters
    ----------
    columns:
        What to select: trials' and measurements' columns, a whole :class:`Trial`, whatever the caller joins.
    measured:
        Only the trials that have a measurement (an inner join); otherwise every trial, the measurement's columns
        None where it has none.
    valid:
        Join only a valid measurement: an invalid one reads as none.
    """
    on = Measurement.trial_id == Trial.measured_in
    if valid:
        on = and_(on, Measurement.valid.is_(True))
    return select(*columns).select_from(Trial).join(Measurement, on, isouter=not measured)


class Machine(Base):
    """A node of the fleet, as its workers registered it."""

    __tablename__ = "machines"

    id: Mapped[int] = mapped_column(primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), unique=True)
    targets: Mapped[list[Any]]
    gpus: Mapped[list[Any]]
    cpus: Mapped[int] = mapped_column(Integer, default=0)
    first_seen: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Worker(Base):
    """One worker process: a build worker, or an evaluation worker pinned to one GPU."""

    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    machine_id: Mapped[int] = mapped_column(ForeignKey("machines.id"))
    role: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(64), index=True)
    gpu: Mapped[str | None] = mapped_column(String(64), nullable=True)
    queues: Mapped[list[Any]]
    concurrency: Mapped[int] = mapped_column(Integer, default=1)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # Why the worker's node is unhealthy (fleet.workers.health), since when; None while it is healthy. An
    # unhealthy worker hands its work back until its node's check passes again.
    fault: Mapped[str | None] = mapped_column(Text, nullable=True)
    fault_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Chain(Base):
    """One simulated-annealing chain that runs on the fleet by itself, one ``anneal_step`` task at a time."""

    __tablename__ = "chains"
    __table_args__ = (UniqueConstraint("campaign_id", "problem_id", "index", name="uq_chain"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    index: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[dict[str, Any]]
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    best_objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    temperature: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default=ChainState.RUNNING)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class ChainStep(Base):
    """One step of a chain: the neighbour it measured, and whether the chain moved there."""

    __tablename__ = "chain_steps"
    __table_args__ = (UniqueConstraint("chain_id", "step", name="uq_chain_step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    chain_id: Mapped[int] = mapped_column(ForeignKey("chains.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    config: Mapped[dict[str, Any]]
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    accepted: Mapped[bool] = mapped_column(Boolean)
    temperature: Mapped[float] = mapped_column(Float)
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class MiopenKey(Base):
    """The MIOpen find-db/perf-db key of a conv problem (one per problem: a problem is one direction), indexed."""

    __tablename__ = "miopen_keys"

    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id", ondelete="CASCADE"), primary_key=True)
    db_key: Mapped[str] = mapped_column(String(512), index=True)


class GoldenVersion(Base):
    """One version of a target's golden set: the best results of chosen campaigns, frozen (Tuna's golden)."""

    __tablename__ = "golden_versions"
    __table_args__ = (UniqueConstraint("target", "version", name="uq_golden_version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    campaigns: Mapped[list[Any]]
    provenance: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class GoldenEntry(Base):
    """A problem's promoted result in one golden version: a copy, so later changes never alter the version."""

    __tablename__ = "golden_entries"

    version_id: Mapped[int] = mapped_column(ForeignKey("golden_versions.id", ondelete="CASCADE"), primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"), primary_key=True)
    step: Mapped[str] = mapped_column(String(16), primary_key=True)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)
    payload: Mapped[dict[str, Any]]
    toolchain: Mapped[str] = mapped_column(Text, default="")
