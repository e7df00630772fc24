"""The private servers a benchmark runs on when the environment names none."""

from __future__ import annotations

import shutil
import signal
import tempfile
from contextlib import ExitStack
from pathlib import Path

from fleet.services import PostgresServer, RedisServer


def private_postgres(stack: ExitStack) -> PostgresServer:
    """A PostgreSQL cluster of its own, stopped and then removed when ``stack`` closes (runs leave GBs)."""
    pg_dir = Path(tempfile.mkdtemp(prefix="fleet-bench-pg-"))
    # Registered first, so that it runs after the server has stopped (callbacks run last in, first out).
    stack.callback(shutil.rmtree, pg_dir, ignore_errors=True)
    return stack.enter_context(PostgresServer(pg_dir))


def private_servers(stack: ExitStack, workdir: Path, env: dict[str, str]) -> dict[str, int]:
    """Point ``env`` at a private Redis and PostgreSQL for whichever of the two it names no URL of.

    Parameters
    ----------
    stack:
        Stops (and removes) the servers when it closes.
    workdir:
        The run's directory: Redis keeps its files there.
    env:
        The run's environment, updated in place.

    Returns the process id of each server started, by role (``broker``, ``database``): each runs in a
    session of its own, so it is also the id of the server's process group.
    """
    servers: dict[str, RedisServer | PostgresServer] = {}
    if not env.get("FLEET_BROKER_URL"):
        servers["broker"] = stack.enter_context(RedisServer(workdir / "redis"))
        env["FLEET_BROKER_URL"] = servers["broker"].url
    if not env.get("FLEET_DATABASE_URL"):
        servers["database"] = private_postgres(stack)
        env["FLEET_DATABASE_URL"] = servers["database"].url
    return {role: server.pid for role, server in servers.items() if server.pid is not None}


def postgres_url(stack: ExitStack) -> str:
    """``FLEET_DATABASE_URL`` when it names PostgreSQL, else a new database on a private server (see
    :func:`private_postgres`)."""
    import os
    import uuid

    url = os.environ.get("FLEET_DATABASE_URL", "")
    if not url.startswith("postgresql"):
        url = private_postgres(stack).create_database(f"bench{uuid.uuid4().hex[:8]}")
    return url


def unwind_on_signals() -> None:
    """Make SIGTERM and Ctrl-C (SIGINT) end this process by unwinding it, so that a benchmark's private servers and
    the processes it started are stopped on the way out, as at its normal end.

    By default a SIGTERM ends a process at once, and a process started in the background by a shell without job
    control inherits SIGINT ignored: either left the servers running. The first signal raises (Ctrl-C as
    ``KeyboardInterrupt``, which ``fleet`` reports as interrupted, status 130; SIGTERM as ``SystemExit(143)``); any
    further one is ignored, so that it cannot cut the stopping short. Call it from the main thread.
    """

    def unwind(signum: int, _frame: object) -> None:
        for each in (signal.SIGTERM, signal.SIGINT):
            signal.signal(each, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)  # the status a shell gives a command that a signal ended

    for each in (signal.SIGTERM, signal.SIGINT):
        signal.signal(each, unwind)
