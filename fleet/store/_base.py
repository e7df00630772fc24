"""What every concern of the store shares: the engines, sessions and transactions, the migrations, the
errors a user can act on, the dialect's inserts, and the workers' hot path's held connection.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import JSON, Connection, CursorResult, Engine, Result, Select, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.orm import Session, sessionmaker

from fleet.clock import sync_clock
from fleet.errors import StoreError, StoreUnavailable
from fleet.schema import head_revision
from fleet.store._hotpath import HotPath
from fleet.store._prepared import Prepared, refused

log = logging.getLogger("fleet.store")

# The errors that say the database could not do what was asked (it is down, it has no schema) become
# StoreError; any other (a constraint violated) is a bug, and raised as it is.
_UNANSWERED = (OperationalError, ProgrammingError, InterfaceError)
Method = TypeVar("Method", bound=Callable[..., Any])
PREPARED = (
    "claim_and_create", "claim_compile", "create_build", "built_and_compiled", "claim_evaluate", "record_measured",
)  # fmt: skip
"""The hot statements prepared on PostgreSQL: those every trial runs."""
_patient_calls = threading.local()


def patient(method: Method) -> Method:
    """Run ``method`` again while the database does not answer, for up to its store's ``patience`` seconds.

    A call that failed part way is run again whole. That is safe because each store method is one
    transaction, or statements ordered so that running them again is harmless: a second claim is refused
    and the lease brings the work back, a second result is not recorded. A patient method that calls
    another waits once, not once per level.
    """

    @functools.wraps(method)
    def call(self: StoreBase, *args: Any, **kwargs: Any) -> Any:
        if self.patience <= 0 or getattr(_patient_calls, "active", False):
            return method(self, *args, **kwargs)
        _patient_calls.active = True
        try:
            start = time.monotonic()
            delay = 0.2
            while True:
                try:
                    result = method(self, *args, **kwargs)
                except StoreUnavailable as error:
                    if time.monotonic() + delay > start + self.patience:
                        raise StoreUnavailable(f"{error} (for {self.patience:.0f} s)") from error
                    if delay == 0.2:
                        log.warning("%s; %s waits for it, up to %.0f s", error, method.__name__, self.patience)
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if delay > 0.2:
                    log.warning(
                        "database answers again: %s went on after %.1f s", method.__name__, time.monotonic() - start
                    )
                return result
        finally:
            _patient_calls.active = False

    return call  # type: ignore[return-value]  # the wrapper has the wrapped method's signature


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


def driver_url(parsed: Any, url: str) -> tuple[Any, str]:
    """``parsed`` and ``url`` with a plain ``postgresql://`` (or ``postgres://``) given the driver Fleet installs.

    SQLAlchemy 2.1 reads a plain ``postgresql://`` as psycopg 3, which Fleet neither installs nor uses: its hot
    path runs on psycopg2's cursor (``fleet.store._prepared``). A URL that names its driver is kept as it is.

    Parameters
    ----------
    parsed:
        ``url`` as ``sqlalchemy.engine.make_url`` read it.
    url:
        The URL as the user gave it.
    """
    if parsed.drivername not in ("postgresql", "postgres"):
        return parsed, url
    parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed, parsed.render_as_string(hide_password=False)


def rows_changed(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE run by a session changed: its result is a CursorResult, as SQLAlchemy's types for
    ``Session.execute`` do not say."""
    assert isinstance(result, CursorResult)
    return result.rowcount


