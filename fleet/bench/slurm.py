"""``fleet bench slurm``: a campaign on workers that Slurm launches, scales and ends at their wall time (issue 40).

On a Slurm cluster of this machine (:mod:`fleet.ops.slurm_cluster`: ``slurmctld`` and one ``slurmd`` per node, each
node with one fake GPU), a private PostgreSQL and Redis, and a campaign of short trials whose every value is known
from its configuration (the chaos bench's: a run prints ``b * 1000 + r``, its build's knob read back from the
artifact), driven by ``fleet tune``:

- once the driver has queued its first trials, ``fleet slurm submit --jobs N`` submits a job for each of the N nodes;
- ``fleet slurm scale --min N --max N`` then keeps N jobs, submitting a replacement for each job that leaves (of
  ``--scale-time``, by default ``--time`` too);
- every job has a short ``--time``: Slurm's warning (``--signal``) comes ``--drain`` seconds before the wall time, the
  job's workers drain and exit, and the job ends mid-campaign; one still running at its wall time is killed.

Slurm looks at its jobs' time limits 30 s after slurmctld starts and every 30 s after (its ``PERIODIC_TIMEOUT``), and
sends the warning, once, to the job's steps at the first look that finds the job within ``--drain`` plus those 30 s
of its end: a job of ``--time 2`` and ``--drain 30`` gets it between 60 and 90 s after it started, one of
``--time 1`` at the first look after it started. The cluster is started once the driver has queued trials, just
before the submission, so that the first look never comes before a job's ``srun`` step (whose workers it warns).

The figures, each against its goal: seconds from the submission to the first trial evaluated on a Slurm-launched
worker (its measurement recorded, on the database's clock); trials lost, duplicated (measured twice or proposed
twice), wrong-valued and stuck (:func:`fleet.bench.chaos.tally`); the wall-time expiries: jobs that ended before the
campaign did, drained after the warning (``COMPLETED``) or killed at the limit (``TIMEOUT``), read from Slurm's job
completion log (the scaler never cancels a job here, nor does the bench before the campaign ends, so nothing else
ends a job then but a failure, counted apart); the Slurm nodes whose workers measured; the campaign's wall time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fleet.bench.chaos import campaign_spec, planned_configs, tally
from fleet.bench.partition import now
from fleet.bench.servers import private_servers
from fleet.errors import FleetError, NotFound
from fleet.ops.slurm import SlurmError
from fleet.ops.slurm_cluster import SlurmCluster, check_host, new_cluster

# Leases of seconds, so that a measurement killed with its job at the wall time comes back soon; the mechanisms are
# the production ones.
SETTINGS = {
    "FLEET_LEASE_SECONDS": "10",
    "FLEET_HEARTBEAT_SECONDS": "2",
    "FLEET_REQUEUE_SECONDS": "20",
    "FLEET_DRIVER_LEASE_SECONDS": "10",
    "FLEET_MAX_ATTEMPTS": "3",
}
TARGET = "sm_90"
BUILD_SECONDS = 0.1  # a build is a tenth of the trials; short, so that the first trial waits little on it
FIRST_TRIAL_GOAL_S = 15.0
AT_WALL_TIME = ("COMPLETED", "TIMEOUT")  # drained after Slurm's warning, or killed at the limit


@dataclass
class Bench:
    """One run's cluster, environment, store and processes (the driver, the scaler)."""

    workdir: Path
    cluster: SlurmCluster
    env: dict[str, str]
    store: Any
    trials: int
    name: str = field(default_factory=lambda: f"slurm-{uuid.uuid4().hex[:6]}")
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    campaign_id: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def spawn(self, name: str, *args: str) -> None:
        """``fleet ARGS`` in the background, its output in ``<name>.log`` (stdout in ``<name>.out``)."""
        with (self.workdir / f"{name}.log").open("ab") as err, (self.workdir / f"{name}.out").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "fleet.cli", *args], env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True,
            )  # fmt: skip

    def fleet(self, *args: str) -> str:
        """``fleet ARGS``, waited for; its output, or :class:`SlurmError` with its last line."""
        done = subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args], env=self.env, cwd=self.workdir, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SlurmError(f"fleet {' '.join(args[:2])} failed: {(done.stderr.strip() or '?').splitlines()[-1]}")
        return done.stdout

    def poll(self) -> int:
        """Read the campaign's trial counts; how many trials it has."""
        if self.campaign_id is None:
            with contextlib.suppress(NotFound):  # the driver has not created it yet
                self.campaign_id = self.store.campaign(self.name).id
        if self.campaign_id is not None:
            self.counts = self.store.trial_counts(self.campaign_id)
        return sum(self.counts.values())

    def progress_line(self) -> str:
        ended = self.cluster.ended_jobs()
        expired = sum(job.get("JobState") in AT_WALL_TIME for job in ended)
        return (
            f"{time.monotonic() - self.started:5.0f} s  {self.counts.get('evaluated', 0)}/{self.trials} evaluated, "
            f"{len(self.cluster.live_jobs())} jobs live, {len(ended)} ended ({expired} at their wall time)"
        )

    def stop(self) -> None:
        """The driver and the scaler, then the jobs (their idle workers drain in a moment), waited for."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(SlurmError):
            jobs = self.cluster.live_jobs()
            if jobs:
                self.cluster.run("scancel", *jobs)
            deadline = time.monotonic() + 30
            while self.cluster.live_jobs() and time.monotonic() < deadline:
                time.sleep(0.5)
        self.store.close()


def _environment(stack: ExitStack, workdir: Path, cluster: SlurmCluster) -> dict[str, str]:
    """This run's servers, settings and cluster only: the environment's own ``FLEET_*`` settings are left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | SETTINGS | cluster.env
    private_servers(stack, workdir, env)
    env |= {"FLEET_HOME": str(workdir / "home"), "FLEET_LOG_DIR": str(workdir / "logs"), "PYTHONUNBUFFERED": "1"}
    return env


