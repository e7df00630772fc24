"""Operations commands: ``fleet exec``, ``call``, ``logs``, ``flower`` and ``metrics``.

What each does lives in ``fleet.ops``; here are the commands that call it and print what it found.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import format_config, format_value, log_database, open_store
from fleet.errors import ConfigurationError, FleetError, NotFound, SpecError
from fleet.extras import require
from fleet.ops.call import (
    KINDS,
    Kind,
    add_chain,
    adhoc_campaign,
    adhoc_from_spec,
    describe,
    find_problem,
    measured_before,
    new_trial,
    send,
    source_campaign,
    wait,
)
from fleet.ops.flower import flower_argv, is_loopback
from fleet.ops.logs import find_logs, follow, log_dir, select_logs, show, trial_pattern, trial_workers
from fleet.ops.queues import registry
from fleet.ops.remote import fleet_hosts, format_result, run_everywhere
from fleet.settings import get_settings
from fleet.states import FINISHED, ChainState, TrialState


@click.command("exec")
@click.argument("command")
@click.option("--hosts", help="Comma-separated SSH hosts (default: every machine in the machines table).")
@click.option(
    "--node",
    "nodes",
    multiple=True,
    help="Only this machine of the machines table, by the name its workers registered (FLEET_NODE_NAME, else its "
    "host name); repeat it or separate names with commas.",
)
@click.option("--available", is_flag=True, help="Only machines with a live worker.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds the command may run.")
@click.option("--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True)
def exec_command(
    command: str,
    hosts: str | None,
    nodes: tuple[str, ...],
    available: bool,
    timeout: float | None,
    connect_timeout: float,
) -> None:
    """Run COMMAND on every machine over SSH, in parallel, and print each host's output and exit status.

    COMMAND is one string run by the remote user's shell (quote it as you would for ssh). The exit status
    is 0 only when the command exited 0 everywhere; an unreachable host is reported, and the others go on.
    """
    if sum(map(bool, (hosts, nodes, available))) > 1:
        raise click.UsageError("give one of --hosts, --node and --available")
    require("fabric", "fleet exec")
    if not hosts:
        log_database()  # the machines table is read
    names = _names([hosts]) if hosts else fleet_hosts(available=available, nodes=_names(nodes))
    if not names:
        raise FleetError(
            "no machines to run on: none registered"
            + (" with a live worker" if available else "")
            + "; name them with --hosts"
        )
    results = run_everywhere(names, command, timeout=timeout, connect_timeout=connect_timeout)
    for result in results:
        click.echo(format_result(result))
    failed = [r for r in results if not r.ok]
    if failed:
        summary = ", ".join(f"{r.host} ({r.error or f'exit {r.exit_status}'})" for r in failed)
        click.echo(f"fleet exec: failed on {len(failed)} of {len(results)} hosts: {summary}", err=True)
        raise click.exceptions.Exit(1)


def _names(given: list[str] | tuple[str, ...]) -> list[str]:
    """The names in comma-separated ``given`` texts, in order."""
    return [name.strip() for text in given for name in text.split(",") if name.strip()]


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return
    config = format_config(result.get("config", {}))
    head = f"trial {result['trial']} of {result['campaign']}: {result['state']}"
    if result.get("reason"):
        head += f" ({result['reason']})"
    click.echo(head)
    click.echo(f"  config    {config}")
    if "objective" in result:
        value = "-" if result["objective"] is None else f"{result['objective']:.6g}"
        click.echo(f"  {result['objective_name']:<9} {value}" + ("" if result["valid"] else "  (not valid)"))
        click.echo(f"  samples   {', '.join(f'{s:.6g}' for s in result['samples'])}")
        click.echo(f"  measured  on {result['node']} by {result['worker']}")
    if result.get("measured_before") or "measured_by_trial" in result:
        click.echo("  measured before (--remeasure measures it again)")
    elif "artifact" in result and "objective" not in result:
        click.echo(f"  artifact  {result['artifact']['state']} {result['artifact']['digest'] or ''}".rstrip())
    if "chain" in result:
        click.echo(f"  chain {result['chain']} step {result['step']}: accepted {format_value(result['accepted'])}")


@click.command("call")
@click.argument("kind", type=click.Choice(sorted(KINDS)))
@click.option(
    "--problem", "-p", required=True, help="The problem: an id, or a kind with one problem (with --spec: a kind)."
)
@click.option("--target", "-t", help="The target (default: that of the problem's campaign).")
@click.option("--config", "config_json", required=True, help="The configuration, as JSON: '{\"knob\": value}'.")
@click.option("--campaign", help="Take workload and space from this campaign (default: the problem's newest).")
@click.option("--spec", type=click.Path(path_type=Path), help="Take problem, workload and space from this spec file.")
@click.option("--steps", type=click.IntRange(1), default=1, show_default=True, help="anneal-step: steps of the chain.")
@click.option("--remeasure", is_flag=True, help="Measure it again even if this configuration was measured before.")
@click.option("--no-wait", is_flag=True, help="Print the Celery task id and return at once.")
@click.option("--no-send", is_flag=True, help="Only write the trial and print its id (for `celery call`).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def call_command(
    kind: str,
    problem: str,
    target: str | None,
    config_json: str,
    campaign: str | None,
    spec: Path | None,
    steps: int,
    remeasure: bool,
    no_wait: bool,
    no_send: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Send one KIND task for one configuration to its queue, and print its result when it is recorded.

    The trial is written to the ad-hoc campaign `<campaign>.adhoc`, so it is kept like any other: `fleet
    best`, `fleet logs --trial N` and Flower see it.
    """
    from fleet.targets import check_target

    if campaign and spec:
        raise click.UsageError("give --campaign or --spec, not both")
    config = _config_of(config_json)
    if target:
        check_target(target)
    how = KINDS[kind]
    store = open_store()
    # Everything is checked before anything is written.
    adhoc, problem_id = _adhoc_and_problem(store, problem, target, campaign, spec, config)
    target = adhoc.target
    if how.takes == "chain":
        if no_send:
            raise click.UsageError("--no-send writes a trial; anneal-step takes a chain")
        subject = add_chain(store, adhoc, problem_id, config, steps)
        kwargs: dict[str, Any] = {"chain_id": subject, "step": 0, "target": target}
        task, state = how.task, ChainState.RUNNING
    else:
        trial = new_trial(adhoc, problem_id, config)
        before = None if remeasure or no_send else measured_before(store, trial.measure_key)
        if before is not None:  # answered from the database: no trial is written, nothing is sent
            print_result(describe(store, before) | {"measured_before": True}, as_json)
            return
        [(subject, state)] = store.add_trials(adhoc.id, target, [trial], remeasure=remeasure)
        kwargs = {"trial_id": subject, "target": target}
        task = "fleet.compile" if how.builds_first and state == TrialState.NEW else how.task
    if no_send:
        click.echo(json.dumps({"trial": subject, "target": target, "state": state}) if as_json else subject)
        return
    if how.takes == "trial" and state in FINISHED:
        print_result(describe(store, subject), as_json)  # already recorded: nothing to send
        return
    _warn_without_worker(store, target, task)
    task_id = send(task, kwargs)
    if no_wait:
        _print_sent(task_id, task, kwargs, as_json)
        return
    result = _call_result(store, how, subject, timeout)
    print_result(result, as_json)
    if result["state"] == TrialState.ERRORED:
        raise click.exceptions.Exit(1)


