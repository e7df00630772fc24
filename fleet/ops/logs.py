"""Worker logs: where they are kept, how they are rotated, and ``fleet logs`` to read them.

Each worker process's output goes to ``<log dir>/<role>/<target>/<host>/<worker>.log`` (Tuna's
``tuna_logs/<class>/<arch>/<host>/<worker>``), where the log dir is ``FLEET_LOG_DIR`` or
``$FLEET_HOME/logs``. The launcher is the only writer of a file: it reads the worker's output through a pipe
and rotates the file by size (``FLEET_LOG_MAX_BYTES``, ``FLEET_LOG_BACKUPS``), so the processes of a prefork
pool never race to rotate it. Workers log one line with the trial id when a task starts and ends, which is
what ``fleet logs --trial N`` looks for.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fleet.errors import ConfigurationError
from fleet.settings import Settings, get_settings

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_BACKUPS = 5


def safe(text: str) -> str:
    """``text`` fit for one path component: anything but letters, digits, ``-_.`` becomes ``-``."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text) or "-"


def log_dir(settings: Settings | None = None, env: dict[str, str] | None = None) -> Path:
    """The directory of worker logs: ``FLEET_LOG_DIR``, else ``$FLEET_HOME/logs``."""
    env = dict(os.environ if env is None else env)
    if env.get("FLEET_LOG_DIR"):
        return Path(env["FLEET_LOG_DIR"]).absolute()
    return (settings or get_settings()).home / "logs"


def rotation(env: dict[str, str] | None = None) -> tuple[int, int]:
    """The size at which a log is rotated and how many rotated files are kept, from the environment."""
    env = dict(os.environ if env is None else env)
    values = []
    for name, default in (("FLEET_LOG_MAX_BYTES", DEFAULT_MAX_BYTES), ("FLEET_LOG_BACKUPS", DEFAULT_BACKUPS)):
        raw = env.get(name) or str(default)
        if not raw.isdigit() or (name == "FLEET_LOG_MAX_BYTES" and int(raw) == 0):
            raise ConfigurationError(f"{name}={raw!r} must be a {'positive' if 'BYTES' in name else 'whole'} number")
        values.append(int(raw))
    return values[0], values[1]


def worker_log_path(directory: Path, role: str, target: str, worker: str) -> Path:
    """Where the log of ``worker`` (a Celery node name, ``name@host``) goes.

    Parameters
    ----------
    directory:
        The log directory (:func:`log_dir`).
    role:
        ``build`` or ``eval``.
    target:
        The target whose queue the worker consumes.
    worker:
        The worker's node name; the part after ``@`` is its host.
    """
    name, _, host = worker.partition("@")
    return directory / safe(role) / safe(target) / safe(host or "localhost") / f"{safe(name)}.log"


class RotatingLog:
    """An append-only file that is rotated (``x.log`` -> ``x.log.1`` -> ...) when it would pass ``max_bytes``.

    Parameters
    ----------
    path:
        The log file.
    max_bytes:
        Size at which it is rotated.
    backups:
        Rotated files kept; 0 truncates instead.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered: each line is in the file at once (a person may be tailing it), and a line a full disk refused
        # is not kept in a buffer to fail again.
        self.file: IO[bytes] = path.open("ab", buffering=0)
        self.size = self.file.tell()

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.size and self.size + len(data) > self.max_bytes:
                self._rotate()
            self.file.write(data)
            self.size += len(data)

    def _rotate(self) -> None:
        self.file.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        if self.backups:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self.file = self.path.open("wb", buffering=0)
        self.size = 0

    def close(self) -> None:
        with self.lock:
            self.file.close()


def pump(source: IO[bytes], log: RotatingLog, echo: IO[bytes] | None = None) -> threading.Thread:
    """Copy ``source`` line by line into ``log`` (and ``echo``) on a daemon thread until it ends.

    A line the log's disk refuses (full, for a while) is lost to the file, which says how many once it takes lines
    again; the source is read on all the same, so the worker never blocks on its output, and ``echo`` gets it all.
    """

    def run() -> None:
        copy, lost, why = echo, 0, ""
        try:
            for line in iter(source.readline, b""):
                try:
                    if lost:
                        log.write(f"fleet: {lost} lines of this log lost: {why}\n".encode())
                        lost = 0
                    log.write(line)
                except OSError as error:
                    lost, why = lost + 1, error.strerror or str(error)
                if copy is not None:
                    try:
                        copy.write(line)
                        copy.flush()
                    except (OSError, ValueError):  # our own output went away; the file still gets everything
                        copy = None
        finally:
            source.close()
            with contextlib.suppress(OSError):
                log.close()

    thread = threading.Thread(target=run, name=f"log-{log.path.name}", daemon=True)
    thread.start()
    return thread


# -- reading ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogFile:
    """One worker's log on this machine."""

    worker: str  # name@host, as the worker's Celery node name
    role: str
    target: str
    path: Path

    def files(self) -> list[Path]:
        """Its rotated files, oldest first, then the current one."""
        rotated = sorted(
            (p for p in self.path.parent.glob(f"{self.path.name}.*") if p.suffix[1:].isdigit()),
            key=lambda p: -int(p.suffix[1:]),
        )
        return [*rotated, self.path]