def run(
    trials: int = 200,
    *,
    nodes: int = 3,
    seconds: float = 1.5,
    wall: str = "2",
    drain: int = 30,
    scale_wall: str | None = None,
    window: int = 6,
    expiries: int = 2,
    timeout: float = 900.0,
    keep: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The whole run; its figures, ``ok`` when nothing was lost, duplicated, wrong or stuck, no job failed and at
    least ``expiries`` jobs ended at their wall time, and ``goals_met`` when every goal was met besides.

    Parameters
    ----------
    nodes:
        Slurm nodes, one GPU each, and jobs kept at once: one job of one node and GPU on each.
    seconds:
        How long each run of the workload sleeps (builds: 0.1 s).
    wall, drain:
        The jobs' ``--time`` and ``--drain``, as ``fleet slurm submit`` takes them.
    scale_wall:
        The ``--time`` of the replacements ``fleet slurm scale`` submits, by default ``wall``: a longer one lets a
        short run see the first jobs end and their replacements finish the campaign.
    window:
        The driver's trials in flight.
    expiries:
        Wall-time expiries the run must see mid-campaign: with fewer, it did not show what it is for.
    timeout:
        Seconds the campaign may take before its unfinished trials count as stuck.
    keep:
        Keep the working directory (logs, job scripts, Slurm's logs) even when the run passes.
    """
    say = say or (lambda _: None)
    check_host()
    workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-slurm-"))
    wall_start, load = time.monotonic(), round(os.getloadavg()[0], 1)
    result: dict[str, Any] = {}
    with ExitStack() as stack:
        # Started once the driver has queued trials (see _campaign); stopped last, after the bench's jobs ended.
        cluster = new_cluster(nodes, gpus_per_node=1, directory=workdir / "slurm")
        stack.callback(cluster.stop)
        env = _environment(stack, workdir, cluster)
        from fleet.store import Store

        store = Store(env["FLEET_DATABASE_URL"])
        store.upgrade()
        bench = Bench(workdir, cluster, env, store, trials)
        stack.callback(bench.stop)
        scale_wall = scale_wall or wall
        say(f"{trials} trials on {nodes} Slurm nodes, jobs of --time {wall} (replacements {scale_wall}) "
            f"--drain {drain}; work directory {workdir}")  # fmt: skip
        jobs = (["--time", wall, "--drain", str(drain)], ["--time", scale_wall, "--drain", str(drain)])
        result = _campaign(bench, nodes=nodes, seconds=seconds, jobs=jobs, window=window, timeout=timeout, say=say)
        result["settings"] = SETTINGS | {
            "nodes": nodes, "gpus_per_node": 1, "measure_s": seconds, "build_s": BUILD_SECONDS, "time": wall,
            "scale_time": scale_wall, "drain_s": drain, "window": window, "expiries_wanted": expiries,
            "timeout_s": timeout,
        }  # fmt: skip
    result["wall_s"] = round(time.monotonic() - wall_start, 1)
    result["load_average"] = [load, round(os.getloadavg()[0], 1)]  # other work on the machine slows the figures
    result |= _verdict(result, nodes, expiries)
    if keep or not result["ok"]:
        result["work_directory"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _campaign(
    bench: Bench,
    *,
    nodes: int,
    seconds: float,
    jobs: tuple[list[str], list[str]],
    window: int,
    timeout: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Start the driver, submit the jobs once it has queued trials, scale until it exits; the figures.

    ``jobs``: the options of the jobs submitted first (``--time``, ``--drain``), then of their replacements."""
    spec = bench.workdir / "campaign.json"
    spec.write_text(json.dumps(campaign_spec(bench.name, TARGET, bench.trials, seconds, BUILD_SECONDS)))
    planned = planned_configs(spec, bench.trials)
    bench.started = time.monotonic()
    bench.spawn("driver", "tune", str(spec), "--json", "--window", str(window))
    _wait(bench.poll, 120, "the driver to queue its first trials")
    # Slurm looks at time limits 30 s after slurmctld starts, then every 30 s: started now, its first look comes
    # when the jobs' workers run, never before a job's srun step exists (a warning then would reach no worker).
    bench.cluster.start()
    first, replacements = (["--target", TARGET, *options] for options in jobs)
    submitted_at = now(bench.store)
    said = bench.fleet("slurm", "submit", *first, "--jobs", str(nodes))
    say(f"{time.monotonic() - bench.started:5.0f} s  {' '.join(said.split()[:3])}... ({nodes} jobs)")
    bench.spawn("scale", "slurm", "scale", *replacements, "--min", str(nodes), "--max", str(nodes), "--interval", "1")
    status = _watch(bench, bench.started + timeout, say)
    campaign_s = time.monotonic() - bench.started
    ended = bench.cluster.ended_jobs()  # before the bench cancels any job
    live = bench.cluster.live_jobs()
    counts = tally(bench.store, bench.campaign_id, planned, ended=status is not None)
    counts.pop("snapshot")
    return (
        counts
        | _measured(bench, submitted_at)
        | _jobs(ended, live)
        | {"driver_exit_status": status, "campaign_s": round(campaign_s, 1)}
    )


def _watch(bench: Bench, deadline: float, say: Callable[[str], None]) -> int | None:
    """A progress line every 5 s until the driver exits; its exit status, or None when it ran out of time (it is
    killed then, and what is unfinished is stuck)."""
    driver = bench.procs["driver"]
    last = time.monotonic()
    while driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            with contextlib.suppress(FleetError):  # a line missed is no failure
                bench.poll()
                say(bench.progress_line())
    status = driver.poll()
    if status is None:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    bench.poll()
    say(bench.progress_line())
    return status


def _measured(bench: Bench, submitted_at: datetime) -> dict[str, Any]:
    """Where and when the campaign's trials were measured: the seconds from the submission to the first evaluation
    worker's start and to the first trial's measurement, the Slurm nodes and jobs that measured, and any measurement
    by a worker that was not Slurm's."""
    from sqlalchemy import select

    from fleet.store import Measurement, Trial

    with bench.store.session() as session:
        rows = session.execute(
            select(Measurement.worker, Measurement.created_at)
            .join(Trial, Trial.id == Measurement.trial_id)
            .where(Trial.campaign_id == bench.campaign_id)
        ).all()
    # A Slurm-launched worker is named <role>@<Slurm node>.slurm-<job> (fleet.ops.slurm.node_name).
    where = [(worker or "").rpartition("@")[2].partition(".slurm-") for worker, _ in rows]
    first = min((created for _, created in rows), default=None)
    workers = [w.started_at for w in bench.store.workers(target=TARGET, role="eval") if ".slurm-" in w.name]

    def after(moment: datetime | None) -> float | None:
        return None if moment is None else round((moment - submitted_at).total_seconds(), 1)

    return {
        "first_worker_s": after(min(workers, default=None)),
        "first_trial_s": after(first),
        "measured_by_node": dict(sorted(Counter(node for node, slurm, _ in where if slurm).items())),
        "jobs_that_measured": len({job for _, slurm, job in where if slurm}),
        "not_on_slurm": sum(not slurm for _, slurm, _ in where),
    }


def _jobs(ended: list[dict[str, str]], live: list[str]) -> dict[str, Any]:
    """The jobs that ended while the campaign ran, by how they ended, and the jobs there were in all."""
    states = Counter(job.get("JobState", "?") for job in ended)
    return {
        "expiries": sum(states[state] for state in AT_WALL_TIME),
        "jobs_failed": sum(n for state, n in states.items() if state not in AT_WALL_TIME),
        "jobs_ended_by_state": dict(states),
        "jobs": len(ended) + len(live),
    }


def _verdict(result: dict[str, Any], nodes: int, expiries: int) -> dict[str, bool]:
    zero = ("lost", "duplicated", "wrong_valued", "stuck", "jobs_failed", "not_on_slurm")
    ok = (
        "lost" in result
        and not any(result[key] for key in zero)
        and result["expiries"] >= expiries
        and result["driver_exit_status"] == 0
    )
    first = result.get("first_trial_s")
    met = ok and first is not None and first < FIRST_TRIAL_GOAL_S and len(result["measured_by_node"]) == nodes
    return {"ok": ok, "goals_met": met}


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SlurmError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def print_result(result: dict[str, Any]) -> None:
    """Each figure against its goal, then whether the run passed and met them."""
    settings = result["settings"]
    first = result["first_trial_s"]
    rows = [
        ("first trial after submission", "-" if first is None else f"{first} s", f"under {FIRST_TRIAL_GOAL_S:g} s"),
        ("  of which a worker's start", f"{result['first_worker_s']} s", "-"),
        ("trials evaluated", f"{result['recorded']} of {result['trials_planned']}", "all"),
        *((f"trials {key.replace('_', '-')}", str(result[key]), "0") for key in ("lost", "duplicated")),
        *((f"trials {key.replace('_', '-')}", str(result[key]), "0") for key in ("wrong_valued", "stuck")),
        ("trials measured again", str(result["measured_again"]), "- (given back by a job that ended)"),
        ("wall-time expiries", str(result["expiries"]), f"at least {settings['expiries_wanted']}"),
        ("jobs failed", str(result["jobs_failed"]), "0"),
        ("jobs in all", str(result["jobs"]), "-"),
        ("nodes that measured", str(len(result["measured_by_node"])), str(settings["nodes"])),
        ("measured off Slurm", str(result["not_on_slurm"]), "0"),
        ("campaign", f"{result['campaign_s']} s", "-"),
        ("wall", f"{result['wall_s']} s", "-"),
    ]
    click.echo(f"{'figure':<30} {'value':>12}  goal")
    for name, value, goal in rows:
        click.echo(f"{name:<30} {value:>12}  {goal}")
    click.echo(f"jobs ended by state: {result['jobs_ended_by_state']}; measured by node: {result['measured_by_node']}")
    click.echo(f"load average (1 min) at the start and the end: {result['load_average']}")
    click.echo("goals met" if result["goals_met"] else "goals NOT met")


@click.command("slurm")
@click.option("--trials", type=click.IntRange(10), default=200, show_default=True, help="Trials of the campaign.")
@click.option("--nodes", type=click.IntRange(1), default=3, show_default=True, help="Slurm nodes, and jobs at once.")
@click.option("--seconds", type=click.FloatRange(0), default=1.5, show_default=True, help="How long each run sleeps.")
@click.option("--time", "wall", default="2", show_default=True, help="The jobs' wall time, as sbatch takes it.")
@click.option(
    "--drain", type=click.IntRange(1), default=30, show_default=True, help="Seconds before it the workers drain."
)
@click.option("--scale-time", "scale_wall", help="The wall time of the replacements scaling submits (default: --time).")
@click.option("--window", type=click.IntRange(1), default=6, show_default=True, help="The driver's trials in flight.")
@click.option(
    "--expiries", type=click.IntRange(0), default=2, show_default=True, help="Wall-time expiries the run must see."
)
@click.option(
    "--timeout", type=click.FloatRange(60), default=900.0, show_default=True, help="Seconds before trials count stuck."
)
@click.option("--keep", is_flag=True, help="Keep the work directory (logs) even when the run passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def slurm_bench_command(
    trials: int, nodes: int, seconds: float, wall: str, drain: int, scale_wall: str | None, window: int,
    expiries: int, timeout: float, keep: bool, as_json: bool,
) -> None:  # fmt: skip
    """A campaign on workers that Slurm launches, scales and ends at their wall time.

    On a Slurm cluster of this machine (slurmctld and --nodes slurmd nodes with a fake GPU each) and a private
    PostgreSQL and Redis: once the driver has queued trials, `fleet slurm submit` submits a job per node and
    `fleet slurm scale` keeps that many, replacing each job that ends; the jobs' short --time ends them
    mid-campaign. Prints, each against its goal: seconds from the submission to the first trial evaluated on a
    Slurm-launched worker (goal: under 15 s); trials lost, duplicated, wrong-valued, stuck (0); wall-time expiries
    (at least --expiries), from Slurm's job completion log; failed jobs (0); nodes that measured; the campaign's
    wall time. Exits 1 unless the counts that must be 0 are and the expiries were seen. Needs root and
    scripts/install-services's Slurm.
    """
    # SIGTERM unwinds like Ctrl-C: the jobs, the cluster and the servers are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run(
            trials, nodes=nodes, seconds=seconds, wall=wall, drain=drain, scale_wall=scale_wall, window=window,
            expiries=expiries, timeout=timeout, keep=keep, say=lambda line: click.echo(line, err=True),
        )  # fmt: skip
    except SlurmError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(result, default=str))
    else:
        print_result(result)
    if not result["ok"]:
        raise click.ClickException(f"the Slurm run failed; logs kept in {result.get('work_directory')}")