class StoreBase:
    """The connections and helpers that each concern of :class:`fleet.store.Store` builds on (see its parameters)."""

    def __init__(self, url: str, *, durable: bool = True, patience: float = 0.0) -> None:
        # Seconds a patient method waits out a database that does not answer: workers and drivers set
        # it (Settings.outage_seconds); a command a user typed fails at once instead.
        self.patience = patience
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StoreError(f"{url!r} is not a database URL") from None
        parsed, url = driver_url(parsed, url)
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
        # The statements every trial runs, prepared on PostgreSQL (see fleet.store._prepared), each when first run:
        # a read command runs none, and building them all cost `fleet status` a tenth of a second.
        self._prepared: dict[str, Prepared] = {}
        self._prepares = self.dialect == "postgresql"
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
            # The hot path's pool (AUTOCOMMIT) has no pre-ping: it would double the hot path's statements;
            # a connection that a restart broke fails one call, which a patient store runs again. The
            # other pool's checkouts are few, and a ping spares them a connection that died while idle.
            session = {} if durable else {"options": "-c synchronous_commit=off"}
            # A link that dies (a partition: packets dropped, nothing refused) must fail a call in seconds, not hang
            # it for TCP's quarter of an hour: then the store's patience runs it again, and a driver cut off finds,
            # once healed, that its lease has gone (issue 39). Keepalives find an idle dead link in 5 + 3 * 2 s;
            # tcp_user_timeout fails a call whose data stays unacknowledged for 15 s. A slow query is not cut: the
            # server's kernel acknowledges it and the probes while it runs. Unix sockets ignore both.
            dead_link = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
            dead_link["tcp_user_timeout"] = 15_000
            # A pool keeps pool_size connections open; beyond them, a checkout opens a connection that its
            # checkin closes. A driver serving 20 campaigns from 20 threads opened 15 a second with 2.
            return create_engine(
                url,
                pool_size=8,
                max_overflow=8,
                pool_pre_ping="isolation_level" not in options,
                connect_args={"connect_timeout": 5, **dead_link, **session},
                **options,
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
        except _UNANSWERED as error:
            raise self._error(error) from error

    def _error(self, error: Exception) -> StoreError:
        """One line for a database error a user can act on; :class:`StoreUnavailable` for one worth a retry."""
        line = _first_line(error)
        if _schema_missing(line):
            return StoreError(f"database {self.display_url} has no Fleet schema ({line}): run `fleet db upgrade`")
        if getattr(getattr(error, "orig", error), "pgcode", None) == "42501":  # insufficient_privilege
            return StoreError(f"database {self.display_url} refused: {line} (not this login's to do: see `fleet team`)")
        if self.dialect == "postgresql" and isinstance(error, (OperationalError, InterfaceError)):
            # Refused, reset, restarting, shutting down, a deadlock: SQLite's are its file's, not an outage's.
            return StoreUnavailable(f"database {self.display_url} does not answer: {line}")
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
        except _UNANSWERED as error:
            raise self._error(error) from error
        return self.revision() or ""

    def revision(self) -> str | None:
        """The database's current migration revision, or None before the first upgrade.

        Read from Alembic's table with one query, not through Alembic: importing it costs a read command (``fleet
        status``) more than the command's own queries.
        """
        from sqlalchemy import inspect

        try:
            with self.engine.connect() as connection:
                if not inspect(connection).has_table("alembic_version"):
                    return None
                return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except _UNANSWERED as error:
            raise self._error(error) from error

    def head(self) -> str:
        """The latest migration's revision: the one no other migration revises (read from the files, as
        :meth:`revision` is, without importing Alembic); Alembic's answer where the files do not say it simply."""
        return head_revision() or self._alembic_head()

    def _alembic_head(self) -> str:
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic(None)).get_current_head() or ""

    def at_head(self) -> bool:
        """Whether the database is at the latest revision (nothing to migrate)."""
        return self.revision() == self.head()

    def check(self) -> None:
        """Raise :class:`StoreError` unless the database answers and is at the latest revision."""
        current = self.revision()
        if current != self.head():
            raise StoreError(
                f"database {self.display_url} is at revision {current or 'none'}, not {self.head()}: "
                "run `fleet db upgrade`"
            )

    # -- transactions and the hot path's connection -----------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A Core transaction (a Connection), committed at the end of the block: no ORM bookkeeping."""
        try:
            with self.engine.begin() as connection:
                yield connection
        except _UNANSWERED as error:
            raise self._error(error) from error

    def plain_rows(self, query: Select[Any]) -> list[tuple[Any, ...]]:
        """The rows of ``query`` as the DB-API driver gives them: tuples of the driver's own values (SQLite's
        timestamps as text, its booleans as 0 and 1), without SQLAlchemy's rows and conversions of each value,
        which for 100,000 rows cost half as much again as the query. For reads of many rows; the query's
        parameters are written into its SQL, as SQLAlchemy quotes literals."""
        with self.transaction() as connection:
            sql = str(query.compile(dialect=connection.dialect, compile_kwargs={"literal_binds": True}))
            cursor = connection.connection.cursor()
            try:
                cursor.execute(sql)
                return list(cursor.fetchall())
            except connection.dialect.loaded_dbapi.Error as error:
                raise self._error(error) from error
            finally:
                cursor.close()

    @contextmanager
    def _steps(self) -> Iterator[Connection]:
        """A connection for statements that each stand on their own: the workers' hot path, and the reads
        and lease renewals that every driver makes several times a second.

        On PostgreSQL every statement commits by itself, which saves the BEGIN and COMMIT round trips (and
        the other pool's ping): the hot path orders its statements so that stopping between two of them
        leaves work that a lease brings back, and what must be atomic is one statement. SQLite runs them in
        one transaction, as its writers take the database's lock anyway.

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
        except _UNANSWERED as error:
            raise self._error(error) from error

    def sync_clock(self) -> timedelta:
        """Measure how far the database's clock is ahead of this machine's, and take leases on its clock from now
        on (see :func:`fleet.store._models.utcnow`); returns the offset. SQLite is this machine's own clock."""
        if self.dialect != "postgresql":
            return timedelta(0)
        with self.engine.connect() as connection:
            return sync_clock(
                lambda: connection.execute(text("SELECT clock_timestamp() AT TIME ZONE 'UTC'")).scalar_one()
            )

    def connect_ahead(self) -> None:
        """Open the connection the hot path holds now, so that a worker's first claim does not wait for it.

        Not patient: a worker process starting while the database is away goes on, and its first task waits.
        """
        with self._steps():
            pass

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

    @functools.cached_property
    def _hot(self) -> HotPath:
        """The workers' hot statements, built on first use (never, in a read command)."""
        return HotPath(self.insert, self.dialect)

    def _run(self, connection: Connection, name: str, params: dict[str, Any]) -> Any:
        """Run the hot statement ``name``: prepared where the server keeps prepared statements."""
        prepared = self._prepared.get(name)
        if prepared is None and self._prepares and name in PREPARED:
            prepared = self._prepared[name] = Prepared(f"fleet_{name}", getattr(self._hot, name), self.engine.dialect)
        if prepared is not None:
            try:
                return prepared.run(connection, params)
            except DBAPIError as error:
                if not refused(error):
                    raise
                # This server forgets them: run every statement as text from now on.
                self._prepares = False
                self._prepared.clear()
        return connection.execute(getattr(self._hot, name), params)

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
        from psycopg2 import Error
        from psycopg2.extras import execute_values

        table = model.__table__  # type: ignore[attr-defined]  # a mapped class's table, which its type does not say
        columns = list(rows[0])
        json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
        quote = connection.dialect.identifier_preparer.quote
        names = ", ".join(quote(c) for c in columns)
        sql = f"INSERT INTO {quote(table.name)} ({names}) VALUES %s ON CONFLICT DO NOTHING"
        values = [
            tuple(json.dumps(row[c]) if c in json_columns and row[c] is not None else row[c] for c in columns)
            for row in rows
        ]
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # a checked-out connection has its driver's
        try:
            execute_values(cursor, sql, values, page_size=2000)
        except Error as error:  # the driver's own, past SQLAlchemy: a row a team's login may not write, say
            raise self._error(error) from error
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