def find_logs(directory: Path) -> list[LogFile]:
    """Every worker log under ``directory`` (laid out as ``role/target/host/worker.log``)."""
    found = []
    for path in sorted(directory.glob("*/*/*/*.log")):
        host, target, role = path.parent.name, path.parent.parent.name, path.parent.parent.parent.name
        found.append(LogFile(f"{path.stem}@{host}", role, target, path))
    return found


def trial_pattern(trial_id: int) -> re.Pattern[str]:
    """Lines that mention trial ``trial_id``."""
    return re.compile(rf"\btrial[ =#]{trial_id}\b")


def trial_workers(store: Any, trial_id: int) -> list[str]:
    """The workers that built or measured ``trial_id``, from the database (empty if none has yet)."""
    from sqlalchemy import select

    from fleet.store._models import Artifact, Measurement

    trial = store.trial(trial_id)
    names = []
    if trial.worker:
        names.append(trial.worker)
    with store.session() as session:
        names += session.scalars(select(Measurement.worker).where(Measurement.trial_id == trial_id)).all()
        names += session.scalars(select(Artifact.worker).where(Artifact.build_key == trial.build_key)).all()
    # Leases are held as "name/pid": the log is the worker's, whatever pool process held it.
    return sorted({n.split("/")[0] for n in names if n})


def select_logs(logs: list[LogFile], worker: str | None) -> list[LogFile]:
    """The logs of ``worker``: its full name (``eval-gpu0@node1``), or its name on any host (``eval-gpu0``)."""
    if worker is None:
        return logs
    exact = [log for log in logs if log.worker == worker or log.worker.split("@")[0] == worker]
    return exact or [log for log in logs if worker in log.worker]


def tail(lines: Iterable[str], count: int) -> list[str]:
    return list(deque(lines, maxlen=count))


def _read_lines(files: list[Path]) -> Iterator[str]:
    for path in files:
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                yield from handle
        except FileNotFoundError:  # rotated away while we read
            continue


def show(
    logs: list[LogFile],
    *,
    lines: int,
    pattern: re.Pattern[str] | None = None,
    out: IO[str] | None = None,
) -> None:
    """Print the last ``lines`` lines of each log (those matching ``pattern``, searched in rotated files too).

    Parameters
    ----------
    logs:
        The logs to show.
    lines:
        How many lines of each.
    pattern:
        Only lines that match; the rotated files are searched too.
    """
    out = out or sys.stdout
    prefix = len(logs) > 1
    for log in logs:
        source = _read_lines(log.files() if pattern else [log.path])
        if pattern is not None:
            source = (line for line in source if pattern.search(line))
        for line in tail(source, lines):
            out.write(f"{log.worker} | {line}" if prefix else line)
    out.flush()


def follow(logs: list[LogFile], *, pattern: re.Pattern[str] | None = None, poll: float = 0.5) -> None:
    """Print what is written to ``logs`` from now on, until interrupted; a rotated file is reopened."""
    prefix = len(logs) > 1
    state: dict[Path, tuple[int, int]] = {}  # path -> (inode, offset)
    for log in logs:
        try:
            info = log.path.stat()
            state[log.path] = (info.st_ino, info.st_size)
        except FileNotFoundError:
            state[log.path] = (0, 0)
    partial: dict[Path, str] = {}
    while True:
        for log in logs:
            inode, offset = state[log.path]
            try:
                info = log.path.stat()
            except FileNotFoundError:
                continue
            if info.st_ino != inode or info.st_size < offset:
                inode, offset = info.st_ino, 0  # rotated: the new file is read from its start
            if info.st_size > offset:
                with log.path.open("rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
                offset += len(data)
                text = partial.pop(log.path, "") + data.decode("utf-8", errors="replace")
                *complete, rest = text.split("\n")
                if rest:
                    partial[log.path] = rest
                for line in complete:
                    if pattern is None or pattern.search(line):
                        sys.stdout.write(f"{log.worker} | {line}\n" if prefix else f"{line}\n")
                sys.stdout.flush()
            state[log.path] = (inode, offset)
        time.sleep(poll)


# -- fleet logs ---------------------------------------------------------------------------------------------
