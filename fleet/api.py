"""The Python API: describe a campaign, submit it, run or watch it, ask for the best.

import fleet
spec = fleet.load_spec("examples/matmul-c/spec.json")      # or build a fleet.CampaignSpec by hand
campaign = fleet.submit(spec)
summaries = fleet.run(campaign)                            # drives it; embedded mode starts local workers
fleet.status(campaign)                                     # {"new": 0, "evaluated": 50, ...}
fleet.best(summaries[0].problem_id, campaign.target)       # [(measurement, config)]
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from fleet.campaign import CampaignSpec, Driver, Summary, chains_on_fleet
from fleet.campaign import submit as _submit
from fleet.chains import ChainDriver
from fleet.settings import get_settings
from fleet.store import Campaign, Measurement, Store, TrialResult, connect


def submit(spec: CampaignSpec, store: Store | None = None) -> Campaign:
    """Write the campaign (and its problems and sources); the same spec again returns the same campaign."""
    return _submit(store or connect(), spec)


def run(
    campaign: Campaign | str | int,
    *,
    store: Store | None = None,
    local: bool | None = None,
    window: int | None = None,
    on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> list[Summary]:
    """Drive a campaign to its end (or resume it) and return what it found per problem.

    Parameters
    ----------
    campaign:
        The campaign, its name or its id.
    local:
        Start this machine's workers for the run; by default when running embedded.
    window:
        Trials in flight at once; by default unbounded for static strategies, two per worker otherwise.
    """
    from fleet.local import LocalFleet

    settings = get_settings()
    store = store or connect()
    if not isinstance(campaign, Campaign):
        campaign = store.campaign(campaign)
    local = settings.embedded if local is None else local
    with LocalFleet(settings, campaign.target) if local else nullcontext():
        return driver(store, campaign, window=window, on_progress=on_progress, on_warning=on_warning).run()


STATIC_WINDOW = 1024
"""Trials a static strategy keeps in flight: it needs no results back, so only the broker's memory bounds it."""


def driver(
    store: Store,
    campaign: Campaign,
    *,
    window: int | None = None,
    on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Driver | ChainDriver:
    """A driver for ``campaign`` with the environment's settings and a window that fits the fleet."""
    from fleet.tasks import send, send_steps

    settings = get_settings()
    if chains_on_fleet(campaign.strategy):
        return ChainDriver(
            store,
            campaign,
            send_steps,
            send,
            on_progress=on_progress,
            on_warning=on_warning,
            requeue_seconds=settings.requeue_seconds,
        )
    result = Driver(
        store,
        campaign,
        send,
        on_progress=on_progress,
        on_warning=on_warning,
        max_attempts=settings.max_attempts,
        heartbeat_seconds=settings.heartbeat_seconds,
        requeue_seconds=settings.requeue_seconds,
    )
    if window is not None:
        result.window = window
    elif result.dynamic:
        # Two per evaluation slot: one running, one waiting, so no slot idles while the driver thinks.
        live = store.workers(target=campaign.target, role="eval", within=3 * settings.heartbeat_seconds + 5)
        result.window = max(2, 2 * len(live))
    else:
        result.window = STATIC_WINDOW
    return result


def status(campaign: Campaign | str | int, store: Store | None = None) -> dict[str, int]:
    """Trials of a campaign by state."""
    store = store or connect()
    if not isinstance(campaign, Campaign):
        campaign = store.campaign(campaign)
    return store.trial_counts(campaign.id)


def best(
    problem_id: int, target: str, limit: int = 1, store: Store | None = None
) -> list[tuple[Measurement, dict[str, Any]]]:
    """The best valid measurements of a problem on a target, with their configurations, best first."""
    return (store or connect()).best(problem_id, target, limit)
