"""A look at the database without SQLAlchemy: what ``fleet status`` shows of it, and of one campaign.

SQLAlchemy's import is most of a read command's start (0.3 s of CPU on the 2-core VM, more than the queries of a
small database). ``fleet status`` of the whole database, and of one campaign whose best needs no searcher to judge
it, reads it here instead, through the DB-API driver itself (``sqlite3``, ``psycopg2``) and the same SQL that the
store's methods of the same names run, returning rows with their models' attribute names (a result with
:class:`fleet.store.TrialResult`'s); ``tests/integration/test_glance.py`` holds the two to the same output.
Anything it cannot read (another driver, a database behind the latest revision or missing) is left to
:class:`fleet.store.Store`: :func:`open_glance` then answers None.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from operator import itemgetter
from pathlib import Path
from queue import Full, Queue
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from fleet.clock import sync_clock, utcnow
from fleet.errors import NotFound, StoreError, did_you_mean
from fleet.schema import head_revision
from fleet.settings import redact
from fleet.states import UNFINISHED, ArtifactState, TrialState

Row = SimpleNamespace
"""A row, its columns as attributes named as the store's models name them."""

POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2")

STREAMED = 10_000
"""Trials in each list that :meth:`Glance.report_rows` gives on PostgreSQL."""

READ_AHEAD = 3
"""Lists read and not yet taken, at most: the reader waits for the caller beyond."""

SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"
"""How SQLAlchemy writes a timestamp in SQLite (text), which compares in that form."""

MEASURED_IN = "coalesce(trials.source_trial_id, trials.id)"
"""The trial whose measurement a trial has (the one it reused, else itself): ``Trial.measured_in`` of the store's
models, in SQL text, for reads without SQLAlchemy. The one place besides the models that spells the reuse rule
(tests/unit/test_reuse_rule.py); tests/integration/test_glance.py holds the glance's reads to the store's."""


_START = "SELECT coalesce(min(started_at), min(created_at)), count(history) FROM trials WHERE campaign_id = ?"
"""When a campaign's first trial started (else was created), and how many of its trials came from history."""

_RECORDED = (
    "SELECT measurements.objective_name, measurements.maximize FROM trials {} JOIN measurements"
    f" ON measurements.trial_id = {MEASURED_IN} WHERE trials.campaign_id = ?"
    " AND measurements.objective_name IS NOT NULL AND measurements.maximize IS NOT NULL ORDER BY trials.id DESC LIMIT 1"
)
"""The objective's name and direction as the measurement of a campaign's last measured trial has them: the trials read
back from the last (on SQLite ``NOT INDEXED`` in ``{}``, or it sorts every trial of the campaign first)."""

ReportFacts = tuple[datetime | None, bool, tuple[str, bool] | None]
"""When a campaign's first trial started (else was created), whether any of its trials was proposed from history,
and the objective's name and direction as its last measured trial's measurement has them (None before one is)."""


def open_glance(url: str) -> Glance | None:
    """A :class:`Glance` of the database ``url`` names, or None where the store must read it: another driver,
    a URL with options, a SQLite file that does not exist, a database that does not answer or is not at the
    latest revision (the store then says so, or migrates an embedded one)."""
    scheme, _, rest = url.partition("://")
    try:
        if scheme == "sqlite" and rest.startswith("/") and "?" not in rest and len(rest) > 1:
            path = Path(rest[1:])
            if not path.is_file():
                return None
            # Autocommit: each read stands alone, and no transaction is left open on the file.
            glance = Glance(sqlite3.connect(path, timeout=30, isolation_level=None), "sqlite", url)
        elif scheme in POSTGRES_SCHEMES and urlsplit(url).hostname is not None:
            import psycopg2

            glance = Glance(psycopg2.connect(f"postgresql://{rest}", connect_timeout=5), "postgresql", url)
        else:
            return None
    except Exception:  # whatever the driver raises: the store connects again and says what is wrong in one line
        return None
    try:
        if glance.revision() == head_revision():
            return glance
    except Exception:  # no schema: the store says to run `fleet db upgrade`
        pass
    glance.close()
    return None


