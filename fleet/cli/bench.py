"""``fleet bench``: benchmarks, each against a baseline measured in the same run."""

from __future__ import annotations

import json

import click

from fleet.bench.search import search_command
from fleet.bench.tvm import tvm_bench_command
from fleet.cli._sections import WholeHelpGroup


@click.group(cls=WholeHelpGroup)
def bench() -> None:
    """Benchmarks, each against a baseline measured in the same run (`make bench` runs them all)."""


@bench.command("dispatch")
@click.option("--trials", type=click.IntRange(10), default=2000, show_default=True, help="Trials per side.")
@click.option(
    "--rounds", type=click.IntRange(1), default=5, show_default=True, help="Turns each side takes; medians are kept."
)
@click.option("--json", "as_json", is_flag=True, help="Print {fleet_trials_per_s, celery_trials_per_s, ratio}.")
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
    click.echo(f"fleet  {result['fleet_trials_per_s']:>8.1f} trials/s  (build + evaluate + all bookkeeping)")
    click.echo(f"celery {result['celery_trials_per_s']:>8.1f} trials/s  (bare two-task chain, same broker)")
    click.echo(f"ratio  {result['ratio']:>8.3f}")


@bench.command("share")
@click.option("--trials", type=click.IntRange(8), default=40, show_default=True, help="Trials per campaign.")
@click.option("--seconds", type=click.FloatRange(0.05), default=0.25, show_default=True, help="Each measurement.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_share(trials: int, seconds: float, as_json: bool) -> None:
    """Campaigns sharing a target by priority (1:1, 3:1), driver takeover after SIGKILL, cancel latency.

    Two evaluation slots, `fleet driver` processes and a workload that sleeps; each campaign's share of the
    evaluations in the first half of the run (goals 50% and 75% ± 10%), the seconds until another driver holds
    a campaign whose driver was killed (goal: lease + 10 s), the seconds after a cancel until the last trial
    started (goal: under 5 s). Uses FLEET_DATABASE_URL and FLEET_BROKER_URL when set, else private servers.
    """
    from fleet.bench.share import run

    result = run(trials, seconds, on_step=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"equal priorities  {result['equal_share_first_half']:.0%} of the first half (goal 50% ± 10%)")
    click.echo(f"weights 3:1       {result['weighted_3_1_share_first_half']:.0%} of the first half (goal 75% ± 10%)")
    click.echo(f"driver takeover   {result['takeover_s']:.1f} s (goal: lease {result['lease_s']} s + 10 s at most)")
    click.echo(f"cancel            last trial started {result['cancel_last_start_s']:.1f} s after (goal: under 5 s)")
    click.echo(f"                  running measurements killed after {result['cancel_stopped_s']:.1f} s (goal: 10 s)")


bench.add_command(search_command, "search")
bench.add_command(tvm_bench_command, "tvm")

COMMANDS = (bench,)
