"""What every command group of the ``fleet`` command line shares: the store, the broker, output, progress."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from fleet.errors import BrokerError, FleetError, NotFound, printable
from fleet.settings import get_settings, redact

T = TypeVar("T")

log = logging.getLogger("fleet.cli")


def database_url() -> str:
    """The database the commands read, fit to print (its password hidden)."""
    return redact(get_settings().database_url)


def log_database() -> None:
    """Name the database a command reads in ``fleet -v`` output, password hidden."""
    log.info("database: %s", database_url())


def open_store(check: bool = True, read_only: bool = False, named: bool = False) -> Any:
    """The store ``FLEET_DATABASE_URL`` names, checked to answer at the latest revision unless ``check`` is false.

    Every command that reads the database opens it here, so ``fleet -v`` names the database for all of them.

    Parameters
    ----------
    check:
        Check that the database answers and is at the latest revision (and migrate an embedded one).
    read_only:
        The command only reads: a SQLite database that does not exist is not created (which would answer "no
        campaigns" from a new, empty file) but named in one line, :class:`NotFound`.
    named:
        The command named the database already (it looked at it through a glance first): not again.
    """
    settings = get_settings()
    if not named:
        log_database()
    if read_only:
        missing_database(settings.database_url)  # first: a folder with no database needs no SQLAlchemy to say so
    from fleet.store import Store

    store = Store(settings.database_url)
    if check:
        if settings.embedded_database and not store.at_head():
            store.upgrade()  # Alembic only when there is something to migrate: importing it is slow
        store.check()
    return store


def check_database() -> None:
    """That the database answers at the latest revision (an embedded one is migrated), or one line says why: through
    a glance where it can tell (a worker's launcher then never imports SQLAlchemy), else as :func:`open_store` does."""
    from fleet.glance import open_glance

    glance = open_glance(get_settings().database_url)
    if glance is None:
        open_store().close()
        return
    log_database()
    glance.close()


def glance_or_store() -> Any:
    """What ``fleet status`` reads the whole database with: a :class:`fleet.glance.Glance` where it can take one
    (no SQLAlchemy to import: most of a small database's status), else the store, as :func:`open_store` opens it."""
    from fleet.glance import open_glance

    glance = open_glance(get_settings().database_url)
    if glance is None:
        return open_store(read_only=True)
    log_database()
    return glance


def say_scope(store: Any, trusted: Any) -> None:
    """Say on stderr what an answer ``--from all`` drew on, where that is not every campaign (fleet.trust.scope)."""
    from fleet.trust import scope

    line = scope(store, trusted)
    if line is not None:
        import click

        click.echo(f"fleet: {line}", err=True)


def missing_database(url: str) -> None:
    """Raise :class:`NotFound` when ``url`` names a SQLite file that does not exist; say where Fleet looked."""
    database = _sqlite_database(url)
    if not database or Path(database).is_file():
        return
    where = Path(database)
    hint = (
        "no campaign ran here: run from the folder holding .fleet/, or set FLEET_HOME"
        if get_settings().embedded_database
        else "check FLEET_DATABASE_URL"
    )
    raise NotFound(f"no Fleet database at {where}: {hint}")


def _sqlite_database(url: str) -> str | None:
    """The file (or ``:memory:``) a SQLite URL names, as SQLAlchemy reads it; None for another database.

    A plain ``sqlite:///PATH`` (what an embedded fleet's URL is) is read here: SQLAlchemy's import is most of the
    time a command takes to say that a folder has no database. Any other URL is read by SQLAlchemy itself.
    """
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite" and rest.startswith("/") and not any(c in rest for c in "?%#@"):
        return rest[1:]
    if not scheme.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.database if parsed.get_backend_name() == "sqlite" else None


def check_broker() -> None:
    """Fail with one line when the broker does not answer (a private or filesystem one always does)."""
    from fleet.celery_app import app

    settings = get_settings()
    if settings.embedded_broker or settings.broker_url.startswith("filesystem://"):
        return
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0.5, timeout=5)
    except Exception as error:  # kombu raises several kinds; all mean the same to the user
        raise BrokerError(f"broker {redact(settings.broker_url)} does not answer: {error}") from None


def format_value(value: Any) -> str:
    """A value as human output prints it: booleans and null as JSON writes them, the rest as text."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return printable(str(value))


def format_config(config: dict[str, Any]) -> str:
    """``k=v k=v``: a configuration or a problem's parameters on one line."""
    return " ".join(f"{printable(str(k))}={format_value(v)}" for k, v in config.items())


def is_stdout(output: Path) -> bool:
    """Whether an ``-o`` option names standard output: ``-`` means it for every command."""
    return str(output) == "-"


def write_output(output: Path, fill: Callable[[IO[str]], T]) -> T:
    """Run ``fill`` on ``output`` (``-``: standard output) and return what it returns.

    A file is written whole or not at all: ``fill`` writes a temporary file beside it that replaces it at the end,
    so a failure leaves no half-written file, and a reader never sees half of one. What is there and no regular file
    (``/dev/null``, a FIFO) is written in place: replaced, as root, ``/dev/null`` would become a file of the output.
    """
    if is_stdout(output):
        return fill(sys.stdout)
    if output.exists() and not output.is_file():
        try:
            with output.open("w", encoding="utf-8", newline="") as out:
                return fill(out)
        except OSError as error:
            raise FleetError(f"cannot write {output}: {error.strerror or error}") from None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    except OSError as error:
        raise FleetError(f"cannot write {output}: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            result = fill(out)
        os.chmod(temporary, 0o644)
        os.replace(temporary, output)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise FleetError(f"cannot write {output}: {error.strerror or error}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return result


class ProgressBar:
    """Progress of a campaign on stderr: a bar on a terminal, else a plain line every 10 s or 10 % of the trials.

    A log gets whole lines it can be read in, never the carriage returns that redraw a bar.
    """

    EVERY_SECONDS = 10.0

    def __init__(
        self, name: str, quiet: bool, stream: IO[str] | None = None, labels: dict[int, str] | None = None
    ) -> None:
        self.name = name
        # Several problems: the best shown is of the latest result's problem, which its label names.
        self.labels = labels if labels and len(labels) > 1 else {}
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.bar: Any = None
        self.started = time.monotonic()
        self.printed_at = self.started
        self.printed: tuple[int, int | None] | None = None
        self.last: tuple[int, int | None, Any] = (0, None, None)
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(desc=name, unit="trial", file=self.stream, dynamic_ncols=True)

    def update(self, done: int, total: int | None, best: Any) -> None:
        self.last = (done, total, best)
        if self.bar is not None:
            if total is not None and self.bar.total != total:
                self.bar.total = total
            self.bar.n = done
            if best is not None and best.objective is not None:
                self.bar.set_postfix_str(self._best(best), refresh=False)
            self.bar.refresh()
            return
        if self.quiet:
            return
        now = time.monotonic()
        step = max(1, (total or 0) // 10)
        since = self.printed[0] if self.printed else 0
        if now - self.printed_at >= self.EVERY_SECONDS or (total and done - since >= step):
            self._line(now)

    def _line(self, now: float) -> None:
        done, total, best = self.last
        if self.printed == (done, total):
            return
        rate = done / (now - self.started) if now > self.started else 0.0
        line = f"{self.name}: {done}/{'?' if total is None else total} trials, {rate:.1f}/s"
        if best is not None and best.objective is not None:
            line += f", {self._best(best)}"
        print(line, file=self.stream, flush=True)
        self.printed, self.printed_at = (done, total), now

    def _best(self, best: Any) -> str:
        label = self.labels.get(best.problem_id) if self.labels else None
        return f"best {best.objective:.4g}" + (f" of {label}" if label else "")

    def warn(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(f"fleet: warning: {line}", file=self.stream)
        else:
            print(f"fleet: warning: {line}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet and self.last != (0, None, None):
            self._line(time.monotonic())  # not for a run that measured nothing ('0/? trials'): it says so itself
