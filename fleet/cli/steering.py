"""Campaigns as a service: ``fleet submit``, ``cancel``, ``pause`` and ``driver`` (``resume`` is in campaigns)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import database_url, open_store
from fleet.cli.campaigns import find_campaign, note_missing_extras
from fleet.settings import get_settings


@click.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--name", help="Campaign name (default: the spec's name).")
@click.option("--target", help="Target to tune for (default: the spec's, else this machine's CPU).")
@click.option("--budget", type=click.IntRange(1), help="Override the strategy's budget (trials per problem).")
@click.option(
    "--priority",
    type=click.FloatRange(0, min_open=True),
    help="Weight on the target's evaluation slots against other campaigns (default: the spec's, else 1).",
)
@click.option("--remeasure", is_flag=True, help="Measure configurations again even if measured before.")
@click.option(
    "--team",
    envvar="FLEET_TEAM",
    help="The team that owns the campaign, on PostgreSQL ($FLEET_TEAM; default: your login's one team).",
)
def submit(
    spec: Path,
    name: str | None,
    target: str | None,
    budget: int | None,
    priority: float | None,
    remeasure: bool,
    team: str | None,
) -> None:
    """Hand the campaign of SPEC to the fleet's drivers and return at once; `fleet driver` processes run it."""
    from fleet import api
    from fleet.driving.campaign import load_spec

    campaign_spec = load_spec(spec, name=name, target=target, budget=budget)
    if remeasure:
        campaign_spec.options["remeasure"] = True
    note_missing_extras(campaign_spec.strategy, campaign_spec.workload)
    handle = api.submit(campaign_spec, open_store(), priority=priority, team=team)
    campaign = handle.campaign()
    click.echo(
        f"submitted campaign {campaign.name} (id {campaign.id}, priority {campaign.priority:g}"
        f"{f', team {campaign.team}' if campaign.team else ''}) to {database_url()}"
    )
    click.echo(f"watch it: fleet status {campaign.name}; steer it: fleet pause|resume|cancel {campaign.name}")
    if not handle.store.workers(role="driver", within=get_settings().liveness_seconds):
        click.echo(
            "no `fleet driver` is running: start one (it may run anywhere that reaches the database and the broker), "
            f"or drive it from here with `fleet resume {campaign.name}`",
            err=True,
        )


@click.command()
@click.argument("campaign")
def cancel(campaign: str) -> None:
    """Cancel CAMPAIGN: no new trial starts, running builds and measurements are killed, queued work is dropped."""
    store = open_store(read_only=True)
    found = find_campaign(store, campaign)
    counts = store.cancel_campaign(found.id)
    stopped = ", ".join(f"{n} {state}" for state, n in counts.items()) or "none unfinished"
    click.echo(f"cancelled campaign {found.name}: trials cancelled: {stopped}")


@click.command()
@click.argument("campaign")
def pause(campaign: str) -> None:
    """Hold CAMPAIGN: no new trial starts; running ones finish. `fleet resume` goes on."""
    store = open_store(read_only=True)
    found = store.pause_campaign(find_campaign(store, campaign).id)
    click.echo(f"paused campaign {found.name}; running trials finish; `fleet resume {found.name}` goes on")


@click.command()
@click.option("--name", help="This driver's name in `fleet status` (default: driver@HOST:PID).")
@click.option(
    "--max-campaigns",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Campaigns driven at once; more wait for room here or on another driver.",
)
def driver(name: str | None, max_campaigns: int) -> None:
    """Drive submitted campaigns until stopped (SIGTERM or Ctrl-C lets them go for another driver to take)."""
    from fleet.driving.drivers import DriverService

    store = open_store()
    service = DriverService(store, get_settings(), name=name, max_campaigns=max_campaigns, echo=click.echo)

    def stop(_signum: int, _frame: Any) -> None:
        service.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    service.serve()


OPERATIONS = (driver,)
