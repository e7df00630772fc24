"""The store: every read and write Fleet makes, on SQLite or PostgreSQL. It knows no Celery.

Ownership of work is decided here, not by the broker: a claim is a conditional UPDATE that sets a lease,
a worker renews its lease while it works, and :meth:`Store.reap` gives back work whose lease expired.
Results are written only by the lease holder, in one transaction with the state change, so each trial is
recorded exactly once however often its message is delivered.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    DateTime,
    Engine,
    Text,
    and_,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from fleet.errors import NotFound, StoreError
from fleet.space import build_part, digest
from fleet.store._models import (
    TERMINAL_STATES,
    TRIAL_STATES,
    Artifact,
    Blob,
    Campaign,
    CampaignProblem,
    Chain,
    ChainStep,
    Machine,
    Measurement,
    Problem,
    ProblemTag,
    Trial,
    Worker,
    utcnow,
)
from fleet.store._prepared import Prepared, refused


@dataclass(frozen=True)
class NewTrial:
    """A configuration the driver wants measured."""

    problem_id: int
    config: dict[str, Any]
    build_key: str
    measure_key: str
    seq: int = 0
    baseline: bool = False


@dataclass(frozen=True)
class TrialWork:
    """Everything a task needs to build or evaluate one claimed trial."""

    trial_id: int
    campaign_id: int
    problem_id: int
    problem_kind: str
    problem_params: dict[str, Any]
    target: str
    config: dict[str, Any]
    build_key: str
    measure_key: str
    workload: dict[str, Any]
    space: dict[str, Any]
    toolchain: str
    attempts: int
    artifact_digest: str | None = None
    artifact_data: bytes | None = None  # with an evaluation claim, when the artifact is small (INLINE_BYTES)


UNFINISHED_STATES = tuple(state for state in TRIAL_STATES if state not in TERMINAL_STATES)


def _claim_params(trial_id: int, worker: str, lease: float) -> dict[str, Any]:
    """The parameters of a claim statement: the trial, its new holder, now and when the lease expires."""
    now = utcnow()
    return {"trial": trial_id, "owner": worker, "now": now, "expires": now + timedelta(seconds=lease)}


# An artifact's row as a statement that creates it returns it.
ArtifactRow = namedtuple("ArtifactRow", [column.key for column in Artifact.__table__.columns])  # type: ignore[misc]


@dataclass(frozen=True)
class CompileStart:
    """How a compile task starts: ``compiled`` (already built), ``skipped`` (not ours), or ``claimed``.

    A claimed trial comes with its work and its artifact's row, as :meth:`Store.claim_build` returns it.
    """

    outcome: str
    work: TrialWork | None = None
    artifact: Any = None


@dataclass(frozen=True)
class TrialResult:
    """A trial in a terminal state, with its measurement when it has one."""

    trial_id: int
    problem_id: int
    config: dict[str, Any]
    state: str
    reason: str | None
    objective: float | None = None
    valid: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    baseline: bool = False
    reused: bool = False


@dataclass(frozen=True)
class Requeue:
    """Work the reaper gave back: send ``task`` for ``trial_id`` to ``target``'s queue again."""

    trial_id: int
    target: str
    task: str


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Autocommit at the driver level so SQLAlchemy's BEGIN below is the only transaction control.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    # Take the write lock up front: a deferred transaction that later writes can fail with
    # "database is locked" instead of waiting, when several worker processes share the file.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


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
        "objective_name", "maximize", "objective", "valid", "samples", "metrics", "toolchain", "node", "gpu", "worker",
    )
}  # fmt: skip


