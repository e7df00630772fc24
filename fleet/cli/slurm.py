"""``fleet slurm``: workers launched by Slurm (``submit``), scaled by queue depth (``scale``), started on a node
(``node``, which the job's script runs). What they do lives in :mod:`fleet.ops.slurm`."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from fleet.cli._sections import WholeHelpGroup


def _job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say what one job asks for, shared by ``submit`` and ``scale``."""
    options = [
        click.option("--target", required=True, help="Target the workers serve, e.g. sm_90 (the job's GPUs' arch)."),
        click.option("--nodes", type=click.IntRange(1), default=1, show_default=True, help="Nodes per job."),
        click.option("--gpus-per-node", type=click.IntRange(1), default=1, show_default=True, help="GPUs per node."),
        click.option("--time", "wall", default="4:00:00", show_default=True, help="Wall time, as sbatch takes it."),
        click.option("--partition", help="Slurm partition."),
        click.option("--account", help="Slurm account to charge."),
        click.option(
            "--drain",
            type=click.IntRange(1),
            help="Seconds before the wall time at which the workers drain (default 300, or a quarter of --time).",
        ),
        click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- SBATCH OPTIONS...]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _job(target: str, nodes: int, gpus_per_node: int, wall: str, partition: str | None, account: str | None,
         drain: int | None, extra: tuple[str, ...]) -> Any:  # fmt: skip
    from fleet.ops.slurm import SlurmJob

    job = SlurmJob(target, nodes, gpus_per_node, wall, partition, account, drain, tuple(extra))
    job.check()
    return job


def _shared() -> None:
    """Refuse a database or broker that Slurm's nodes cannot share before anything is written or submitted."""
    from fleet.ops.slurm import shared_services
    from fleet.settings import get_settings

    warning = shared_services(get_settings())
    if warning:
        click.echo(f"fleet: {warning}", err=True)


def _folder() -> Path:
    from fleet.settings import get_settings

    return get_settings().home / "slurm"


def _script(job: Any) -> str:
    from fleet.ops.slurm import forwarded, script, secret_files

    folder = _folder()
    env = forwarded(os.environ) | secret_files(os.environ, folder / "secrets")
    return script(job, env=env, output=(folder / "logs").absolute())


def _submitter(job: Any) -> Callable[[], str]:
    from fleet.ops.slurm import submit

    def one() -> str:
        (_folder() / "logs").mkdir(parents=True, exist_ok=True)
        return submit(_script(job), _folder() / "scripts", job, os.environ)

    return one


@click.group(cls=WholeHelpGroup)
def slurm() -> None:
    """Workers launched by Slurm: submit jobs of them, scale them by queue depth."""


@slurm.command("submit", context_settings={"ignore_unknown_options": False})
@_job_options
@click.option("--print", "show", is_flag=True, help="Print the sbatch script instead of submitting it.")
@click.option("--jobs", "count", type=click.IntRange(1), default=1, show_default=True, help="Jobs to submit.")
@click.option(
    "--array",
    metavar="N[%M]",
    help="Submit each as a job array of N jobs, at most M of them running at once (sbatch --array=0-N-1%M).",
)
def submit_command(show: bool, count: int, array: str | None, **options: Any) -> None:
    """Submit Slurm jobs that run `fleet worker` on the GPUs Slurm allocates, and drain before the wall time.

    The script is kept under $FLEET_HOME/slurm/scripts/ and the jobs' logs under $FLEET_HOME/slurm/logs/; the
    fleet's URLs reach the jobs as 0600 files (FLEET_*_URL_FILE), never in the script or its environment.
    """
    job = replace(_job(**options), array=array)
    job.check()
    _shared()
    if show:
        click.echo(_script(job), nl=False)
        return
    submit = _submitter(job)
    each = f"{job.nodes} node(s) x {job.gpus_per_node} GPU(s)"
    for _ in range(count):
        if array:
            click.echo(f"submitted job array {submit()} ({job.name}: {job.elements()} jobs of {each})")
        else:
            click.echo(f"submitted job {submit()} ({job.name}: {each})")


@slurm.command("scale")
@_job_options
@click.option("--min", "low", type=click.IntRange(0), default=0, show_default=True, help="Jobs kept at least.")
@click.option("--max", "high", type=click.IntRange(1), required=True, help="Jobs pending or running at most.")
@click.option(
    "--cooldown",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds the queues must stay short before jobs are cancelled.",
)
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds between passes."
)
@click.option("--once", is_flag=True, help="One pass and exit (from cron).")
def scale_command(low: int, high: int, cooldown: float, interval: float, once: bool, **options: Any) -> None:
    """Submit or cancel jobs of --target's workers as its queues grow and empty, like dask-jobqueue's adapt().

    Each pass counts the target's queued messages and its jobs (by their name, fleet-TARGET): it submits jobs up to
    one evaluation worker per message (at least one while a campaign runs on the target, at most --max), and
    cancels jobs beyond that once the queues stayed short for --cooldown seconds; a running job's workers drain.
    """
    from fleet.cli._common import open_store
    from fleet.ops.slurm import Scaler, demand
    from fleet.settings import get_settings

    if low > high:
        raise click.UsageError(f"--min {low} is more than --max {high}")
    job = _job(**options)
    _shared()
    settings = get_settings()
    store = open_store()
    state = _folder() / f"scale-{job.target.replace(':', '-')}.json"
    scaler = Scaler(job, low, high, cooldown, state, submit_job=_submitter(job))
    stopping: list[int] = []
    if not once:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        while not stopping:
            messages, running = demand(store, job.target, settings)
            click.echo(scaler.step(messages, running))
            if once:
                break
            deadline = time.monotonic() + interval
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.2, interval))
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


@slurm.command("node", hidden=True)
@click.option("--target", required=True)
@click.option("--stop-timeout", type=click.FloatRange(min=0, min_open=True), required=True)
def node_command(target: str, stop_timeout: float) -> None:
    """Start `fleet worker` on this node's allocated GPUs (run by the job's srun, once per node)."""
    from fleet.ops.slurm import node_name, worker_argv

    argv = worker_argv(target, os.environ, stop_timeout)
    os.environ["FLEET_NODE_NAME"] = node_name(os.environ)
    sys.stdout.flush()
    # exec: the SIGTERM Slurm sends before the wall time reaches the worker's launcher itself.
    os.execv(argv[0], argv)


COMMANDS = (slurm,)