class Glance:
    """Reads of the database, on one DB-API connection: the store's methods that ``fleet status`` calls.

    Parameters
    ----------
    connection:
        A ``sqlite3`` or ``psycopg2`` connection.
    dialect:
        ``sqlite`` or ``postgresql``.
    """

    def __init__(self, connection: Any, dialect: str, url: str) -> None:
        self.connection = connection
        self.dialect = dialect
        self.display_url = redact(url)
        self._dsn = f"postgresql://{url.partition('://')[2]}"  # a second connection's (see report_rows)
        self.streamed = STREAMED
        if dialect == "postgresql":
            connection.set_session(readonly=True, autocommit=True)

    def close(self) -> None:
        self.connection.close()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, its parameters written ``?`` (psycopg2's ``%s`` on PostgreSQL)."""
        if self.dialect == "postgresql":
            sql = sql.replace("?", "%s")
        try:
            cursor = self.connection.cursor()
            try:
                cursor.execute(sql, tuple(params))
                return list(cursor.fetchall()) if cursor.description is not None else []  # a SET has no rows
            finally:
                cursor.close()
        except Exception as error:  # the driver's own errors: one line, as the store gives them
            raise self._unanswered(error) from None

    def _unanswered(self, error: Exception) -> StoreError:
        """The driver's ``error`` as one line, as the store gives it."""
        lines = str(error).strip().splitlines()
        return StoreError(f"database {self.display_url} does not answer: {lines[0] if lines else error}")

    def _json(self, value: Any) -> Any:
        """A JSON column's value: psycopg2 decodes JSON itself, SQLite holds its text."""
        return json.loads(value) if isinstance(value, str) else value

    def _time(self, value: Any) -> datetime | None:
        """A timestamp column's value, as naive UTC (SQLite holds it as text)."""
        return datetime.fromisoformat(value) if isinstance(value, str) else value

    def _moment(self, value: datetime) -> Any:
        """A timestamp to compare a column with, written as the column holds it."""
        return value.strftime(SQLITE_TIME) if self.dialect == "sqlite" else value

    def revision(self) -> str | None:
        return self._rows("SELECT version_num FROM alembic_version")[0][0]

    def sync_clock(self) -> timedelta:
        """As :meth:`fleet.store.Store.sync_clock`: the database's clock ahead of this machine's, taken from now on."""
        if self.dialect != "postgresql":
            return timedelta(0)
        return sync_clock(lambda: self._rows("SELECT clock_timestamp() AT TIME ZONE 'UTC'")[0][0])

    def workers(self, *, within: float) -> list[Row]:
        """The workers whose heart beat in the last ``within`` seconds, by name."""
        since = self._moment(utcnow() - timedelta(seconds=within))
        found = self._rows(
            "SELECT name, role, target, gpu, queues, heartbeat_at, fault, fault_at FROM workers"
            " WHERE stopped_at IS NULL AND heartbeat_at >= ? ORDER BY name",
            [since],
        )
        return [
            Row(
                name=name,
                role=role,
                target=target,
                gpu=gpu,
                queues=self._json(queues),
                heartbeat_at=self._time(beat),
                fault=fault,
                fault_at=self._time(fault_at),
            )
            for name, role, target, gpu, queues, beat, fault, fault_at in found
        ]

    _CAMPAIGN = (
        "SELECT id, name, target, status, strategy, workload, reason, submitted, priority, driver, team FROM campaigns"
    )

    def _campaign(self, row: tuple[Any, ...]) -> Row:
        cid, name, target, status, strategy, workload, reason, submitted, priority, driver, team = row
        return Row(
            id=cid,
            name=name,
            target=target,
            status=status,
            strategy=self._json(strategy),
            workload=self._json(workload),
            reason=reason,
            submitted=bool(submitted),
            priority=priority,
            driver=driver,
            team=team,
        )

    def campaign(self, ref: str | int) -> Row:
        """As :meth:`fleet.store.Store.campaign`: the campaign with id or name ``ref``, its space and options too."""
        columns = self._CAMPAIGN.replace(" FROM campaigns", ", space, options, provenance, created_at FROM campaigns")
        if isinstance(ref, int) or str(ref).isdigit():
            found = self._rows(f"{columns} WHERE id = ? OR name = ? ORDER BY id LIMIT 1", [int(ref), str(ref)])
        else:
            found = self._rows(f"{columns} WHERE name = ? ORDER BY id LIMIT 1", [str(ref)])
        if not found:
            names = [name for (name,) in self._rows("SELECT name FROM campaigns LIMIT 10000")]
            raise NotFound(f"no campaign {ref!r}{did_you_mean(ref, names)}")
        *row, space, options, provenance, created_at = found[0]
        campaign = self._campaign(tuple(row))
        campaign.space, campaign.options, campaign.provenance = map(self._json, (space, options, provenance))
        campaign.created_at = self._time(created_at)
        return campaign

    def problem(self, problem_id: int) -> Row:
        found = self._rows("SELECT id, kind, params FROM problems WHERE id = ?", [problem_id])
        if not found:
            raise NotFound(f"no problem {problem_id}")
        pid, kind, params = found[0]
        return Row(id=pid, kind=kind, params=self._json(params))

    def campaigns(self) -> list[Row]:
        return [self._campaign(row) for row in self._rows(f"{self._CAMPAIGN} ORDER BY id")]

    def driven(self) -> dict[str, list[Row]]:
        """The campaigns each live driver holds, by driver name."""
        now = self._moment(utcnow())
        held: dict[str, list[Row]] = {}
        for row in self._rows(
            f"{self._CAMPAIGN} WHERE driver IS NOT NULL AND driver_lease_expires_at >= ? ORDER BY id", [now]
        ):
            campaign = self._campaign(row)
            held.setdefault(campaign.driver or "", []).append(campaign)
        return held

    def trial_counts(self, campaign_id: int) -> dict[str, int]:
        found = self._rows("SELECT state, count(*) FROM trials WHERE campaign_id = ? GROUP BY state", [campaign_id])
        return {state: count for state, count in found}

    def tally(self, campaign_id: int, maximize: bool, *, bests: bool = True) -> dict[int, Row]:
        """As :meth:`fleet.store.Store.tally`: per problem with finished trials, its best valid trial (with
        ``bests``), its counts by state, and those of its baseline trials."""
        unfinished = ", ".join("?" for _ in UNFINISHED)
        groups = self._rows(
            "SELECT problem_id, state, baseline, count(*), min(id) AS first FROM trials"
            f" WHERE campaign_id = ? AND state NOT IN ({unfinished})"
            " GROUP BY problem_id, state, baseline ORDER BY first",
            [campaign_id, *UNFINISHED],
        )
        evaluated = sorted({problem_id for problem_id, state, *_ in groups if state == TrialState.EVALUATED})
        found = self._bests(campaign_id, evaluated, maximize) if bests and evaluated else {}
        tallies: dict[int, Row] = {}
        for problem_id, state, baseline, n, _ in groups:
            tally = tallies.setdefault(problem_id, Row(best=found.get(problem_id), counts={}, baselines={}))
            tally.counts[state] = tally.counts.get(state, 0) + n
            if baseline:
                tally.baselines[state] = tally.baselines.get(state, 0) + n
        return tallies

    def _bests(self, campaign_id: int, problem_ids: Sequence[int], maximize: bool) -> dict[int, Row]:
        """Per problem of ``problem_ids``, its best valid result: the store's ``_best_candidates`` in SQL text (two
        walks down the measurements' index for those measured themselves, one for those reused), then the better
        of the two, among equals the earlier trial."""
        if self.dialect == "postgresql":
            # As the store: the planner's estimate sets off compiling the query (JIT), a tenth of a second or more.
            self._rows("SET jit = off")
        order = "DESC" if maximize else "ASC"
        usable = "trials.state = ? AND measurements.valid IS ? AND measurements.objective IS NOT NULL"
        own = (
            "measurements.problem_id = problems.id AND trials.campaign_id = ? AND trials.source_trial_id IS NULL"
            f" AND {usable}"
        )
        wanted = ", ".join("?" for _ in problem_ids)
        candidates = self._rows(
            "SELECT (SELECT trials.id FROM trials JOIN measurements ON measurements.trial_id = trials.id"
            f" WHERE {own} AND measurements.objective = (SELECT measurements.objective FROM measurements"
            f" JOIN trials ON trials.id = measurements.trial_id WHERE {own}"
            f" ORDER BY measurements.objective {order} LIMIT 1) ORDER BY measurements.trial_id LIMIT 1),"
            " (SELECT trials.id FROM trials JOIN measurements ON measurements.trial_id = trials.source_trial_id"
            f" WHERE trials.campaign_id = ? AND trials.problem_id = problems.id AND {usable}"
            f" ORDER BY measurements.objective {order}, trials.id LIMIT 1)"
            f" FROM problems WHERE problems.id IN ({wanted})",
            [
                *(campaign_id, TrialState.EVALUATED, True),
                *(campaign_id, TrialState.EVALUATED, True),
                *(campaign_id, TrialState.EVALUATED, True),
                *problem_ids,
            ],
        )
        found: dict[int, Row] = {}
        for result in self.results([i for pair in candidates for i in pair if i is not None]):
            held = found.get(result.problem_id)
            if held is None or _ranks_before(result, held, maximize):
                found[result.problem_id] = result
        return found

    def results(self, trial_ids: Sequence[int]) -> list[Row]:
        """As :meth:`fleet.store.Store.results` of ``trial_ids``: those of them in a terminal state, as rows with a
        :class:`fleet.store.TrialResult`'s attributes."""
        if not trial_ids:
            return []
        unfinished = ", ".join("?" for _ in UNFINISHED)
        wanted = ", ".join("?" for _ in trial_ids)
        found = self._rows(
            "SELECT trials.id, trials.problem_id, trials.config, trials.state, trials.reason, trials.baseline,"
            " trials.source_trial_id, measurements.objective, measurements.valid, measurements.metrics,"
            " measurements.objectives, trials.compile_seconds, trials.eval_seconds FROM trials"
            f" LEFT OUTER JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
            f" WHERE trials.state NOT IN ({unfinished}) AND trials.id IN ({wanted}) ORDER BY trials.id",
            [*UNFINISHED, *trial_ids],
        )
        return [
            Row(
                trial_id=trial_id,
                problem_id=problem_id,
                config=self._json(config),
                state=state,
                reason=reason,
                objective=objective,
                valid=bool(valid and state == TrialState.EVALUATED),
                metrics=self._json(metrics) or {},
                baseline=bool(baseline),
                reused=source is not None,
                compile_seconds=compile_seconds,
                eval_seconds=eval_seconds,
                objectives=self._json(objectives) or {},
            )
            for (
                trial_id, problem_id, config, state, reason, baseline, source, objective, valid, metrics, objectives,
                compile_seconds, eval_seconds,
            ) in found
        ]  # fmt: skip

    def same_run_baseline(
        self, campaign_id: int, problem_id: int, config: Mapping[str, Any], knobs: Sequence[str]
    ) -> Row | None:
        """As :meth:`fleet.store.Store.same_run_baseline`: the earliest valid baseline trial whose ``knobs`` have
        ``config``'s values, else the earliest valid baseline trial."""
        baselines = [
            (trial_id, self._json(baseline))
            for trial_id, baseline in self._rows(
                "SELECT trials.id, trials.config FROM trials"
                f" JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
                " WHERE trials.campaign_id = ? AND trials.problem_id = ? AND trials.baseline IS ? AND trials.state = ?"
                " AND measurements.valid IS ? ORDER BY trials.id",
                [campaign_id, problem_id, True, TrialState.EVALUATED, True],
            )
        ]
        found = next(
            (trial_id for trial_id, baseline in baselines if all(baseline.get(n) == config.get(n) for n in knobs)),
            baselines[0][0] if baselines else None,
        )
        return None if found is None else self.results([found])[0]

    def campaign_problems(self, campaign_id: int) -> list[Row]:
        found = self._rows(
            "SELECT problems.id, problems.kind, problems.params FROM problems"
            " JOIN campaign_problems ON campaign_problems.problem_id = problems.id"
            " WHERE campaign_problems.campaign_id = ? ORDER BY campaign_problems.position",
            [campaign_id],
        )
        return [Row(id=pid, kind=kind, params=self._json(params)) for pid, kind, params in found]

    def trial_rows(
        self, campaign_id: int, states: Sequence[str] | None = None, problem_id: int | None = None
    ) -> list[Row]:
        """As :meth:`fleet.store.Store.trial_rows`: the trials of a campaign (in ``states``, of ``problem_id``) with
        their objective, in id order, as rows with a :class:`fleet.store.TrialRow`'s attributes. A reused trial
        shows its source's objective, and its source's reason when it has none of its own."""
        # The store's trial_rows written again, the source's reason included. Importing SQLAlchemy here is the start
        # this module saves, and SQL text both could run would reach the store's query only as a column: the source's
        # reason by a correlated subquery, a lookup per trial where this join reads the trials once. Change both:
        # tests/integration/test_glance.py compares them.
        where = ["trials.campaign_id = ?"]
        params: list[Any] = [campaign_id]
        if states:
            where.append(f"trials.state IN ({', '.join('?' for _ in states)})")
            params.extend(states)
        if problem_id is not None:
            where.append("trials.problem_id = ?")
            params.append(problem_id)
        found = self._rows(
            "SELECT trials.id, trials.problem_id, problems.kind, trials.config, trials.state,"
            " coalesce(trials.reason, source.reason), measurements.objective, trials.worker, trials.attempts,"
            " trials.baseline, trials.source_trial_id, trials.history, measurements.objectives FROM trials"
            f" LEFT OUTER JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
            " JOIN problems ON problems.id = trials.problem_id"
            " LEFT OUTER JOIN trials AS source ON source.id = trials.source_trial_id"
            f" WHERE {' AND '.join(where)} ORDER BY trials.id",
            params,
        )
        return [
            Row(
                id=trial_id,
                problem_id=problem,
                problem_kind=kind,
                config=self._json(config),
                state=state,
                reason=reason,
                objective=objective,
                worker=worker,
                attempts=attempts,
                baseline=bool(baseline),
                source_trial_id=source,
                history=self._json(history),
                objectives=self._json(objectives),
            )
            for (
                trial_id, problem, kind, config, state, reason, objective, worker, attempts, baseline, source, history,
                objectives,
            ) in found
        ]  # fmt: skip

    def chains(self, campaign_id: int) -> list[Row]:
        found = self._rows(
            'SELECT problem_id, "index", step, steps, state, best_objective FROM chains'
            ' WHERE campaign_id = ? ORDER BY problem_id, "index"',
            [campaign_id],
        )
        return [
            Row(problem_id=problem_id, index=index, step=step, steps=steps, state=state, best_objective=best)
            for problem_id, index, step, steps, state, best in found
        ]

    # -- what `fleet report` reads (fleet.report.data; fleet.report.stored reads the same through the store) --------

    def report_rows(self, campaign_id: int) -> tuple[Iterator[list[tuple[Any, ...]]], Callable[[], ReportFacts]]:
        """The campaign's trials as ``fleet.report.data`` reads them, as the driver gives them, in lists of trials in
        trial order (as ``fleet.report.stored.StoredReads`` reads them, whose SQL this is, the finish in microseconds
        since the epoch), and a function to call once they are read that gives :meth:`report_facts`: on PostgreSQL
        the second half's reader reads those first, while the first half's rows come."""
        # When a trial finished as microseconds since the epoch: the driver decodes a timestamp at three times the
        # cost of an integer (50 ms of 100,000), and the page takes only differences of them.
        if self.dialect == "sqlite":
            chain = """CAST(JSON_QUOTE(JSON_EXTRACT(measurements.metrics, '$."chain"')) AS TEXT)"""
            # Its text, "YYYY-MM-DD HH:MM:SS.ffffff" (SQLITE_TIME): the whole seconds, then the fraction. SQLite's
            # date functions keep milliseconds, and would round .999999 up to the next second.
            finished = (
                "CAST(strftime('%s', substr(trials.finished_at, 1, 19)) AS INTEGER) * 1000000"
                " + CAST(substr(trials.finished_at, 21, 6) AS INTEGER)"
            )
        else:
            chain = "CAST(measurements.metrics -> 'chain' AS TEXT)"
            finished = "CAST(extract(epoch FROM trials.finished_at) * 1000000 AS BIGINT)"  # numeric: exact
        sql = (
            "SELECT trials.id, trials.problem_id, CAST(trials.config AS TEXT), trials.state, trials.reason,"
            f" trials.baseline, {finished}, trials.source_trial_id, measurements.objective, measurements.valid,"
            f" {chain}, measurements.node, measurements.gpu, measurements.worker, measurements.toolchain,"
            " measurements.device FROM trials"
            f" LEFT OUTER JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
            " WHERE trials.campaign_id = ?"
        )

        def started() -> ReportFacts:
            return self.report_facts(campaign_id)

        if self.dialect == "sqlite":
            # SQLite runs the query in this process, and orders its wide rows through a temporary B-tree (the
            # trials' index by campaign is not in id order): sorting the tuples by their first item here costs a
            # fifth of it.
            found = self._rows(sql, [campaign_id])
            found.sort(key=itemgetter(0))
            return iter([found]), started
        ((low, high),) = self._rows("SELECT min(id), max(id) FROM trials WHERE campaign_id = ?", [campaign_id])
        if low is None:
            return iter(()), started
        # Two halves of the trials' ids, each read on a connection of its own: the server makes both at once (the
        # join with the measurements is most of its work), and each half's rows are decoded while the caller works.
        middle = (low + high) // 2
        halves = [(campaign_id, low, middle), (campaign_id, middle + 1, high)]
        first: Queue[Any] = Queue(maxsize=1)
        lists = self._streamed(
            f"{sql} AND trials.id BETWEEN ? AND ? ORDER BY trials.id", halves, (self._facts_sql(), [campaign_id], first)
        )

        answered: list[Any] = []

        def read_first() -> ReportFacts:
            if not answered:  # the queue gives its answer once: kept for the calls after
                answered.append(first.get())
            (found,) = answered
            if isinstance(found, StoreError):
                raise found
            return self._facts(found)

        return lists, read_first

    def _streamed(
        self, sql: str, parts: Sequence[Sequence[Any]], first: tuple[Sequence[str], Sequence[Any], Queue[Any]]
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of ``sql`` on PostgreSQL for each of ``parts`` (its parameters) in turn, in lists of
        :attr:`streamed`. Each part is read by a thread of its own, the first on this connection and the others on
        new ones where the server takes them, through a cursor of the server's: the server makes the rows and the
        driver decodes them (it waits without Python's lock) while the caller works on the lists before. A thread
        reads at most ``READ_AHEAD`` lists ahead of the caller. ``first`` is queries (their SQL, their parameters)
        that the last part's reader runs before its part, and the queue that gets the list of their rows (or the
        error that ended them, which the lists raise too).
        """
        import psycopg2

        size, stop = self.streamed, threading.Event()
        queues: list[Queue[Any]] = [Queue(maxsize=READ_AHEAD) for _ in parts]
        read_before = [threading.Event() for _ in parts]  # each part's reader is done with its connection

        def hand(lists: Queue[Any], item: Any) -> bool:
            """Give the caller ``item``, unless it stopped taking them."""
            while not stop.is_set():
                with contextlib.suppress(Full):
                    lists.put(item, timeout=0.1)
                    return True
            return False

        def read(index: int) -> None:
            lists = queues[index]
            try:
                connection = self._connection_for(index, read_before)
                if stop.is_set():  # the caller stopped while this part waited for a connection
                    return
                try:
                    if index == len(parts) - 1:
                        first[2].put(self._answers(connection, first[0], first[1]))
                    if connection.autocommit:  # the server's cursor lives in a transaction, of reads only
                        connection.autocommit = False
                    with connection.cursor(name=f"fleet_glance_{index}") as cursor:
                        cursor.execute(sql.replace("?", "%s"), tuple(parts[index]))
                        while (found := cursor.fetchmany(size)) and hand(lists, found):
                            pass
                    hand(lists, [])
                finally:
                    with contextlib.suppress(psycopg2.Error):  # a connection lost: its error says so, in one line
                        connection.rollback()
                        connection.autocommit = True
                    if connection is not self.connection:
                        connection.close()
            except psycopg2.Error as error:
                if index == len(parts) - 1 and first[2].empty():
                    first[2].put(self._unanswered(error))
                hand(lists, self._unanswered(error))
            finally:
                read_before[index].set()
                if index == len(parts) - 1 and first[2].empty():  # the caller stopped first: it must not wait
                    first[2].put(StoreError(f"database {self.display_url}: the report's reads were stopped"))

        readers = [threading.Thread(target=read, args=(index,), daemon=True) for index in range(len(parts))]
        for reader in readers:
            reader.start()
        try:
            for lists in queues:
                while found := lists.get():
                    if isinstance(found, StoreError):
                        raise found
                    yield found
        finally:
            stop.set()
            for reader in readers:
                reader.join()

    def _connection_for(self, index: int, read_before: Sequence[threading.Event]) -> Any:
        """The connection of :meth:`_streamed`'s part ``index``: the first part's is the glance's; another's is new,
        else (the server takes no more of this login's connections) the glance's once the parts before are read."""
        import psycopg2

        if index:
            try:
                connection = psycopg2.connect(self._dsn, connect_timeout=5)
                connection.set_session(readonly=True)
                return connection
            except psycopg2.OperationalError:
                read_before[index - 1].wait()
        return self.connection

    @staticmethod
    def _answers(connection: Any, queries: Sequence[str], values: Sequence[Any]) -> list[list[tuple[Any, ...]]]:
        """The rows of each of ``queries`` (their parameters ``values``) on the PostgreSQL ``connection``."""
        with connection.cursor() as cursor:
            answers = []
            for query in queries:
                cursor.execute(query.replace("?", "%s"), tuple(values))
                answers.append(cursor.fetchall())
            return answers

    def report_facts(self, campaign_id: int) -> ReportFacts:
        """What the report reads of the campaign besides its trials (:data:`ReportFacts`; :meth:`history_trials`
        reads which trials came from history)."""
        return self._facts([self._rows(query, [campaign_id]) for query in self._facts_sql()])

    def _facts_sql(self) -> tuple[str, str]:
        """The queries of :meth:`report_facts`."""
        return _START, _RECORDED.format("NOT INDEXED" if self.dialect == "sqlite" else "")

    def _facts(self, found: Sequence[list[tuple[Any, ...]]]) -> ReportFacts:
        """The rows of :meth:`_facts_sql` as :data:`ReportFacts`."""
        ((start, proposed),), recorded = found
        objective = (str(recorded[0][0]), bool(recorded[0][1])) if recorded else None
        return self._time(start), proposed > 0, objective

    def chain_trials(self, campaign_id: int) -> list[tuple[int, int]]:
        """Every recorded step of the campaign's chains, in order, as (the chain's index, the step's trial)."""
        return [
            (index, trial_id)
            for index, trial_id in self._rows(
                'SELECT chains."index", chain_steps.trial_id FROM chains'
                " JOIN chain_steps ON chain_steps.chain_id = chains.id WHERE chains.campaign_id = ?"
                ' ORDER BY chains.problem_id, chains."index", chain_steps.step',
                [campaign_id],
            )
        ]

    def trial_outputs(self, trial_ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """Per trial of ``trial_ids``: its id, build key, output's tails, and its measurement's samples and metrics."""
        wanted = ", ".join("?" for _ in trial_ids)
        found = self._rows(
            "SELECT trials.id, trials.build_key, trials.stdout_tail, trials.stderr_tail, measurements.samples,"
            " measurements.metrics FROM trials"
            f" LEFT OUTER JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
            f" WHERE trials.id IN ({wanted})",
            list(trial_ids),
        )
        return [(*row[:4], self._json(row[4]), self._json(row[5])) for row in found]

    def failed_build_logs(self, build_keys: Sequence[str]) -> dict[str, str]:
        """The log of each failed build among ``build_keys``, by key."""
        wanted = ", ".join("?" for _ in build_keys)
        found = self._rows(
            f"SELECT build_key, log_tail FROM artifacts WHERE build_key IN ({wanted}) AND state = ?",
            [*build_keys, ArtifactState.FAILED],
        )
        return {key: log or "" for key, log in found}

    def history_trials(self, campaign_id: int) -> list[tuple[int, int, dict[str, Any], float | None]]:
        """As :meth:`fleet.store.Store.history_trials`: (trial id, problem id, what history said, objective)."""
        found = self._rows(
            "SELECT trials.id, trials.problem_id, trials.history, measurements.objective FROM trials"
            f" LEFT OUTER JOIN measurements ON measurements.trial_id = {MEASURED_IN}"
            " AND measurements.valid IS ? WHERE trials.campaign_id = ? AND trials.history IS NOT NULL"
            " ORDER BY trials.id",
            [True, campaign_id],
        )
        return [
            (trial_id, problem_id, dict(self._json(said)), objective) for trial_id, problem_id, said, objective in found
        ]


def _ranks_before(result: Row, other: Row, maximize: bool) -> bool:
    """As the store's: whether ``result`` is a better best than ``other`` (a better objective, or the same and an
    earlier trial)."""
    if result.objective != other.objective:
        return bool(result.objective > other.objective if maximize else result.objective < other.objective)
    return bool(result.trial_id < other.trial_id)