def _config_of(config_json: str) -> dict[str, Any]:
    """The configuration ``--config`` gives, which must be a JSON object."""
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as error:
        raise SpecError(f"--config is not valid JSON: {error.msg}") from None
    if not isinstance(config, dict):
        raise SpecError("--config must be a JSON object: '{\"knob\": value}'")
    return config


def _adhoc_and_problem(
    store: Any, problem: str, target: str | None, campaign: str | None, spec: Path | None, config: dict[str, Any]
) -> tuple[Any, int]:
    """The ad-hoc campaign a call's trial goes to, and its problem's id, from ``spec`` or from the problem's
    campaign (``campaign``, or its newest); ``config`` checked against the space."""
    if spec is not None:
        from fleet.driving.campaign import load_spec

        loaded = load_spec(spec, target=target)
        loaded.space.check(config)
        if len([p for p in loaded.problems if p.kind == problem]) != 1:
            raise NotFound(f"{spec} has no problem, or several problems, of kind {problem!r}")
        adhoc = adhoc_from_spec(store, loaded)
        return adhoc, next(p.id for p in store.campaign_problems(adhoc.id) if p.kind == problem)
    from fleet.space import Space

    problem_id = find_problem(store, problem, target).id
    source = source_campaign(store, problem_id, target, campaign)
    Space.from_dict(source.space).check(config)
    return adhoc_campaign(store, source), problem_id


def _warn_without_worker(store: Any, target: str, task: str) -> None:
    """Warn when no live worker of ``target`` takes ``task`` (a build, or an evaluation): it waits in its queue."""
    live = [w for w in store.workers(target=target, within=get_settings().liveness_seconds)]
    if not any(w.role == ("build" if task == "fleet.compile" else "eval") for w in live):
        click.echo(f"fleet: warning: no worker of target {target} is listening; the task waits in its queue", err=True)


def _print_sent(task_id: str, task: str, kwargs: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"task_id": task_id, "task": task, "kwargs": kwargs}))
    else:
        click.echo(task_id)
        click.echo(f"sent {task} {json.dumps(kwargs)}", err=True)


