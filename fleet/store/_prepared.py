"""The workers' hot statements as PostgreSQL prepared statements, run on psycopg2's own cursor.

psycopg2 sends every statement as text, and PostgreSQL parses and plans it each time: for the short
statements a trial costs, that is about a third of the server's work. Each hot statement is prepared once
per connection (``PREPARE``) and then run with ``EXECUTE``.

The ``EXECUTE`` goes straight to psycopg2's cursor: SQLAlchemy's execution machinery costs a worker more
CPU than the statement's whole round trip. The parameters still go through their SQLAlchemy types' bind
processors (JSON is encoded the same way); the results need none, as psycopg2 already returns JSON
decoded, timestamps as datetimes and numbers as Python numbers (``bytea`` comes as a ``memoryview``).
Errors are raised as SQLAlchemy's, and a connection they show dead is invalidated, as SQLAlchemy does.
"""

from __future__ import annotations

import contextlib
import re
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

# invalid_sql_statement_name, duplicate_prepared_statement: what a server that does not keep a session's
# prepared statements answers (a transaction-pooling PgBouncer hands each statement to any backend).
REFUSED = {"26000", "42P05"}
PARAMETER = re.compile(r"%\((\w+)\)s")  # psycopg2's named parameters, as SQLAlchemy compiles them


class Rows:
    """What an ``EXECUTE`` returned: the few ways of reading a result that the hot path uses."""

    def __init__(self, row: Callable[..., Any], fetched: Sequence[Sequence[Any]]) -> None:
        self._rows = [row(*values) for values in fetched]

    def first(self) -> Any:
        """The first row (with attributes named after the statement's columns), or None."""
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row, or None."""
        return self._rows[0][0] if self._rows else None


class Prepared:
    """One statement, prepared on each connection that runs it.

    Parameters
    ----------
    name:
        The prepared statement's name, unique within a store.
    statement:
        A Core statement whose parameters are all named ``bindparam`` objects; a parameter whose type
        PostgreSQL cannot infer from where it stands (a bare select-list item) must be cast.
    dialect:
        The PostgreSQL dialect it is compiled for.
    """

    def __init__(self, name: str, statement: Any, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.name = name
        self.prepare = f"PREPARE {name} AS {PARAMETER.sub(number, compiled.string)}"
        self.execute = f"EXECUTE {name}({', '.join(['%s'] * len(names))})" if names else f"EXECUTE {name}"
        # Literal values (a state's name, NULL) become parameters when SQLAlchemy compiles; they keep theirs.
        self._parameters = [
            (key, compiled.params.get(key), compiled.binds[key].type.dialect_impl(dialect).bind_processor(dialect))
            for key in names
        ]
        keys = [c.key or f"column_{i}" for i, c in enumerate(statement.exported_columns)]
        self._row = namedtuple(f"{name}_row", keys, rename=True)  # type: ignore[misc]  # the statement's columns: no literal list

    def run(self, connection: Connection, params: dict[str, Any]) -> Rows:
        """Run it on ``connection``, preparing it there first if this connection has not."""
        arguments = []
        for key, default, process in self._parameters:
            value = params.get(key, default)
            arguments.append(value if process is None else process(value))
        dbapi = connection.connection.dbapi_connection
        assert dbapi is not None
        prepared: set[str] = connection.info.setdefault("fleet_prepared", set())
        with contextlib.closing(dbapi.cursor()) as cursor:
            statement = self.prepare
            try:
                if self.name not in prepared:
                    cursor.execute(statement)
                    prepared.add(self.name)
                statement = self.execute
                cursor.execute(statement, arguments)
                return Rows(self._row, cursor.fetchall() if cursor.description else [])
            except connection.dialect.loaded_dbapi.Error as error:
                raise _wrapped(connection, statement, arguments, error, cursor) from error


def _wrapped(connection: Connection, statement: str, arguments: list[Any], error: Exception, cursor: Any) -> Any:
    """``error`` as SQLAlchemy raises it, after invalidating ``connection`` if the error shows it dead."""
    dialect = connection.dialect
    # The DB-API's own error: the stub's parameter is a PEP 249 Error, which psycopg2's errors do not declare.
    dead = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)  # type: ignore[arg-type]
    if dead:
        connection.invalidate(error)
    return DBAPIError.instance(
        statement, arguments, error, dialect.loaded_dbapi.Error, connection_invalidated=dead, dialect=dialect
    )


def refused(error: DBAPIError) -> bool:
    """Whether ``error`` says the server does not keep prepared statements."""
    return getattr(error.orig, "pgcode", None) in REFUSED
