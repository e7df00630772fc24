"""Bulk writes for imports of MIOpen's databases: hundreds of thousands of rows in one transaction, no ORM.

On PostgreSQL rows go in with ``COPY ... FROM STDIN``: the server parses one stream instead of a statement per
page of rows, which made the import of a find-db three times faster than multi-row ``INSERT ... VALUES``
(``execute_values``) here, where the server's parsing and the rows' per-row formatting (``mogrify``) were most
of the time. ``COPY`` has no ``ON CONFLICT``, so rows that may exist already go through a temporary table and
one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. SQLite runs in-process: the DB-API's ``executemany``,
with values converted once as SQLAlchemy would convert them, skips SQLAlchemy's per-row parameter handling.

Every function works inside the caller's transaction (``connection``), so an import that fails half way
leaves nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Connection, DateTime, select

from fleet.store import Measurement, Trial

# COPY's text format: a backslash, tab, newline or carriage return in a value must be escaped.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_BLOCK = 1 << 16  # characters of COPY text formatted and sent at a time


def _boolean(value: Any) -> str:
    return "t" if value else "f"


def _timestamp(value: datetime) -> str:
    return value.isoformat(" ")


def _formatter(column: Any) -> Callable[[Any], str]:
    """One column's value -> its COPY text. The last value's text is kept: columns that hold one object in
    every row (the campaign's id, a shared config dict, the import's timestamp) are formatted once."""
    convert: Callable[[Any], str] = str  # str() of a float is its shortest exact form, read back exactly
    if isinstance(column.type, JSON):
        convert = json.dumps  # SQLAlchemy's own serializer for JSON columns, so both writers agree
    elif isinstance(column.type, Boolean):
        convert = _boolean
    elif isinstance(column.type, DateTime):
        convert = _timestamp
    last: list[Any] = [object(), ""]

    def format_value(value: Any) -> str:
        if value is None:
            return "\\N"
        if value is last[0]:
            return last[1]
        text = convert(value)
        if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
            text = text.translate(_ESCAPES)
        last[0], last[1] = value, text
        return text

    return format_value


def _columns(model: type, columns: Sequence[str]) -> list[Any]:
    table = model.__table__  # type: ignore[attr-defined]  # a mapped class's table, which its type does not say
    return [table.columns[name] for name in columns]


def _quoted(connection: Connection, names: Iterable[str]) -> str:
    quote = connection.dialect.identifier_preparer.quote
    return ", ".join(quote(name) for name in names)


class _Stream:
    """The COPY text of ``rows``, read by psycopg2 a block at a time while the server parses what it sent:
    formatting the rows here and parsing them there overlap."""

    def __init__(self, formats: Sequence[Callable[[Any], str]], rows: Iterable[Sequence[Any]], tail: str) -> None:
        self.formats = formats
        self.rows = iter(rows)
        self.tail = tail + "\n"  # the columns every row shares, formatted once
        self.rest = ""
        self.count = 0

    def read(self, size: int = -1) -> str:
        parts, length = [self.rest], len(self.rest)
        formats, tail = self.formats, self.tail
        while size < 0 or length < size:
            row = next(self.rows, None)
            if row is None:
                break
            line = "\t".join([f(v) for f, v in zip(formats, row, strict=True)]) + tail
            parts.append(line)
            length += len(line)
            self.count += 1
        text = "".join(parts)
        if size < 0:
            self.rest = ""
            return text
        self.rest = text[size:]
        return text[:size]


def _copy(
    connection: Connection,
    table: str,
    model: type,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    same: Mapping[str, Any] | None = None,
) -> int:
    """COPY ``rows`` into ``table`` (``model``'s columns decide how values are written), each with the columns
    ``same``; return the rows sent."""
    same = same or {}
    shared = _columns(model, list(same))
    tail = "".join("\t" + _formatter(c)(v) for c, v in zip(shared, same.values(), strict=True))
    stream = _Stream([_formatter(c) for c in _columns(model, columns)], rows, tail)
    names = _quoted(connection, [*columns, *same])
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # a checked-out connection has its driver's
    try:
        cursor.copy_expert(f"COPY {table} ({names}) FROM STDIN", stream, size=_BLOCK)
    finally:
        cursor.close()
    return stream.count


def _sqlite_converters(connection: Connection, model: type, columns: Sequence[str]) -> list[Callable | None]:
    """What SQLAlchemy would do to each column's value before handing it to sqlite3 (JSON text, date text)."""
    dialect = connection.dialect
    out: list[Callable | None] = []
    for column in _columns(model, columns):
        if isinstance(column.type, (JSON, DateTime)):
            out.append(column.type.dialect_impl(dialect).bind_processor(dialect))
        else:
            out.append(None)
    return out


def _sqlite_rows(converters: Sequence[Callable | None], rows: Iterable[Sequence[Any]]) -> Iterable[tuple[Any, ...]]:
    if not any(converters):
        yield from (tuple(row) for row in rows)
        return
    for row in rows:
        yield tuple(v if f is None or v is None else f(v) for v, f in zip(row, converters, strict=True))


def insert(
    connection: Connection,
    model: type,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    ignore: bool = False,
    same: Mapping[str, Any] | None = None,
) -> None:
    """INSERT ``rows`` (tuples in the order of ``columns``) into ``model``'s table.

    Parameters
    ----------
    same:
        Columns and the value every row has in them (a campaign's id, a target, a timestamp): converted once,
        not once a row.
    ignore:
        Leave rows that exist (by any unique constraint) alone. Without it, the caller knows that none
        can exist (rows of a campaign created in this transaction), and a conflict is an error.
    """
    table = model.__table__.name  # type: ignore[attr-defined]  # a mapped class's table, which its type does not say
    if connection.dialect.name == "postgresql":
        if not ignore:
            _copy(connection, connection.dialect.identifier_preparer.quote(table), model, columns, rows, same)
            return
        names = _quoted(connection, [*columns, *(same or {})])
        scratch = _scratch(connection, model, [*columns, *(same or {})])
        if _copy(connection, scratch, model, columns, rows, same):
            connection.exec_driver_sql(
                f"INSERT INTO {connection.dialect.identifier_preparer.quote(table)} ({names}) "
                f"SELECT {names} FROM {scratch} ON CONFLICT DO NOTHING"
            )
        connection.exec_driver_sql(f"DROP TABLE {scratch}")
        return
    verb = "INSERT OR IGNORE" if ignore else "INSERT"
    every = [*columns, *(same or {})]
    sql = f"{verb} INTO {table} ({_quoted(connection, every)}) VALUES ({', '.join('?' * len(every))})"
    shared = tuple(
        _sqlite_rows(_sqlite_converters(connection, model, list(same or {})), [tuple((same or {}).values())])
    )
    rows = (row + shared[0] for row in _sqlite_rows(_sqlite_converters(connection, model, columns), rows))
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # a checked-out connection has its driver's
    try:
        cursor.executemany(sql, rows)
    finally:
        cursor.close()


def _scratch(connection: Connection, model: type, columns: Sequence[str]) -> str:
    """A temporary table with ``columns`` of ``model``'s table, dropped at commit at the latest."""
    table = model.__table__.name  # type: ignore[attr-defined]  # a mapped class's table, which its type does not say
    scratch = f"fleet_bulk_{table}"
    connection.exec_driver_sql(f"DROP TABLE IF EXISTS {scratch}")
    connection.exec_driver_sql(
        f"CREATE TEMPORARY TABLE {scratch} ON COMMIT DROP AS "
        f"SELECT {_quoted(connection, columns)} FROM {connection.dialect.identifier_preparer.quote(table)} WITH NO DATA"
    )
    return scratch


def insert_new(
    connection: Connection,
    model: type,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    unique: Sequence[str],
) -> tuple[dict[tuple[Any, ...], int], set[tuple[Any, ...]]]:
    """INSERT the ``rows`` that are not there yet, by the columns ``unique`` (a unique constraint of the table,
    each among ``columns``); return unique values -> id for every row, and the unique values of the rows this
    call created.

    New rows get their ids in the order of ``rows``. Another writer that creates one of the rows first (on
    PostgreSQL; SQLite's writers take the database's lock) wins, and its row's id is returned.
    """
    if not rows:
        return {}, set()
    at = [list(columns).index(name) for name in unique]
    quote = connection.dialect.identifier_preparer.quote
    table = quote(model.__table__.name)  # type: ignore[attr-defined]  # a mapped class's table, which its type does not say
    names = _quoted(connection, columns)
    keys = [quote(name) for name in unique]
    if connection.dialect.name == "postgresql":
        scratch = _scratch(connection, model, columns)
        connection.exec_driver_sql(f"ALTER TABLE {scratch} ADD COLUMN fleet_n serial")  # the rows' order
        _copy(connection, scratch, model, columns, rows)
        created = {
            tuple(r[1:])
            for r in connection.exec_driver_sql(
                f"INSERT INTO {table} ({names}) SELECT {names} FROM {scratch} ORDER BY fleet_n "
                f"ON CONFLICT DO NOTHING RETURNING id, {', '.join(keys)}"
            )
        }
        match = " AND ".join(f"t.{c} = s.{c}" for c in keys)
        found = {
            tuple(r[1:]): r[0]
            for r in connection.exec_driver_sql(
                f"SELECT t.id, {', '.join('t.' + c for c in keys)} FROM {table} t JOIN {scratch} s ON {match}"
            )
        }
        connection.exec_driver_sql(f"DROP TABLE {scratch}")
        return found, created
    found = _sqlite_ids(connection, table, keys, [tuple(row[i] for i in at) for row in rows])
    missing = [row for row in rows if tuple(row[i] for i in at) not in found]
    insert(connection, model, columns, missing)
    created = {tuple(row[i] for i in at) for row in missing}
    found.update(_sqlite_ids(connection, table, keys, sorted(created)))
    return found, created


def _sqlite_ids(
    connection: Connection, table: str, keys: Sequence[str], wanted: Sequence[tuple[Any, ...]]
) -> dict[tuple[Any, ...], int]:
    """unique values -> id of the rows of ``table`` among ``wanted``: a temporary table joined, one statement."""
    if not wanted:
        return {}
    width = len(wanted[0])
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]  # a checked-out connection has its driver's
    try:
        cursor.execute("DROP TABLE IF EXISTS temp.fleet_bulk_keys")
        cursor.execute(f"CREATE TEMPORARY TABLE fleet_bulk_keys ({', '.join(keys)})")
        cursor.executemany(f"INSERT INTO temp.fleet_bulk_keys VALUES ({', '.join('?' * width)})", wanted)
        match = " AND ".join(f"t.{c} = s.{c}" for c in keys)
        cursor.execute(
            f"SELECT t.id, {', '.join('t.' + c for c in keys)} FROM {table} t JOIN temp.fleet_bulk_keys s ON {match}"
        )
        found = {tuple(r[1:]): r[0] for r in cursor.fetchall()}
        cursor.execute("DROP TABLE temp.fleet_bulk_keys")
    finally:
        cursor.close()
    return found


