"""The private servers a benchmark runs on when the environment names none."""

from __future__ import annotations

import shutil
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


def private_servers(stack: ExitStack, workdir: Path, env: dict[str, str]) -> None:
    """Point ``env`` at a private Redis and PostgreSQL for whichever of the two it names no URL of.

    Parameters
    ----------
    stack:
        Stops (and removes) the servers when it closes.
    workdir:
        The run's directory: Redis keeps its files there.
    env:
        The run's environment, updated in place.
    """
    if not env.get("FLEET_BROKER_URL"):
        env["FLEET_BROKER_URL"] = stack.enter_context(RedisServer(workdir / "redis")).url
    if not env.get("FLEET_DATABASE_URL"):
        env["FLEET_DATABASE_URL"] = private_postgres(stack).url