class _HotPath:
    """The statements of the workers' hot path, built once per store.

    Building a SQLAlchemy statement costs more than running it; a statement built once is compiled once
    and found in the engine's cache on every later execution.
    """

    def __init__(self, insert: Callable[[type], Any], dialect: str) -> None:
        trial, owner, key = bindparam("trial"), bindparam("owner"), bindparam("key")
        now, expires = bindparam("now", type_=DateTime()), bindparam("expires", type_=DateTime())
        claimed = (
            Trial.id,
            Trial.campaign_id,
            Trial.problem_id,
            Trial.target,
            Trial.config,
            Trial.build_key,
            Trial.measure_key,
            Trial.attempts,
        )

        def claim(waiting: str, running: str, **values: Any) -> Any:
            free = or_(Trial.state == waiting, and_(Trial.state == running, Trial.lease_expires_at < now))
            return (
                update(Trial)
                .where(Trial.id == trial, free)
                .values(
                    state=running,
                    worker=owner,
                    lease_expires_at=expires,
                    started_at=func.coalesce(Trial.started_at, now),
                    **values,
                )
            )

        self.claim_compile = claim("new", "compiling").returning(*claimed)
        # Spelled out: SQLite's RETURNING renders columns unqualified, and ``build_key = build_key`` would
        # compare the artifact with itself.
        artifact = Artifact.build_key == literal_column("trials.build_key")
        digest = select(Artifact.blob_digest).where(artifact)
        small = (
            select(Blob.data)
            .join(Artifact, Artifact.blob_digest == Blob.digest)
            .where(artifact, Blob.size <= INLINE_BYTES)
        )
        self.claim_evaluate = (
            claim("compiled", "evaluating", attempts=Trial.attempts + 1)
            .where(Trial.attempts < bindparam("max_attempts"))
            .returning(
                *claimed,
                digest.scalar_subquery().label("artifact_digest"),
                small.scalar_subquery().label("artifact_data"),
            )
        )
        held = (Trial.id == trial, Trial.worker == owner)
        self.compiled = (
            update(Trial)
            .where(*held, Trial.state == "compiling")
            .values(state="compiled", worker=None, lease_expires_at=None, queued_at=now)
        )
        # Not IN (...): SQLAlchemy expands an IN list on every execution.
        running = or_(Trial.state == "compiling", Trial.state == "evaluating")
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
            )
            .returning(Trial.id, Trial.problem_id, Trial.target, Trial.measure_key)
        )
        self.put_measurement = insert(Measurement).on_conflict_do_nothing()
        self.record_measured = None
        if dialect == "postgresql":
            # The trial's final state and its measurement in one statement: atomic without a transaction. The
            # measurement's parameters are prefixed: an UPDATE sets every column named in the parameters.
            done = self.finish_trial.cte("done")
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
                        *(
                            cast(bindparam(f"m_{name}", type_=columns[name].type), columns[name].type)
                            for name in MEASURED
                        ),
                    ),
                )
                .on_conflict_do_nothing()
                .cte("measured")
            )
            self.record_measured = select(func.count()).select_from(done).add_cte(measured)

        columns = Artifact.__table__.columns
        building = (Artifact.build_key == key, Artifact.state == "building")
        self.build = select(*columns).where(Artifact.build_key == key)
        created = ("build_key", "problem_id", "target", "build_config", "toolchain", "state", "worker")
        self.create_build = (
            insert(Artifact)
            .values(**{name: bindparam(name) for name in created}, lease_expires_at=expires, attempts=1, created_at=now)
            .on_conflict_do_nothing()
            .returning(*columns)
        )
        expired = update(Artifact).where(*building, Artifact.lease_expires_at < now)
        self.take_build = expired.values(
            worker=owner, lease_expires_at=expires, attempts=Artifact.attempts + 1
        ).returning(*columns)
        self.fail_build = expired.values(state="failed", reason=bindparam("why")).returning(*columns)
        self.renew_build = update(Artifact).where(*building, Artifact.worker == owner).values(lease_expires_at=expires)
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
        self.built_and_compiled = self.claim_and_create = None
        if dialect == "postgresql":
            # A successful build: its blob, its artifact and its trial in one statement. The blob's
            # parameters are not named after columns, which an UPDATE would set.
            stored = (
                insert(Blob)
                .values(
                    digest=bindparam("blob"), size=bindparam("blob_size"), data=bindparam("blob_data"), created_at=now
                )
                .on_conflict_do_nothing()
                .cte("stored")
            )
            built = self.finish_build.returning(Artifact.build_key).cte("built")
            compiled = self.compiled.where(select(built.c.build_key).exists()).cte("compiled")
            self.built_and_compiled = select(func.count()).select_from(built).add_cte(stored, compiled)

            # A compile claim and its artifact's creation in one statement. The artifact's build-time
            # knobs are fleet.space.build_part's, in SQL: those of the trial's configuration that the
            # campaign's space has and does not mark ``build: false``.
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
            toolchain = func.coalesce(Campaign.provenance.op("->>")(literal_column("'toolchain'")), "")
            created_artifact = (
                insert(Artifact)
                .from_select(
                    [*created, "lease_expires_at", "attempts", "created_at"],
                    select(
                        trial_claimed.c.build_key,
                        trial_claimed.c.problem_id,
                        trial_claimed.c.target,
                        build_config,
                        toolchain,
                        literal_column("'building'"),
                        cast(owner, Text),  # Cast: see record_measured.
                        cast(expires, DateTime()),
                        literal_column("1"),
                        cast(now, DateTime()),
                    ).join_from(trial_claimed, Campaign, Campaign.id == trial_claimed.c.campaign_id),
                )
                .on_conflict_do_nothing()
                .returning(*columns)
                .cte("created")
            )
            self.claim_and_create = select(
                *trial_claimed.c, *(c.label(f"artifact_{c.key}") for c in created_artifact.c)
            ).select_from(trial_claimed.outerjoin(created_artifact, true()))