# -- imported results -----------------------------------------------------------------------------------------


@dataclass
class Rows:
    """Rows for :func:`insert`: per-row values in the order of ``columns``, and the values every row has."""

    columns: Sequence[str]
    rows: Iterable[Sequence[Any]]
    same: Mapping[str, Any] = field(default_factory=dict)


def insert_finished(
    connection: Connection,
    campaign_id: int,
    target: str,
    toolchain: str,
    now: datetime,
    trials: Rows,
    by: Any,
    measurements: Rows,
) -> None:
    """Imported results as finished trials of a campaign created in this transaction, each with its measurement.

    An imported trial was queued, started and finished at the import, by the worker ``import``, without an
    attempt; its measurement comes from no node or GPU. None of the rows can exist yet, so they are written
    without conflict handling, and the trials' ids read back in one statement.

    Parameters
    ----------
    trials:
        The trials' own columns (their keys, state, problem or config where those differ between trials).
    by:
        The trial column that tells the campaign's trials apart (``Trial.config_key``, ``Trial.problem_id``).
    measurements:
        The measurements' own columns after ``trial_id``: each row begins with its trial's ``by`` value, which
        becomes the trial's id.
    """
    finished = {
        "campaign_id": campaign_id,
        "target": target,
        "baseline": False,
        "attempts": 0,
        "created_at": now,
        "queued_at": now,
        "started_at": now,
        "finished_at": now,
        "worker": "import",
    }
    insert(connection, Trial, trials.columns, trials.rows, same={**trials.same, **finished})
    query = select(by, Trial.id).where(Trial.campaign_id == campaign_id)
    trial_ids: dict[Any, int] = {key: trial_id for key, trial_id in connection.execute(query)}
    from_import = {
        "target": target,
        "toolchain": toolchain,
        "node": None,
        "gpu": None,
        "worker": "import",
        "created_at": now,
    }
    insert(
        connection,
        Measurement,
        ("trial_id", *measurements.columns),
        ((trial_ids[row[0]], *row[1:]) for row in measurements.rows),
        same={**measurements.same, **from_import},
    )
