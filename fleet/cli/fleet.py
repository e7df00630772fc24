"""Commands that run the fleet itself: ``fleet worker``, ``up``, ``db`` and ``team``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import check_database, open_store
from fleet.cli._sections import WholeHelpGroup
from fleet.settings import get_settings, redact


@click.command()
@click.option("--target", help="Target of this node (default: detected from its GPUs, else its CPU).")
@click.option("--gpus", help="GPU indices to use, e.g. 0,1 (default: every detected GPU).")
@click.option(
    "--eval-procs",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Evaluation processes on a node with no GPU.",
)
@click.option("--build-procs", type=click.IntRange(1), help="Build concurrency (default: the node's cores).")
@click.option("--loglevel", default="INFO", show_default=True, help="Celery log level.")
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    help="Where each worker's log goes (default: FLEET_LOG_DIR, else $FLEET_HOME/logs); `fleet logs` reads it.",
)
@click.option("--dry-run", is_flag=True, help="Print the worker processes this node would start, and exit.")
@click.option(
    "--check",
    is_flag=True,
    help="Check that these workers can work here (database, broker, sandbox, GPUs), say so in one line, and exit: "
    "0 when they can, 1 naming what failed (a Kubernetes probe).",
)
@click.option(
    "--role",
    type=click.Choice(["all", "eval", "build"]),
    default="all",
    show_default=True,
    help="Start only the evaluation or the build processes (one systemd unit each).",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=840.0,
    show_default=True,
    envvar="FLEET_STOP_TIMEOUT",
    help="Seconds a stop waits for running measurements before killing them ($FLEET_STOP_TIMEOUT).",
)
def worker(
    target: str | None,
    gpus: str | None,
    eval_procs: int,
    build_procs: int | None,
    loglevel: str,
    log_dir: Path | None,
    dry_run: bool,
    role: str,
    stop_timeout: float,
    check: bool,
) -> None:
    """Start this node's workers: one evaluation process per GPU, plus build processes."""
    from fleet.targets import check_target
    from fleet.workers.launch import Launcher, command, node_gpus, plan

    if target:
        check_target(target)
    if check:
        click.echo(_check_node(target, gpus, role))
        return
    specs = plan(
        # A build-only node of a GPU target has no GPU to find: it compiles on its cores (a Kubernetes build pod).
        gpus=[] if role == "build" and target else node_gpus(target, gpus),
        target=target,
        eval_procs=eval_procs,
        build_procs=build_procs,
        host=os.environ.get("FLEET_NODE_NAME") or None,  # the node's name where it was deployed (deploy/)
    )
    specs = [spec for spec in specs if role in ("all", spec.role)]
    if dry_run:
        for spec in specs:
            pinning = " ".join(f"{k}={v}" for k, v in spec.env.items() if k.endswith("VISIBLE_DEVICES"))
            click.echo(f"{spec.name}  {spec.queue}  -c {spec.concurrency}  {pinning}".rstrip())
            click.echo(f"  {' '.join(command(spec, loglevel))}")
        return
    _check_fleet_settings()
    check_database()
    _check_workload_account()
    from fleet.ops.logs import log_dir as default_log_dir

    launcher = Launcher(specs, log_dir=log_dir or default_log_dir(), loglevel=loglevel, echo=True)
    _serve(launcher, stop_timeout)


def _check_node(target: str | None, gpus: str | None, role: str) -> str:
    """``fleet worker --check``: whether the workers these options start could work on this node now; a line
    saying what answered, or :class:`~fleet.errors.FleetError` with one line naming the first thing that failed.

    Checked as a worker meets them, the node's own things first: its settings, its GPUs (those of an evaluation
    role on a GPU target must be visible), its memory, cache and sandbox, then the database (at the latest
    revision) and the broker. Nothing is started and nothing is written but a probe file in the cache.
    """
    from fleet.cli._common import check_broker
    from fleet.errors import FleetError
    from fleet.workers import health, sandbox
    from fleet.workers.gpus import missing_gpus
    from fleet.workers.launch import node_gpus

    said: list[str] = []
    try:
        _check_fleet_settings()
        settings = get_settings()
        found = [] if role == "build" else node_gpus(target, gpus)
        if found:
            reason = missing_gpus(found)
            if reason:
                raise FleetError(reason)
            said.append(f"GPU {','.join(str(gpu.index) for gpu in found)} ({found[0].target}) visible")
        reason = health.check(settings.cache_dir)
        if reason:
            raise FleetError(reason)
        sandbox.require()
        sandbox.account()  # an unusable FLEET_WORKLOAD_USER
        said.append(f"{sandbox.mode()} sandbox starts")
        check_database()
        said.append(f"database {redact(settings.database_url)} answers")
        check_broker()  # an embedded broker is started by the workers themselves: nothing to ask yet
        embedded = settings.embedded_broker or settings.broker_url.startswith("filesystem://")
        said.append(f"broker {redact(settings.broker_url)} {'is local' if embedded else 'answers'}")
    except FleetError as error:
        # One line whatever the driver said: a probe's output is shown as an event's message.
        raise FleetError("worker check failed: " + " ".join(str(error).split())) from None
    return "worker check ok: " + ", ".join(said)


