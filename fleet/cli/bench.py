"""``fleet bench``: benchmarks, each against a baseline measured in the same run."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import click

from fleet.cli._sections import WholeHelpGroup

ELSEWHERE = {
    "search": "fleet.bench.search:search_command",
    "pareto": "fleet.bench.pareto:pareto_command",
    "history": "fleet.bench.history:bench_history_command",
    "tvm": "fleet.bench.tvm:tvm_bench_command",
    "metaschedule": "fleet.bench.metaschedule:metaschedule_bench_command",
    "sandbox": "fleet.bench.sandbox:sandbox_bench_command",
    "partition": "fleet.bench.nemesis:partition_command",
    "slurm": "fleet.bench.slurm:slurm_bench_command",
    "systemd": "fleet.bench.systemd:systemd_bench_command",
}
"""The benchmarks defined beside their code, imported when one is run or listed: with the whole group every
`fleet` command, `fleet status` among them, would import the benchmarks' modules to start."""


class BenchGroup(WholeHelpGroup):
    """``fleet bench``, whose commands of :data:`ELSEWHERE` are imported when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *ELSEWHERE})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in ELSEWHERE and name not in self.commands:
            module, _, attribute = ELSEWHERE[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)


@click.group(cls=BenchGroup)
def bench() -> None:
    """Benchmarks, each against a baseline measured in the same run (`make bench` runs them all)."""


@bench.command("dispatch")
@click.option("--trials", type=click.IntRange(10), default=2000, show_default=True, help="Trials per side.")
@click.option(
    "--rounds", type=click.IntRange(1), default=5, show_default=True, help="Turns each side takes; medians are kept."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {fleet_trials_per_s, celery_trials_per_s, ratio, fleet_trials_per_message}.",
)
def bench_dispatch(trials: int, rounds: int, as_json: bool) -> None:
    """Trials per second of a no-op workload through the whole fleet, against a bare Celery chain.

    The two take turns (chain first in odd rounds, fleet first in even ones) and the medians are reported.
    Uses FLEET_DATABASE_URL and FLEET_BROKER_URL when set, else a private PostgreSQL and Redis started for the run.
    """
    from fleet.bench.dispatch import run

    def progress(number: int, fleet: float, chain: float) -> None:
        click.echo(
            f"round {number}/{rounds}: fleet {fleet:.1f} trials/s, chain {chain:.1f}, ratio {fleet / chain:.3f}",
            err=True,
        )

    result = run(trials, rounds, on_round=progress)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(
        f"fleet  {result['fleet_trials_per_s']:>8.1f} trials/s  (build + evaluate + all bookkeeping; "
        f"{result['fleet_trials_per_message']:.1f} trials per message)"
    )
    click.echo(f"celery {result['celery_trials_per_s']:>8.1f} trials/s  (bare two-task chain, same broker)")
    click.echo(f"ratio  {result['ratio']:>8.3f}")


@bench.command("share")
@click.option("--trials", type=click.IntRange(8), default=40, show_default=True, help="Trials per campaign.")
@click.option("--seconds", type=click.FloatRange(0.05), default=0.25, show_default=True, help="Each measurement.")
@click.option(
    "--cheap-trials", type=click.IntRange(400), default=8000, show_default=True, help="The cheap campaign joined."
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_share(trials: int, seconds: float, cheap_trials: int, as_json: bool) -> None:
    """Campaigns sharing a target by priority (1:1, 3:1), driver takeover after SIGKILL, cancel latency.

    Two evaluation slots, `fleet driver` processes and a workload that sleeps; each campaign's share of the
    evaluations in the first half of the run (goals 50% and 75% ± 10%); the share of a campaign of cheap
    trials joining one of equal priority, in the second half of their joint run (goal 50% ± 10%); the seconds
    until another driver holds a campaign whose driver was killed (goal: lease + 10 s), the seconds after a
    cancel until the last trial started (goal: under 5 s). Uses FLEET_DATABASE_URL and FLEET_BROKER_URL when
    set, else private servers.
    """
    from fleet.bench.share import run

    result = run(trials, seconds, cheap_trials, on_step=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"equal priorities  {result['equal_share_first_half']:.0%} of the first half (goal 50% ± 10%)")
    click.echo(f"weights 3:1       {result['weighted_3_1_share_first_half']:.0%} of the first half (goal 75% ± 10%)")
    click.echo(
        f"cheap, joining    first back after {result['cheap_joining_first_result_s']:.1f} s; "
        f"{result['cheap_joining_share_first_half']:.0%} of the first half, "
        f"{result['cheap_joining_share_second_half']:.0%} of the second (goal 50% ± 10%)"
    )
    click.echo(f"driver takeover   {result['takeover_s']:.1f} s (goal: lease {result['lease_s']} s + 10 s at most)")
    click.echo(f"cancel            last trial started {result['cancel_last_start_s']:.1f} s after (goal: under 5 s)")
    click.echo(f"                  running measurements killed after {result['cancel_stopped_s']:.1f} s (goal: 10 s)")


def _fault_options(command: Callable[..., None]) -> Callable[..., None]:
    """One option per kind of fault of ``fleet bench chaos``, its default and help from :class:`Faults`."""
    from fleet.bench.chaos import Faults

    for kind in reversed(fields(Faults)):
        option = click.option(
            f"--{kind.name.replace('_', '-')}",
            kind.name,
            type=click.IntRange(0),
            default=kind.default,
            show_default=True,
            help=kind.metadata["help"],
        )
        command = option(command)
    return command


@bench.command("chaos")
@click.option("--trials", type=click.IntRange(20), default=1000, show_default=True, help="Trials of the campaign.")
@_fault_options
@click.option(
    "--seconds", type=click.FloatRange(0), default=0.05, show_default=True, help="How long each build and run sleeps."
)
@click.option(
    "--timeout", type=click.FloatRange(10), default=780.0, show_default=True, help="Seconds before trials count stuck."
)
@click.option(
    "--window",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Trials the driver keeps in flight (with --seconds 0, enough for several trials to a message).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the choice of the pool processes killed.")
@click.option("--keep", is_flag=True, help="Keep the work directory (logs, data) even when the run passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_chaos(
    trials: int, seconds: float, timeout: float, window: int, seed: int, keep: bool, as_json: bool, **faults: int
) -> None:
    """A campaign through a fleet under fire: every trial recorded exactly once, with its right value.

    Two build and two evaluation processes on a private PostgreSQL and Redis; SIGKILLs of pool processes, of
    whole Celery workers, of `fleet worker` with all its workers, Redis and PostgreSQL crashed and started
    again, `fleet tune` killed and resumed. Prints the trials planned, recorded, lost, duplicated, stuck and
    wrong-valued, the faults, the settings and the wall time; exits 1 unless lost, duplicated, stuck and wrong
    are all 0, every fault was injected and the driver ended well.
    """
    from fleet.bench.chaos import Faults, run

    result = run(
        trials,
        Faults(**faults),
        seconds=seconds,
        timeout=timeout,
        window=window,
        seed=seed,
        keep=keep,
        say=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key in ("trials_planned", "recorded", "lost", "duplicated", "stuck", "wrong_valued", "measured_again"):
            click.echo(f"{key:<16} {result[key]}")
        click.echo("faults           " + ", ".join(f"{k} {v}" for k, v in result["faults"].items()))
        stale = result["stale_messages"]
        click.echo(f"stale messages   {stale['left_unacknowledged']} left unacknowledged")
        if "trials_changed_by_their_delivery" in stale:
            changed, queued = stale["trials_changed_by_their_delivery"], stale["still_queued_after_delivery"]
            click.echo(f"                 delivered at the end: {changed} trials changed, {queued} still queued")
        click.echo("settings         " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()))
        click.echo(f"wall time        {result['wall_s']} s (campaign {result['campaign_s']} s)")
    if not result["ok"]:
        where = result.get("work_directory")
        raise click.ClickException(f"the chaos run failed; logs and data kept in {where}")


@bench.command("scale")
@click.option(
    "--trials",
    type=click.IntRange(200),
    default=100_000,
    show_default=True,
    help="Trials of the one campaign; the campaigns run at once have a twentieth of it each.",
)
@click.option("--campaigns", type=click.IntRange(1), default=20, show_default=True, help="Campaigns run at once.")
@click.option(
    "--campaign-trials",
    type=click.IntRange(10),
    help="Trials of each campaign run at once (default: a twentieth of --trials, 5,000).",
)
@click.option(
    "--profile",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Run the one campaign's fleet tune under cProfile and write its statistics to this file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_scale(trials: int, campaigns: int, campaign_trials: int | None, profile: Path | None, as_json: bool) -> None:
    """Whether the fleet's cost stays flat: one campaign of 100,000 no-op trials, then 20 of 5,000 at once.

    For each: trials/s over the first and the last 10,000 trials (goal: the last at least 0.9 of the first), the
    driver process's peak memory (goal: under 300 MB), the seconds of the read commands (`fleet status`, and
    `status`, `best`, `trials --state errored` and `report` of a campaign) on the finished work (goal: under 1 s
    each, beside the same commands on a 100-trial campaign, whose `fleet status` has a goal of under 0.3 s), the
    database's bytes per trial, and where the CPU went over the first and the last
    10,000 (milliseconds per trial of the worker, the driver, the database and the broker; the idle cores).
    One build and one evaluation worker process.
    Uses FLEET_DATABASE_URL and FLEET_BROKER_URL when set, else a private PostgreSQL and Redis started for the run.
    """
    from fleet.bench.scale import run
    from fleet.bench.servers import unwind_on_signals

    unwind_on_signals()
    result = run(
        trials,
        campaigns,
        campaign_trials or max(10, trials // 20),
        profile=profile.absolute() if profile else None,
        on_step=lambda line: click.echo(line, err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    base = result["command_s_baseline"]
    for key, title in (("one_campaign", "one campaign"), ("many_campaigns", f"{campaigns} campaigns at once")):
        phase = result[key]
        window = result["window_trials"][key]
        click.echo(f"{title}: {phase['trials']:,} trials ({phase['driver']})")
        click.echo(
            f"  trials/s   first {window:,} {phase['trials_per_s_first']}, last {window:,} "
            f"{phase['trials_per_s_last']}: {phase['last_over_first']} (goal >= 0.9)"
        )
        if phase["machine_speed_last_over_first"] is not None:
            click.echo(
                f"  machine    speed last / first {phase['machine_speed_last_over_first']} "
                "(a fixed loop's CPU time, each second)"
            )
        first, last = phase["cpu"]["first"], phase["cpu"]["last"]
        if first and last:
            roles = ", ".join(
                f"{role} {ms:.2f} -> {last['cpu_ms_per_trial'].get(role, 0.0):.2f}"
                for role, ms in first["cpu_ms_per_trial"].items()
            )
            click.echo(
                f"  cpu        ms per trial, first -> last: {roles}; the fleet's "
                f"{first['fleet_cpu_ms_per_trial']:.2f} -> {last['fleet_cpu_ms_per_trial']:.2f}; "
                f"idle cores {first['idle_cores']} -> {last['idle_cores']} of {result['cores']}"
            )
        if "campaign_end_s" in phase:
            ends, all_ran = phase["campaign_end_s"], phase["last_over_first_while_all_ran"]
            click.echo(
                f"  campaigns  ended {ends[0]}-{ends[-1]} s in; {phase['campaigns_running_in_last_window']} ran in "
                f"the last {window:,}; the slowest {phase['slowest_campaign_when_first_ended']:.0%} done when "
                f"the first ended" + ("" if all_ran is None else f"; while all ran, last / first {all_ran}")
            )
        click.echo(f"  driver     peak {phase['driver_peak_mb']} MB (goal < 300)")
        for command, seconds in phase["command_s"].items():
            click.echo(f"  {command:<15} {seconds:.2f} s (goal < 1; {base[command]:.2f} s on {base['trials']} trials)")
        click.echo(f"  database   {phase['database_bytes_per_trial']} bytes per trial")
    click.echo(f"small database: fleet status {base['status']:.2f} s on {base['trials']} trials (goal < 0.3)")


@bench.command("pipeline")
@click.option("--quick", is_flag=True, help="One small case only, for a look in seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_pipeline(quick: bool, as_json: bool) -> None:
    """Whether builds and evaluations overlap: makespans of sleep campaigns against their lower bound.

    Builds sleep B seconds and runs R; for several B/R and numbers of build and evaluation slots, the makespan
    of the campaign against its lower bound (the larger of total build time over build slots, and the first
    build plus total evaluation time over evaluation slots; goal: at most 1.1 of it), and beside it the makespan
    of the MITuna order (every build, then every evaluation) measured in the same run. Uses FLEET_DATABASE_URL
    and FLEET_BROKER_URL when set, else a private PostgreSQL and Redis started for the run.
    """
    from fleet.bench.pipeline import CASES, QUICK_CASES, run

    result = run(QUICK_CASES if quick else CASES, on_step=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{'case':<34} {'bound':>7} {'fleet':>7} {'ratio':>6} {'MITuna':>7} {'ratio':>6}  cost per build/run")
    for case in result["cases"]:
        click.echo(
            f"{case['case']:<34} {case['bound_s']:>6.1f}s {case['fleet_s']:>6.1f}s {case['fleet_over_bound']:>6.3f} "
            f"{case['mituna_s']:>6.1f}s {case['mituna_over_bound']:>6.3f}  "
            f"{case['build_overhead_s']:.3f}s/{case['eval_overhead_s']:.3f}s"
        )
    click.echo("goal: fleet at most 1.1 of the bound in every case; the cost per task is beyond its sleep")


COMMANDS = (bench,)
