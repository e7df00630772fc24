"""Writing MIOpen's SQLite files: the whole file or nothing, and the same bytes for the same rows."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from fleet.errors import MIOpenDbError


def write_sqlite(path: Path, what: str, schema: Sequence[str], inserts: Iterable[tuple[str, list[tuple]]]) -> None:
    """Create ``path`` from ``schema`` and rows, replacing it only once the new file is complete.

    Parameters
    ----------
    path:
        The file to create or replace.
    what:
        What the file is (``perf-db``, ``kernel-db``), for error messages.
    schema:
        The statements that create its tables and indexes.
    inserts:
        (INSERT statement, rows) pairs, run in order.
    """
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise MIOpenDbError(f"cannot write {what} {path}: {directory} is not a directory")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(handle)
    try:
        os.unlink(temporary)  # SQLite creates it afresh, with no stray bytes
        connection = sqlite3.connect(temporary, isolation_level=None)
        try:
            connection.execute("PRAGMA page_size = 4096")  # fixed, so the bytes do not depend on the defaults
            connection.execute("BEGIN")
            for statement in schema:
                connection.execute(statement)
            for statement, rows in inserts:
                connection.executemany(statement, rows)
            connection.execute("COMMIT")
        finally:
            connection.close()
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, sqlite3.Error | OSError):
            raise MIOpenDbError(f"cannot write {what} {path}: {error}") from None
        raise