class Store:
    """Fleet's database.

    Parameters
    ----------
    url:
        A SQLAlchemy URL: ``postgresql+psycopg2://...`` or ``sqlite:///path``.
    durable:
        False lets PostgreSQL acknowledge a commit before it reaches the disk (``synchronous_commit=off``),
        for worker processes: every write they make is covered by a lease, so a commit that a crash of the
        database host loses looks like a worker that died, and the lease brings the work back.
    """

    def __init__(self, url: str, *, durable: bool = True) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StoreError(f"{url!r} is not a database URL") from None
        self.url = url
        self.display_url = parsed.render_as_string(hide_password=True)
        self.dialect = parsed.get_backend_name()
        try:
            self.engine = self._engine(url, parsed, durable)
            # The workers' hot path (see :meth:`_steps`) on PostgreSQL: a pool of its own, so that no
            # connection switches between autocommit and transactions (each switch costs a round trip).
            self._autocommit = (
                self._engine(url, parsed, durable, isolation_level="AUTOCOMMIT")
                if self.dialect == "postgresql"
                else None
            )
        except (NoSuchModuleError, ModuleNotFoundError) as error:
            raise StoreError(f"{self.display_url}: {error}; use postgresql+psycopg2:// or sqlite:///") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._hot = _HotPath(self.insert, self.dialect)
        # The statements every trial runs, prepared on PostgreSQL (see fleet.store._prepared).
        self._prepared: dict[str, Prepared] = {}
        if self.dialect == "postgresql":
            for name in (
                "claim_and_create", "claim_compile", "create_build", "built_and_compiled", "claim_evaluate",
                "record_measured",
            ):  # fmt: skip
                self._prepared[name] = Prepared(f"fleet_{name}", getattr(self._hot, name), self.engine.dialect)
        self._campaign_cache: dict[int, dict[str, Any]] = {}
        self._problem_cache: dict[int, dict[str, Any]] = {}
        # The hot path's own connection, held between calls (see _steps), and the process it belongs to.
        self._held: Connection | None = None
        self._held_pid = os.getpid()
        self._held_lock = threading.Lock()
        self._inherited: list[Connection] = []

    def _engine(self, url: str, parsed: Any, durable: bool, **options: Any) -> Engine:
        if self.dialect == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(engine, "connect", _sqlite_pragmas)
            event.listen(engine, "begin", _sqlite_begin)
            return engine
        if self.dialect == "postgresql":
            # No pre-ping: it doubles the statements of the hot path. A dropped connection fails one
            # transaction (the pool then reconnects), and leases make any one failure harmless.
            session = {} if durable else {"options": "-c synchronous_commit=off"}
            return create_engine(
                url, pool_size=2, max_overflow=4, connect_args={"connect_timeout": 5, **session}, **options
            )
        raise StoreError(f"{self.display_url}: Fleet stores its data in PostgreSQL or SQLite")

    def close(self) -> None:
        if self._held_lock.acquire(blocking=False):
            try:
                self._release_held()
            finally:
                self._held_lock.release()
        for engine in (self.engine, self._autocommit):
            if engine is not None:
                engine.dispose()

    def after_fork(self) -> None:
        """Drop connections inherited from a parent process; they must not be shared."""
        self._forget_parents()
        self._held_lock = threading.Lock()  # another thread of the parent may have held it
        for engine in (self.engine, self._autocommit):
            if engine is not None:
                engine.dispose(close=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session whose transaction commits at the end of the block, or rolls back on an error."""
        try:
            with self._sessions.begin() as session:
                yield session
        except (OperationalError, ProgrammingError) as error:
            raise self._error(error) from error

    def _error(self, error: Exception) -> StoreError:
        """One line for a database error a user can act on."""
        line = _first_line(error)
        if _schema_missing(line):
            return StoreError(f"database {self.display_url} has no Fleet schema ({line}): run `fleet db upgrade`")
        return StoreError(f"database {self.display_url} does not answer: {line}")

    # -- schema -----------------------------------------------------------------------------------------

    def _alembic(self, connection: Any) -> Any:
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(resources.files("fleet.store") / "migrations"))
        config.attributes["connection"] = connection
        return config

    def upgrade(self) -> str:
        """Apply every migration; return the revision the database is at."""
        from alembic import command

        try:
            with self.engine.begin() as connection:
                command.upgrade(self._alembic(connection), "head")
        except (OperationalError, ProgrammingError) as error:
            raise self._error(error) from error
        return self.revision() or ""

    def revision(self) -> str | None:
        """The database's current migration revision, or None before the first upgrade."""
        from alembic.runtime.migration import MigrationContext

        try:
            with self.engine.connect() as connection:
                return MigrationContext.configure(connection).get_current_revision()
        except (OperationalError, ProgrammingError) as error:
            raise self._error(error) from error

    def head(self) -> str:
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic(None)).get_current_head() or ""

    def check(self) -> None:
        """Raise :class:`StoreError` unless the database answers and is at the latest revision."""
        current = self.revision()
        if current != self.head():
            raise StoreError(
                f"database {self.display_url} is at revision {current or 'none'}, not {self.head()}: "
                "run `fleet db upgrade`"
            )

    # -- problems and blobs -----------------------------------------------------------------------------

    def add_problem(self, kind: str, params: dict[str, Any], tags: Iterable[str] = ()) -> int:
        """The id of the problem (``kind``, ``params``), created if missing, with ``tags`` added."""
        key = digest(params)
        with self.session() as session:
            self._insert_ignore(
                session, Problem, {"kind": kind, "params": params, "params_key": key, "created_at": utcnow()}
            )
            problem_id = session.scalar(select(Problem.id).where(Problem.kind == kind, Problem.params_key == key))
            for tag in tags:
                self._insert_ignore(session, ProblemTag, {"problem_id": problem_id, "tag": tag})
            assert problem_id is not None
            return problem_id

    def problem(self, problem_id: int) -> Problem:
        with self.session() as session:
            problem = session.get(Problem, problem_id)
            if problem is None:
                raise NotFound(f"no problem {problem_id}")
            return problem

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

    def tags(self, problem_id: int) -> list[str]:
        with self.session() as session:
            return sorted(session.scalars(select(ProblemTag.tag).where(ProblemTag.problem_id == problem_id)))

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` once under its SHA-256; return the digest."""
        key = hashlib.sha256(data).hexdigest()
        with self.session() as session:
            self._insert_ignore(session, Blob, {"digest": key, "size": len(data), "data": data, "created_at": utcnow()})
        return key

    def get_blob(self, key: str) -> bytes:
        with self.session() as session:
            data = session.scalar(select(Blob.data).where(Blob.digest == key))
        if data is None:
            raise NotFound(f"no blob {key}")
        return bytes(data)

    # -- campaigns --------------------------------------------------------------------------------------

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
    ) -> Campaign:
        """Create a campaign; an existing one of the same name and definition is returned as it is."""
        workload_key = digest({"workload": workload, "provenance": provenance.get("toolchain", "")})
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
                    status="running",
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing()
                .returning(Campaign.id)
            )
            if created is not None:
                for position, problem_id in enumerate(problem_ids):
                    session.add(CampaignProblem(campaign_id=created, problem_id=problem_id, position=position))
            campaign = session.scalar(select(Campaign).where(Campaign.name == name))
            assert campaign is not None
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

    def campaign(self, ref: str | int) -> Campaign:
        """The campaign with id or name ``ref``."""
        with self.session() as session:
            query = select(Campaign).where(Campaign.name == str(ref))
            if isinstance(ref, int) or str(ref).isdigit():
                query = select(Campaign).where(or_(Campaign.id == int(ref), Campaign.name == str(ref)))
            campaign = session.scalars(query.order_by(Campaign.id)).first()
        if campaign is None:
            raise NotFound(f"no campaign {ref!r}")
        return campaign

    def campaigns(self) -> list[Campaign]:
        with self.session() as session:
            return list(session.scalars(select(Campaign).order_by(Campaign.id)))

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

    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        finished = utcnow() if status in ("done", "stopped") else None
        with self.session() as session:
            session.execute(
                update(Campaign).where(Campaign.id == campaign_id).values(status=status, finished_at=finished)
            )

    # -- trials -----------------------------------------------------------------------------------------

    def add_trials(
        self, campaign_id: int, target: str, trials: Sequence[NewTrial], *, remeasure: bool = False
    ) -> list[tuple[int, str]]:
        """Create trials (or find them, when the campaign is resumed); return each one's id and state.

        A configuration already measured with the same measure key (problem, target, configuration,
        workload and toolchain) is not measured again: its trial is created ``evaluated``, pointing at the
        trial that holds the measurement, unless ``remeasure`` is set.
        """
        now = utcnow()
        sources: dict[str, tuple[int, str]] = {}
        with self.transaction() as connection:
            if not remeasure:
                rows = connection.execute(
                    select(Trial.measure_key, Trial.id, Trial.state)
                    .join(Measurement, Measurement.trial_id == Trial.id)
                    .where(
                        # Through the measurements' index: the trials have none on their measure key.
                        Measurement.measure_key.in_({t.measure_key for t in trials}),
                        Trial.measure_key == Measurement.measure_key,
                        Trial.state.in_(("evaluated", "invalid")),
                    )
                ).all()
                sources = {r.measure_key: (r.id, r.state) for r in rows}
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
                    "state": "new",
                    "attempts": 0,
                    "created_at": now,
                    "queued_at": now,
                    "source_trial_id": None,
                    "finished_at": None,
                }
                if new.measure_key in sources:
                    source, state = sources[new.measure_key]
                    row |= {"state": state, "source_trial_id": source, "finished_at": now}
                values.append(row)
            self.insert_many(connection, Trial, values)
            keys = [(t.problem_id, digest(t.config)) for t in trials]
            rows = connection.execute(
                select(Trial.problem_id, Trial.config_key, Trial.id, Trial.state).where(
                    Trial.campaign_id == campaign_id,
                    Trial.target == target,
                    Trial.config_key.in_({key for _, key in keys}),
                )
            ).all()
        found = {(r.problem_id, r.config_key): (r.id, r.state) for r in rows}
        return [found[key] for key in keys]

    def trial(self, trial_id: int) -> Trial:
        with self.session() as session:
            trial = session.get(Trial, trial_id)
        if trial is None:
            raise NotFound(f"no trial {trial_id}")
        return trial

    def trials(self, campaign_id: int, states: Sequence[str] | None = None) -> list[Trial]:
        query = select(Trial).where(Trial.campaign_id == campaign_id).order_by(Trial.id)
        if states:
            query = query.where(Trial.state.in_(states))
        with self.session() as session:
            return list(session.scalars(query))

    def trial_counts(self, campaign_id: int) -> dict[str, int]:
        with self.session() as session:
            rows = session.execute(
                select(Trial.state, func.count()).where(Trial.campaign_id == campaign_id).group_by(Trial.state)
            ).all()
        return {state: count for state, count in rows}

    def results(self, trial_ids: Iterable[int] | None = None, campaign_id: int | None = None) -> list[TrialResult]:
        """The trials among ``trial_ids`` (or of a campaign) that reached a terminal state."""
        measured = func.coalesce(Trial.source_trial_id, Trial.id)
        query = (
            select(
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
            )
            .outerjoin(Measurement, Measurement.trial_id == measured)
            # NOT IN, not IN: no index serves it, so the planner finds the trials by id (or campaign) even
            # when its statistics, stale in the middle of a campaign, say that few trials have finished;
            # with IN, it may read every finished trial of the database through the state index instead.
            .where(Trial.state.not_in(UNFINISHED_STATES))
            .order_by(Trial.id)
        )
        if trial_ids is not None:
            ids = list(trial_ids)
            if not ids:
                return []
            query = query.where(Trial.id.in_(ids))
        if campaign_id is not None:
            query = query.where(Trial.campaign_id == campaign_id)
        with self.transaction() as connection:
            rows = connection.execute(query).all()
        return [
            TrialResult(
                trial_id=r.id,
                problem_id=r.problem_id,
                config=r.config,
                state=r.state,
                reason=r.reason,
                objective=r.objective,
                valid=bool(r.valid and r.state == "evaluated"),
                metrics=r.metrics or {},
                baseline=r.baseline,
                reused=r.source_trial_id is not None,
            )
            for r in rows
        ]

    # -- claims, leases and results ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A Core transaction (a Connection), committed at the end of the block: no ORM bookkeeping."""
        try:
            with self.engine.begin() as connection:
                yield connection
        except (OperationalError, ProgrammingError) as error:
            raise self._error(error) from error

    @contextmanager
    def _steps(self) -> Iterator[Connection]:
        """A connection for the workers' hot path, whose statements each stand on their own.

        On PostgreSQL every statement commits by itself, which saves the BEGIN and COMMIT round trips: the
        hot path orders its statements so that stopping between two of them leaves work that a lease brings
        back, and what must be atomic is one statement. SQLite runs them in one transaction, as its writers
        take the database's lock anyway.

        The store holds one such connection between calls: a pool's checkout and checkin cost a worker
        more CPU than a statement. A thread that finds it in use takes one from the pool, and a call that
        fails gives it back, so that the next one starts on a sound connection.
        """
        if self._autocommit is None:
            with self.transaction() as connection:
                yield connection
            return
        try:
            if not self._held_lock.acquire(blocking=False):
                with self._autocommit.connect() as connection:
                    yield connection
                return
            try:
                self._forget_parents()
                if self._held is None:
                    self._held = self._autocommit.connect()
                try:
                    yield self._held
                except BaseException:
                    self._release_held()
                    raise
            finally:
                self._held_lock.release()
        except (OperationalError, ProgrammingError) as error:
            raise self._error(error) from error

    def _release_held(self) -> None:
        """Give the held connection back to the pool (which throws it away if it was invalidated)."""
        self._forget_parents()
        held, self._held = self._held, None
        if held is not None:
            held.close()

    def _forget_parents(self) -> None:
        """Set aside a held connection that a parent process opened: it runs on the parent's socket.

        It stays referenced, so that it is never closed here nor goes back to this process's pool.
        """
        if self._held is not None and self._held_pid != os.getpid():
            self._inherited.append(self._held)
            self._held = None
        self._held_pid = os.getpid()

    def _run(self, connection: Connection, name: str, params: dict[str, Any]) -> Any:
        """Run the hot statement ``name``: prepared where the server keeps prepared statements."""
        prepared = self._prepared.get(name)
        if prepared is not None:
            try:
                return prepared.run(connection, params)
            except DBAPIError as error:
                if not refused(error):
                    raise
                self._prepared.clear()  # this server forgets them: run every statement as text from now on
        return connection.execute(getattr(self._hot, name), params)

    def _definition(self, connection: Connection, campaign_id: int, problem_id: int) -> tuple[dict, dict]:
        """A campaign's and a problem's definitions; both never change, so each process keeps them."""
        campaign = self._campaign_cache.get(campaign_id)
        if campaign is None:
            row = connection.execute(
                select(Campaign.workload, Campaign.space, Campaign.provenance).where(Campaign.id == campaign_id)
            ).one()
            campaign = self._campaign_cache[campaign_id] = {
                "workload": row.workload,
                "space": row.space,
                "toolchain": str(row.provenance.get("toolchain", "")),
            }
        problem = self._problem_cache.get(problem_id)
        if problem is None:
            row = connection.execute(select(Problem.kind, Problem.params).where(Problem.id == problem_id)).one()
            problem = self._problem_cache[problem_id] = {"kind": row.kind, "params": row.params}
        return campaign, problem

    def claim(self, trial_id: int, phase: str, worker: str, lease: float, max_attempts: int) -> TrialWork | None:
        """Take ``trial_id`` for ``phase`` (``compile`` or ``evaluate``), or None if it is not this worker's.

        A trial is free in its waiting state (``new`` before compiling, ``compiled`` before evaluating) or
        when the lease of an earlier claim has expired. Evaluation claims count attempts, and stop at
        ``max_attempts``; :meth:`reap` errors such a trial. An evaluation claim also returns the digest of
        the trial's artifact, and its bytes when it is at most ``INLINE_BYTES``.
        """
        with self._steps() as connection:
            return self._claim(connection, trial_id, phase, worker, lease, max_attempts)

    def start_compile(self, trial_id: int, worker: str, lease: float, max_attempts: int) -> CompileStart:
        """Everything a compile task does before it builds (in one transaction on SQLite; see :meth:`_steps`).

        The trial is claimed and so is its build (see :meth:`claim_build`); a trial whose artifact is
        already built moves straight on to ``compiled``. On PostgreSQL, the claim creates the artifact
        in the same statement when it is new, as it is for most trials.
        """
        with self._steps() as connection:
            params = _claim_params(trial_id, worker, lease)
            merged = self._hot.claim_and_create is not None
            row = self._run(connection, "claim_and_create" if merged else "claim_compile", params).first()
            if row is None:
                return CompileStart("skipped")
            work = self._work(connection, row, "compile")
            if not merged:
                artifact = self._claim_build(connection, work, worker, lease, max_attempts)
            elif row.artifact_id is not None:
                created = ArtifactRow(*(getattr(row, f"artifact_{name}") for name in ArtifactRow._fields))
                return CompileStart("claimed", work, created)
            else:
                artifact = self._take_build(connection, work.build_key, worker, lease, max_attempts)
            if artifact.state == "built":
                connection.execute(self._hot.compiled, {"trial": trial_id, "owner": worker, "now": utcnow()})
                return CompileStart("compiled")
            return CompileStart("claimed", work, artifact)

    def _claim(
        self, connection: Connection, trial_id: int, phase: str, worker: str, lease: float, max_attempts: int
    ) -> TrialWork | None:
        params = _claim_params(trial_id, worker, lease)
        if phase == "compile":
            trial = self._run(connection, "claim_compile", params).first()
        else:
            trial = self._run(connection, "claim_evaluate", params | {"max_attempts": max_attempts}).first()
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
            toolchain=campaign["toolchain"],
            attempts=trial.attempts,
            artifact_digest=trial.artifact_digest if phase == "evaluate" else None,
            artifact_data=bytes(trial.artifact_data) if phase == "evaluate" and trial.artifact_data else None,
        )

    def renew(self, trial_id: int, worker: str, lease: float, build_key: str | None = None) -> bool:
        """Extend this worker's lease on a trial (and on the artifact it builds); False if it lost it."""
        params = {"trial": trial_id, "owner": worker, "expires": utcnow() + timedelta(seconds=lease)}
        with self._steps() as connection:
            held = connection.execute(self._hot.renew_trial, params).rowcount
            if build_key is not None:
                connection.execute(self._hot.renew_build, params | {"key": build_key})
        return bool(held)

    def claim_build(self, work: TrialWork, worker: str, lease: float, max_attempts: int) -> Any:
        """The artifact of ``work``'s build key, claimed by ``worker`` when nobody holds a live lease on it.

        The caller owns the build when the returned artifact is ``building`` with ``worker`` as its worker;
        ``built`` and ``failed`` are final; ``building`` by another worker means wait for it. Returns a row
        with the artifact's columns. A build whose lease expired ``max_attempts`` times is ``failed``.
        """
        with self._steps() as connection:
            return self._claim_build(connection, work, worker, lease, max_attempts)

    def _claim_build(
        self, connection: Connection, work: TrialWork, worker: str, lease: float, max_attempts: int
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
                "toolchain": work.toolchain,
                "state": "building",
                "worker": worker,
                "expires": now + timedelta(seconds=lease),
                "now": now,
            },
        ).first()
        if created is not None:
            return created
        return self._take_build(connection, work.build_key, worker, lease, max_attempts)

    def _take_build(self, connection: Connection, build_key: str, worker: str, lease: float, max_attempts: int) -> Any:
        """An artifact that exists: as it is, or taken over (or failed) when its builder's lease expired."""
        hot = self._hot
        now = utcnow()
        key = {"key": build_key}
        artifact = connection.execute(hot.build, key).one()
        if artifact.state != "building" or artifact.lease_expires_at >= now:
            return artifact
        if artifact.attempts >= max_attempts:
            why = f"the build was lost {max_attempts} times (its worker died)"
            taken = connection.execute(hot.fail_build, key | {"now": now, "why": why}).first()
        else:
            expires = now + timedelta(seconds=lease)
            taken = connection.execute(hot.take_build, key | {"now": now, "owner": worker, "expires": expires}).first()
        return taken or connection.execute(hot.build, key).one()

    def artifact(self, build_key: str) -> Artifact | None:
        with self.session() as session:
            return session.scalar(select(Artifact).where(Artifact.build_key == build_key))

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
    ) -> bool:
        """Record the build this worker owns: ``data`` when it succeeded, ``reason`` when it failed.

        With ``trial_id``, the trial this worker holds moves to ``compiled`` with it.
        """
        now = utcnow()
        blob = None if data is None else hashlib.sha256(data).hexdigest()
        params = {
            "key": build_key,
            "owner": worker,
            "final": "built" if data is not None else "failed",
            "blob": blob,
            "why": reason,
            "log": log_tail,
            "seconds": seconds,
            "now": now,
        }
        with self._steps() as connection:
            if data is not None and trial_id is not None and self._hot.built_and_compiled is not None:
                params |= {"trial": trial_id, "blob_size": len(data), "blob_data": data}
                return bool(self._run(connection, "built_and_compiled", params).scalar())
            # In this order, so that a worker stopped between two statements leaves a trial that its lease
            # gives back.
            if data is not None:
                connection.execute(
                    self._hot.put_blob, {"digest": blob, "size": len(data), "data": data, "created_at": now}
                )
            done = connection.execute(self._hot.finish_build, params).rowcount
            if done and data is not None and trial_id is not None:
                connection.execute(self._hot.compiled, {"trial": trial_id, "owner": worker, "now": now})
            return bool(done)

    def mark_compiled(self, trial_id: int, worker: str) -> bool:
        with self._steps() as connection:
            params = {"trial": trial_id, "owner": worker, "now": utcnow()}
            return bool(connection.execute(self._hot.compiled, params).rowcount)

    def record(
        self,
        trial_id: int,
        worker: str,
        *,
        state: str = "evaluated",
        reason: str | None = None,
        measurement: dict[str, Any] | None = None,
        stdout_tail: str | None = None,
        stderr_tail: str | None = None,
    ) -> bool:
        """Finish a trial this worker holds: its terminal state, and its measurement if it has one.

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

    def fail_waiting(self, trial_id: int, reason: str) -> bool:
        """Error a trial that no worker holds (its build failed before it was claimed)."""
        with self.session() as session:
            return bool(
                session.execute(
                    update(Trial)
                    .where(Trial.id == trial_id, Trial.state.in_(("new", "compiled")))
                    .values(state="errored", reason=reason, finished_at=utcnow())
                ).rowcount
            )

    def reap(self, max_attempts: int) -> list[Requeue]:
        """Give back work whose lease expired; error trials that have lost ``max_attempts`` workers."""
        now = utcnow()
        expired = Trial.lease_expires_at < now
        with self.session() as session:
            session.execute(
                update(Trial)
                .where(Trial.state == "evaluating", expired, Trial.attempts >= max_attempts)
                .values(
                    state="errored",
                    lease_expires_at=None,
                    finished_at=now,
                    reason=f"lost its worker {max_attempts} times (killed, or the node went away)",
                )
            )
            # Also a `compiled` trial whose attempts ran out while it waited for its lost message.
            session.execute(
                update(Trial)
                .where(Trial.state == "compiled", Trial.attempts >= max_attempts)
                .values(
                    state="errored",
                    finished_at=now,
                    reason=f"lost its worker {max_attempts} times (killed, or the node went away)",
                )
            )
            to_evaluate = session.execute(
                update(Trial)
                .where(Trial.state == "evaluating", expired)
                .values(state="compiled", worker=None, lease_expires_at=None, queued_at=now)
                .returning(Trial.id, Trial.target)
            ).all()
            to_compile = session.execute(
                update(Trial)
                .where(Trial.state == "compiling", expired)
                .values(state="new", worker=None, lease_expires_at=None, queued_at=now)
                .returning(Trial.id, Trial.target)
            ).all()
        return [Requeue(r.id, r.target, "evaluate") for r in to_evaluate] + [
            Requeue(r.id, r.target, "compile") for r in to_compile
        ]

    def stale(self, older_than: float, campaign_id: int | None = None, limit: int = 1000) -> list[Requeue]:
        """Waiting trials whose message went out more than ``older_than`` seconds ago: send them again.

        A message can be lost (a worker killed between a state change and the next send, or a broker
        without acknowledgements); a duplicate costs one refused claim, so sending again is safe.
        """
        now = utcnow()
        with self.session() as session:
            cutoff = now - timedelta(seconds=older_than)
            query = select(Trial.id).where(Trial.state.in_(("new", "compiled")), Trial.queued_at < cutoff)
            if campaign_id is not None:
                query = query.where(Trial.campaign_id == campaign_id)
            ids = list(session.scalars(query.order_by(Trial.id).limit(limit)))
            if not ids:
                return []
            rows = session.execute(
                update(Trial)
                # Re-checked here: another reaper may have sent them again since the SELECT above.
                .where(Trial.id.in_(ids), Trial.state.in_(("new", "compiled")), Trial.queued_at < cutoff)
                .values(queued_at=now)
                .returning(Trial.id, Trial.target, Trial.state)
            ).all()
        return [Requeue(r.id, r.target, "compile" if r.state == "new" else "evaluate") for r in rows]

    def pending(self, campaign_id: int) -> list[Requeue]:
        """Trials of a campaign waiting for a message that may have been lost: what resuming sends again."""
        with self.session() as session:
            rows = session.execute(
                select(Trial.id, Trial.target, Trial.state)
                .where(Trial.campaign_id == campaign_id, Trial.state.in_(("new", "compiled")))
                .order_by(Trial.id)
            ).all()
        return [Requeue(r.id, r.target, "compile" if r.state == "new" else "evaluate") for r in rows]

    # -- annealing chains -------------------------------------------------------------------------------

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
                "state": "running",
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

    def chain(self, chain_id: int) -> Chain:
        with self.session() as session:
            chain = session.get(Chain, chain_id)
        if chain is None:
            raise NotFound(f"no chain {chain_id}")
        return chain

    def chains(self, campaign_id: int) -> list[Chain]:
        with self.session() as session:
            return list(
                session.scalars(
                    select(Chain).where(Chain.campaign_id == campaign_id).order_by(Chain.problem_id, Chain.index)
                )
            )

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
            values["state"] = "done"
        if accepted:
            values |= {"config": config, "objective": objective}
        better = objective is not None and (
            chain.best_objective is None
            or (objective > chain.best_objective if maximize else objective < chain.best_objective)
        )
        if better:
            values |= {"best_config": config, "best_objective": objective}
        with self.transaction() as connection:
            moved = connection.execute(
                update(Chain)
                .where(Chain.id == chain.id, Chain.step == chain.step, Chain.state == "running")
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
        return bool(moved)

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

    def stale_chains(self, older_than: float, campaign_id: int | None = None) -> list[tuple[int, int, str]]:
        """Running chains that have not moved for ``older_than`` seconds: (chain id, step, target) to send again.

        Their message may have been lost; a duplicate step is harmless (see :meth:`finish_chain_step`).
        """
        now = utcnow()
        cutoff = now - timedelta(seconds=older_than)
        query = (
            update(Chain)
            .where(Chain.state == "running", Chain.updated_at < cutoff)
            .values(updated_at=now)
            .returning(Chain.id, Chain.step, Chain.campaign_id)
        )
        if campaign_id is not None:
            query = query.where(Chain.campaign_id == campaign_id)
        with self.transaction() as connection:
            rows = connection.execute(query).all()
            targets = dict(connection.execute(select(Campaign.id, Campaign.target)).all()) if rows else {}
        return [(r.id, r.step, targets[r.campaign_id]) for r in rows]

    # -- machines and workers ---------------------------------------------------------------------------

    def register_worker(
        self,
        *,
        name: str,
        hostname: str,
        role: str,
        target: str,
        queues: list[str],
        gpu: str | None,
        gpus: list[dict[str, Any]],
        cpus: int,
        concurrency: int,
        pid: int,
    ) -> None:
        """Record a worker process and its machine, or refresh them when they restart."""
        now = utcnow()
        with self.session() as session:
            self._insert_ignore(
                session,
                Machine,
                {"hostname": hostname, "targets": [], "gpus": [], "cpus": cpus, "first_seen": now, "last_seen": now},
            )
            # Locked: the workers of one node register together, and each adds its target to the list.
            machine = session.scalar(select(Machine).where(Machine.hostname == hostname).with_for_update())
            assert machine is not None
            machine.targets = sorted(set(machine.targets) | {target})
            machine.gpus = gpus or machine.gpus
            machine.cpus, machine.last_seen = cpus, now
            self._insert_ignore(
                session,
                Worker,
                {
                    "name": name,
                    "machine_id": machine.id,
                    "role": role,
                    "target": target,
                    "queues": queues,
                    "gpu": gpu,
                    "concurrency": concurrency,
                    "pid": pid,
                    "started_at": now,
                    "heartbeat_at": now,
                },
            )
            session.execute(
                update(Worker)
                .where(Worker.name == name)
                .values(
                    machine_id=machine.id,
                    role=role,
                    target=target,
                    queues=queues,
                    gpu=gpu,
                    concurrency=concurrency,
                    pid=pid,
                    started_at=now,
                    heartbeat_at=now,
                    stopped_at=None,
                )
            )

    def heartbeat(self, name: str) -> None:
        now = utcnow()
        with self.session() as session:
            machine_id = session.scalar(
                update(Worker).where(Worker.name == name).values(heartbeat_at=now).returning(Worker.machine_id)
            )
            if machine_id is not None:
                session.execute(update(Machine).where(Machine.id == machine_id).values(last_seen=now))

    def worker_stopped(self, name: str) -> None:
        with self.session() as session:
            session.execute(update(Worker).where(Worker.name == name).values(stopped_at=utcnow()))

    def workers(
        self, *, target: str | None = None, role: str | None = None, within: float | None = None
    ) -> list[Worker]:
        """Registered workers; with ``within``, only those that beat their heart in the last seconds."""
        query = select(Worker).order_by(Worker.name)
        if target is not None:
            query = query.where(Worker.target == target)
        if role is not None:
            query = query.where(Worker.role == role)
        if within is not None:
            query = query.where(
                Worker.stopped_at.is_(None), Worker.heartbeat_at >= utcnow() - timedelta(seconds=within)
            )
        with self.session() as session:
            return list(session.scalars(query))

    def machines(self) -> list[Machine]:
        with self.session() as session:
            return list(session.scalars(select(Machine).order_by(Machine.hostname)))

    # -- best -------------------------------------------------------------------------------------------

    def best(self, problem_id: int, target: str, limit: int = 1) -> list[tuple[Measurement, dict[str, Any]]]:
        """The best valid measurements of a problem on a target, with their configurations.

        The objective and its direction are the ones the latest measurement used, so a problem tuned for
        GFLOPS is not ranked against one tuned for seconds.
        """
        with self.session() as session:
            latest = session.execute(
                select(Measurement.objective_name, Measurement.maximize)
                .where(Measurement.problem_id == problem_id, Measurement.target == target, Measurement.valid.is_(True))
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
                    Measurement.problem_id == problem_id,
                    Measurement.target == target,
                    Measurement.valid.is_(True),
                    Measurement.objective.is_not(None),
                    Measurement.objective_name == latest.objective_name,
                )
                .order_by(order, Measurement.id)
                .limit(limit)
            ).all()
        return [(m, config) for m, config in rows]

    def known_good(self, kind: str, target: str, *, exclude: int | None = None, limit: int = 5) -> list[dict[str, Any]]:
        """The best configurations of other problems of ``kind`` on ``target``: where a new search may start."""
        configs: list[dict[str, Any]] = []
        for problem in self.find_problems(kind=kind):
            if problem.id != exclude:
                configs += [config for _, config in self.best(problem.id, target, 1)]
        return configs[:limit]

    # -- helpers ----------------------------------------------------------------------------------------

    def insert(self, model: type) -> Any:
        """The dialect's INSERT, which has ON CONFLICT DO NOTHING."""
        return (postgresql if self.dialect == "postgresql" else sqlite).insert(model)

    def insert_many(self, connection: Connection, model: type, rows: Sequence[dict[str, Any]]) -> None:
        """INSERT ``rows`` (dicts with the same keys) in bulk, leaving rows that exist (by any unique constraint)
        alone, in ``connection``'s transaction.

        On PostgreSQL, psycopg2's ``execute_values`` sends pages of rows as multi-row VALUES: SQLAlchemy's
        executemany of INSERT ... ON CONFLICT made one round trip per row. SQLite runs in-process, where
        executemany is already fast.
        """
        if not rows:
            return
        if self.dialect != "postgresql":
            for start in range(0, len(rows), 2000):
                connection.execute(self.insert(model).on_conflict_do_nothing(), list(rows[start : start + 2000]))
            return
        from psycopg2.extras import execute_values

        table = model.__table__  # type: ignore[attr-defined]
        columns = list(rows[0])
        json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
        quote = connection.dialect.identifier_preparer.quote
        names = ", ".join(quote(c) for c in columns)
        sql = f"INSERT INTO {quote(table.name)} ({names}) VALUES %s ON CONFLICT DO NOTHING"
        values = [
            tuple(json.dumps(row[c]) if c in json_columns and row[c] is not None else row[c] for c in columns)
            for row in rows
        ]
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            execute_values(cursor, sql, values, page_size=2000)
        finally:
            cursor.close()

    def _insert_ignore(self, session: Session, model: type, values: dict[str, Any]) -> None:
        """INSERT that leaves an existing row (by any unique constraint) alone."""
        session.execute(self.insert(model).values(**values).on_conflict_do_nothing())


def _schema_missing(text: str) -> bool:
    return "no such table" in text or ("relation" in text and "does not exist" in text)


def _first_line(error: Exception) -> str:
    text = str(getattr(error, "orig", error) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