def _check_fleet_settings() -> None:
    """Refuse a worker that would serve a fleet's broker from a database of its own."""
    from fleet.errors import ConfigurationError
    from fleet.settings import get_settings

    settings = get_settings()
    if settings.embedded_database and not settings.embedded_broker:
        raise ConfigurationError(
            "FLEET_BROKER_URL names a fleet's broker but no FLEET_DATABASE_URL (or FLEET_DATABASE_URL_FILE) is set: "
            "a worker needs the fleet's database, not one of its own"
        )


def _check_workload_account() -> None:
    """Refuse a node where the sandbox cannot start, or an unusable ``FLEET_WORKLOAD_USER``; say what isolates
    the workloads, on every start."""
    from fleet.settings import get_settings, secrets_in_environment
    from fleet.workers import sandbox

    sandbox.require()
    account = sandbox.account()
    click.echo(f"fleet: {sandbox.describe()}", err=True)
    given = secrets_in_environment()
    if given and not get_settings().embedded:
        # Fine on one's own machine; on a shared node, a process environment is the wrong place for a password.
        click.echo(
            f"fleet: warning: {' and '.join(given)} given in the environment: on a shared node give "
            f"{' and '.join(f'{name}_FILE' for name in given)} instead (a file only this account reads)",
            err=True,
        )
    if sandbox.mode() == "none" and account is None and os.geteuid() == 0:
        click.echo(
            "fleet: warning: the workers run as root, and so would the workloads, which could then read this "
            "node's secrets: set FLEET_WORKLOAD_USER to an unprivileged account",
            err=True,
        )


def _serve(launcher: Any, stop_timeout: float = 840.0) -> None:
    def stop(signum: int, _frame: Any) -> None:
        launcher.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    launcher.start()
    try:
        launcher.supervise()
    finally:
        launcher.stop(timeout=stop_timeout)


@click.command()
@click.option(
    "--local",
    is_flag=True,
    help="Run embedded: a private broker and this machine's workers (the default with no FLEET_*_URL set).",
)
@click.option("--target", help="Target of the local workers (default: this machine's).")
@click.option("--eval-procs", type=click.IntRange(1), default=1, show_default=True, help="Evaluation processes.")
def up(local: bool, target: str | None, eval_procs: int) -> None:
    """Start an embedded fleet in the foreground (Ctrl-C stops it); `fleet tune --no-local` then uses it."""
    import time

    from fleet.errors import ConfigurationError
    from fleet.local import LocalFleet
    from fleet.workers.gpus import cpu_target

    settings = get_settings()
    if not (local or settings.embedded):
        raise ConfigurationError(
            "FLEET_DATABASE_URL and FLEET_BROKER_URL are set, so there is no embedded fleet to start: "
            "give --local to start this machine's workers on them anyway, or run `fleet worker` on each node"
        )
    fleet = LocalFleet(settings, target or cpu_target(), eval_procs=eval_procs)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with fleet:
        click.echo(
            f"fleet up: database {redact(settings.database_url)}, broker {redact(settings.broker_url)}; Ctrl-C stops it"
        )
        try:
            while not stopping:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


@click.group(cls=WholeHelpGroup)
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the database (FLEET_DATABASE_URL)."""
    store = open_store(check=False)
    revision = store.upgrade()
    click.echo(f"database {store.display_url} is at revision {revision}")


@db.command("revision")
def db_revision() -> None:
    """Print the database's schema revision and the latest one."""
    store = open_store(check=False)
    click.echo(f"{store.revision() or 'none'} (latest {store.head()})")


@click.group(cls=WholeHelpGroup)
def team() -> None:
    """Teams of submitters on PostgreSQL: each sees and steers its own campaigns only, even through its own psql.

    Run as the database's owner with CREATEROLE, or a superuser (`fleet team service` needs one).
    """


_PASSWORD = click.option("--password-stdin", is_flag=True, help="Set the login's password to the line on stdin.")


def _password(given: bool) -> str | None:
    if not given:
        return None
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        from fleet.errors import ConfigurationError

        raise ConfigurationError("--password-stdin: no password on stdin")
    return line


@team.command("add")
@click.argument("name")
def team_add(name: str) -> None:
    """Make NAME a team: a PostgreSQL role no one logs in as, whose members submit and read its campaigns."""
    open_store().add_team(name)
    click.echo(f"team {name}: add its submitters with `fleet team member {name} LOGIN`")


@team.command("member")
@click.argument("name")
@click.argument("login")
@_PASSWORD
def team_member(name: str, login: str, password_stdin: bool) -> None:
    """Let LOGIN (a PostgreSQL login, created when missing) submit for team NAME."""
    created = open_store().add_member(name, login, _password(password_stdin))
    click.echo(f"{'created login' if created else 'login'} {login}, a member of team {name}")


@team.command("service")
@click.argument("login")
@_PASSWORD
def team_service(login: str, password_stdin: bool) -> None:
    """Make LOGIN (created when missing) the workers' and drivers' role: every campaign's rows, no schema changes."""
    created = open_store().add_service(login, _password(password_stdin))
    click.echo(f"{'created login' if created else 'login'} {login}: workers and drivers act for every team with it")


@team.command("list")
def team_list() -> None:
    """Each team, its members and how many campaigns it owns."""
    rows = open_store(read_only=True).teams()
    if not rows:
        click.echo("no teams: every login that reaches the database reads every campaign (`fleet team add NAME`)")
    for row in rows:
        click.echo(f"{row.name}  {row.campaigns} campaigns  members: {', '.join(row.members) or 'none'}")


COMMANDS = (worker, up, db, team)