def _call_result(store: Any, how: Kind, subject: int, timeout: float) -> dict[str, Any]:
    """What a call's task recorded, once it has: its trial's, and for a chain its first step's too."""
    done = wait(store, how.until, subject, timeout=timeout)
    if how.takes == "chain":
        if done is None:
            raise FleetError(f"chain {subject} stopped before its first step was recorded")
        return describe(store, done.trial_id) | {"chain": subject, "step": done.step, "accepted": done.accepted}
    return describe(store, subject)


@click.command("logs")
@click.option("--worker", "-w", help="A worker's name (eval-gpu0@node1, or eval-gpu0 on any host).")
@click.option("--trial", type=int, help="Only lines about this trial, in the logs of the workers that ran it.")
@click.option("--follow", "-f", "follow_", is_flag=True, help="Go on printing what is written (Ctrl-C stops).")
@click.option("--lines", "-n", type=click.IntRange(0), default=50, show_default=True, help="Lines of each log.")
@click.option("--list", "list_", is_flag=True, help="List the log files instead.")
def logs_command(worker: str | None, trial: int | None, follow_: bool, lines: int, list_: bool) -> None:
    """Show the logs of this machine's workers (under FLEET_LOG_DIR, default $FLEET_HOME/logs).

    Logs of workers on other machines stay there: read them with `fleet exec` or the fabfile's `logs` task.
    """
    directory = log_dir()
    logs = find_logs(directory)
    if not logs:
        raise NotFound(f"no worker logs under {directory}")
    pattern = None
    if trial is not None:
        store = open_store(read_only=True)
        ran = trial_workers(store, trial)
        store.close()
        pattern = trial_pattern(trial)
        here = [log for log in logs if log.worker in ran]
        if worker is not None:
            here = select_logs(here, worker)
        if not here:
            if not ran:
                raise NotFound(f"no worker has run trial {trial} yet")
            raise NotFound(
                f"trial {trial} ran on {', '.join(ran)}, whose logs are not on this machine: "
                "use `fleet exec` or the fabfile's `logs` task there"
            )
        logs = here
    else:
        logs = select_logs(logs, worker)
        if not logs:
            known = ", ".join(sorted({log.worker for log in find_logs(directory)}))
            raise NotFound(f"no log of a worker {worker!r} under {directory} (there are: {known})")
    if list_:
        for log in logs:
            click.echo(f"{log.worker:<36} {log.role:<6} {log.target:<14} {log.path}")
        return
    show(logs, lines=lines, pattern=pattern)
    if follow_:
        try:
            follow(logs, pattern=pattern)
        except KeyboardInterrupt:
            return


@click.command("flower", context_settings={"ignore_unknown_options": True})
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True, help="Port to listen on.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def flower_command(port: int, address: str, extra: tuple[str, ...]) -> None:
    """Run Flower on Fleet's Celery app: workers, and tasks with their arguments (EXTRA goes to Flower, after --).

    Set FLOWER_BASIC_AUTH=user:password to require a password; it is required beyond loopback.
    """
    if not is_loopback(address) and not os.environ.get("FLOWER_BASIC_AUTH"):
        raise ConfigurationError(f"Flower on {address} would be open to anyone: set FLOWER_BASIC_AUTH=user:password")
    require("flower", "fleet flower")  # else Celery itself would say "No such command 'flower'"
    if not os.environ.get("FLOWER_BASIC_AUTH"):
        # Loopback is every account's of this machine (and a workload's that a spec gave the network): its pages
        # show every task's arguments with no login (only its API asks for one).
        print(
            f"fleet: warning: Flower on {address} asks no password: every account of this machine reads its pages; "
            "set FLOWER_BASIC_AUTH=user:password",
            file=sys.stderr,
        )
    argv = flower_argv(port, address, extra)
    sys.stdout.flush()
    os.execv(argv[0], argv)


@click.command("metrics")
@click.option("--serve", "port", type=click.IntRange(0, 65535), help="Serve the metrics over HTTP on this port.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to serve on.")
def metrics_command(port: int | None, address: str) -> None:
    """Queue health and live workers as Prometheus metrics: printed once, or served at /metrics."""
    require("prometheus_client", "fleet metrics")
    from prometheus_client import generate_latest

    reg = registry(open_store(read_only=True))
    if port is None:
        sys.stdout.write(generate_latest(reg).decode())
        return
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, *_: Any) -> None:  # one line per scrape would flood the service's journal
            pass

    server = make_server(address, port, make_wsgi_app(reg), handler_class=Quiet)
    click.echo(f"fleet metrics on http://{address}:{server.server_port}/metrics", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


COMMANDS = (exec_command, call_command, logs_command, flower_command, metrics_command)
