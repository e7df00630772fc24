"""``fleet exec CMD``: one shell command on every machine of the fleet, in parallel, over SSH.

The machines are the ``machines`` table (those whose workers registered), ``--available`` narrows them to
those with a live worker, ``--node`` picks some by the name their workers registered (``FLEET_NODE_NAME``, else the
host name), ``--hosts`` names any SSH hosts instead. Each host's output and exit status are printed
in the order the hosts were given; a host that cannot be reached is reported and the others go on.

CMD is one string because it is what a user types for a remote shell: it runs in the remote user's login
shell, with that shell's quoting, globbing and ``&&``. Nothing in Fleet itself builds such a string.

SSH settings come from the SSH config file (``FLEET_SSH_CONFIG``, else ``~/.ssh/config``) as ``ssh`` reads
it, and from ``FLEET_SSH_USER``, ``FLEET_SSH_PORT`` and ``FLEET_SSH_KEY`` where set.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class HostResult:
    """What one host did with the command.

    Parameters
    ----------
    host:
        The host as given (or as the machines table names it).
    exit_status:
        The command's exit status; None when the host could not be reached or the command timed out.
    stdout, stderr:
        The command's output.
    error:
        Why there is no exit status.
    """

    host: str
    exit_status: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def _connection(host: str, connect_timeout: float) -> Any:
    from fabric import Config, Connection

    env = os.environ
    ssh_config = env.get("FLEET_SSH_CONFIG") or str(Path("~/.ssh/config").expanduser())
    config = Config(runtime_ssh_path=ssh_config if Path(ssh_config).exists() else None)
    connect_kwargs: dict[str, Any] = {}
    if env.get("FLEET_SSH_KEY"):
        connect_kwargs["key_filename"] = [env["FLEET_SSH_KEY"]]
    return Connection(
        host,
        user=env.get("FLEET_SSH_USER") or None,
        port=int(env["FLEET_SSH_PORT"]) if env.get("FLEET_SSH_PORT") else None,
        config=config,
        connect_timeout=connect_timeout,
        connect_kwargs=connect_kwargs,
    )


def run_on(host: str, command: str, *, timeout: float | None = None, connect_timeout: float = 10) -> HostResult:
    """Run ``command`` in ``host``'s remote shell and collect what happened; never raises for the host.

    Parameters
    ----------
    host:
        SSH host name (an alias of the SSH config file is fine).
    command:
        The shell command line, run by the remote user's shell.
    timeout:
        Seconds the command may run; None for no limit.
    connect_timeout:
        Seconds to wait for the SSH connection.
    """
    from invoke.exceptions import CommandTimedOut

    try:
        with _connection(host, connect_timeout) as connection:
            started = time.monotonic()
            result = connection.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
    except CommandTimedOut as error:
        return HostResult(host, None, error.result.stdout, error.result.stderr, f"timed out after {timeout:g} s")
    except Exception as error:  # unreachable, refused, authentication: reported, never fatal to the others
        return HostResult(host, None, error=f"unreachable: {type(error).__name__}: {error}".strip())
    # When the channel closes before Invoke's timer reports the timeout, the run ends with no exit status
    # (-1) instead of CommandTimedOut.
    if result.exited == -1 and timeout is not None and time.monotonic() - started >= timeout:
        return HostResult(host, None, result.stdout, result.stderr, f"timed out after {timeout:g} s")
    return HostResult(host, result.exited, result.stdout, result.stderr)


def run_everywhere(
    hosts: list[str], command: str, *, timeout: float | None = None, connect_timeout: float = 10, parallel: int = 32
) -> list[HostResult]:
    """``command`` on every host at once (at most ``parallel`` connections); results in the hosts' order.

    Parameters
    ----------
    hosts:
        SSH host names.
    command:
        The shell command line.
    timeout, connect_timeout:
        As :func:`run_on`.
    parallel:
        Most SSH sessions open at once.
    """
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(parallel, len(hosts))) as pool:
        return list(pool.map(lambda h: run_on(h, command, timeout=timeout, connect_timeout=connect_timeout), hosts))


def fleet_hosts(*, available: bool = False, nodes: list[str] | None = None) -> list[str]:
    """Host names from the machines table; with ``available``, only machines with a live worker.

    Parameters
    ----------
    nodes:
        Only these machines, in this order: each as its workers registered it (``FLEET_NODE_NAME``, else its host
        name). A name the table lacks raises :class:`~fleet.errors.NotFound` before any host is reached.
    """
    from fleet.settings import get_settings
    from fleet.store import Store

    settings = get_settings()
    store = Store(settings.database_url)
    try:
        machines = store.machines()
        if nodes:
            machines = _named(machines, nodes)
        if available:
            # Not less than 30 s: a node between two beats of a short heartbeat is still there to run a command.
            within = max(30.0, settings.liveness_seconds)
            live = {w.machine_id for w in store.workers(within=within)}
            machines = [m for m in machines if m.id in live]
    finally:
        store.close()
    return [m.hostname for m in machines]


def _named(machines: list[Any], nodes: list[str]) -> list[Any]:
    """The machines named ``nodes``, in their order; one line naming every unknown one and the known names."""
    from fleet.errors import NotFound

    by_name = {machine.hostname: machine for machine in machines}
    unknown = [name for name in nodes if name not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise NotFound(f"no node {', '.join(map(repr, unknown))} in the machines table (its nodes: {known})")
    return [by_name[name] for name in dict.fromkeys(nodes)]


def format_result(result: HostResult) -> str:
    """One host's block: a header with the host and its exit status, then its output."""
    status = f"exit {result.exit_status}" if result.error is None else result.error
    lines = [f"--- {result.host}: {status}"]
    for text in (result.stdout, result.stderr):
        if text:
            lines.append(text.rstrip("\n"))
    return "\n".join(lines)
