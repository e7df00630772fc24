"""The workers' hot statements as PostgreSQL prepared statements.

psycopg2 sends every statement as text, and PostgreSQL parses and plans it each time: for the short
statements a trial costs, that is about a third of the server's work. Each hot statement is prepared once
per connection (``PREPARE``) and then run with ``EXECUTE``, keeping SQLAlchemy's types for its parameters
and its result columns.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Connection, CursorResult, bindparam, column, text
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

# invalid_sql_statement_name, duplicate_prepared_statement: what a server that does not keep a session's
# prepared statements answers (a transaction-pooling PgBouncer hands each statement to any backend).
REFUSED = {"26000", "42P05"}
PARAMETER = re.compile(r"%\((\w+)\)s")  # psycopg2's named parameters, as SQLAlchemy compiles them


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
        # Literal values (a state's name, NULL) become parameters when SQLAlchemy compiles; they keep theirs.
        self.defaults = dict(compiled.params)
        binds = [bindparam(key, type_=compiled.binds[key].type) for key in names]
        arguments = ", ".join(f":{key}" for key in names)
        self.execute = (
            text(f"EXECUTE {name}({arguments})" if names else f"EXECUTE {name}")
            .bindparams(*binds)
            .columns(*(column(c.key or f"column_{i}", c.type) for i, c in enumerate(statement.exported_columns)))
        )

    def run(self, connection: Connection, params: dict[str, Any]) -> CursorResult[Any]:
        """Run it on ``connection``, preparing it there first if this connection has not."""
        prepared: set[str] = connection.info.setdefault("fleet_prepared", set())
        if self.name not in prepared:
            connection.exec_driver_sql(self.prepare)
            prepared.add(self.name)
        return connection.execute(self.execute, self.defaults | params)


def refused(error: DBAPIError) -> bool:
    """Whether ``error`` says the server does not keep prepared statements."""
    return getattr(error.orig, "pgcode", None) in REFUSED
