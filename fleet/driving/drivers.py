"""``fleet driver``: a long-running process that drives the campaigns submitted to the fleet.

It takes each submitted campaign that no live driver holds under a lease in the database, drives it in a
thread of its own (static, dynamic and chain strategies alike), renews the lease while it does, and lets
go when the campaign ends. Several drivers may run: a campaign has at most one live driver, and when a
driver dies, another takes its campaigns once their leases expire. Everything a driver knows is in the
database, so the one that takes over finds the trials written before and measures none twice.

:func:`driver` builds the driver of one campaign with the environment's settings: the service's threads,
:func:`fleet.run` and ``fleet tune`` all drive through it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from fleet.driving.campaign import CampaignBusy, Driver, LeaseLost, Steering, chains_on_fleet
from fleet.driving.chains import ChainDriver
from fleet.driving.pace import SLOT_DEPTH
from fleet.errors import FleetError, StoreUnavailable
from fleet.settings import Settings, get_settings, node_name
from fleet.states import DRIVEN
from fleet.store import Campaign, Store, TrialResult

log = logging.getLogger("fleet.driver")


def driver_name() -> str:
    """A name for this process as a campaign's driver: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


STATIC_WINDOW = 1024
"""Trials a static strategy keeps in flight: it needs no results back, so only the broker's memory bounds it."""


def driver(
    store: Store,
    campaign: Campaign,
    *,
    window: int | None = None,
    on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    owner: str | None = None,
    force: bool | None = None,
    user_code: bool = False,
) -> Driver | ChainDriver:
    """A driver for ``campaign`` with the environment's settings and a window that fits the fleet.

    Parameters
    ----------
    owner:
        The name the driver holds the campaign's lease under (default: this process's).
    user_code:
        True in the submitting user's own process only: a Python space file's searcher may then run.
    force:
        Take the lease from a live driver; by default only for campaigns not submitted to the fleet's
        drivers, which their user drives (``fleet tune``, ``fleet resume``), the latest one winning.
    """
    from fleet.tasks import send, send_steps

    settings = get_settings()
    # A driven campaign waits out a database restart instead of ending (the store's calls retry).
    store.patience = max(store.patience, settings.outage_seconds)
    store.sync_clock()  # the campaign's and its trials' leases are on the database's clock
    steering = Steering(
        store,
        campaign.id,
        owner or driver_name(),
        lease_seconds=settings.driver_lease_seconds,
        force=not campaign.submitted if force is None else force,
    )
    if chains_on_fleet(campaign.strategy):
        return ChainDriver(
            store,
            campaign,
            send_steps,
            send,
            on_progress=on_progress,
            on_warning=on_warning,
            requeue_seconds=settings.requeue_seconds,
            steering=steering,
        )
    result = Driver(
        store,
        campaign,
        send,
        on_progress=on_progress,
        on_warning=on_warning,
        max_attempts=settings.max_attempts,
        heartbeat_seconds=settings.heartbeat_seconds,
        liveness_seconds=settings.liveness_seconds,
        requeue_seconds=settings.requeue_seconds,
        steering=steering,
        user_code=user_code,
    )
    within = settings.liveness_seconds
    if window is not None:
        result.window = window
    elif campaign.submitted:
        result.window_for = lambda depth: shared_window(store, campaign, within, depth)
        result.window = result.window_for(SLOT_DEPTH)
    elif result.dynamic:
        # Two per evaluation slot: one running, one waiting, so no slot idles while the driver thinks.
        result.window = max(2, 2 * store.eval_slots(campaign.target, within))
    else:
        result.window = STATIC_WINDOW
    return result


def shared_window(store: Store, campaign: Campaign, within: float, depth: float = SLOT_DEPTH) -> int:
    """The window of a submitted campaign, in messages: its priority's share of ``depth`` per evaluation slot.

    Redis has no message priorities, so the drivers admit work instead: each keeps in flight its share of
    what the target's slots can take, and the slots' FIFO queue then serves the campaigns in that
    proportion. It needs no broker feature, and a new weight counts at the driver's next look (a second).
    """
    slots = max(1, store.eval_slots(campaign.target, within))
    return max(1, round(depth * slots * store.share(campaign.id, campaign.target)))


class DriverService:
    """Drive submitted campaigns until :meth:`stop`.

    Parameters
    ----------
    store:
        The database.
    settings:
        Heartbeat and lease times.
    name:
        This driver's name in the database (default: host and process id).
    max_campaigns:
        Campaigns driven at once; more wait for a driver with room.
    poll_seconds:
        How often to look for campaigns to take.
    echo:
        Called with one line per event (a campaign taken, finished, failed).
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        name: str | None = None,
        max_campaigns: int = 16,
        poll_seconds: float = 1.0,
        echo: Callable[[str], None] = log.info,
    ) -> None:
        self.store = store
        # A driver outlives a database restart: its calls retry for this long before they give up.
        store.patience = max(store.patience, settings.outage_seconds)
        self.settings = settings
        self.name = name or f"driver@{node_name()}:{os.getpid()}"
        self.max_campaigns = max_campaigns
        self.poll_seconds = poll_seconds
        self.echo = echo
        self.threads: dict[int, threading.Thread] = {}
        self.stopping = threading.Event()

    def register(self) -> None:
        """Appear in ``fleet status`` beside the workers, with the role ``driver``."""
        self.store.register_worker(
            name=self.name,
            hostname=node_name(),  # the name `fab deploy` used
            role="driver",
            target="-",
            queues=[],
            gpu=None,
            gpus=[],
            cpus=os.cpu_count() or 1,
            concurrency=self.max_campaigns,
            pid=os.getpid(),
        )

    def serve(self) -> None:
        """Take and drive campaigns until :meth:`stop`; then wait for the campaigns' threads to let go."""
        self.store.sync_clock()
        self.register()
        self.echo(f"{self.name}: driving submitted campaigns (at most {self.max_campaigns} at once)")
        last_beat = time.monotonic()
        while not self.stopping.is_set():
            try:
                self.take_some()
                if time.monotonic() - last_beat > self.settings.heartbeat_seconds:
                    self.store.sync_clock()  # campaigns' leases are on the database's clock
                    self.store.heartbeat(self.name)
                    last_beat = time.monotonic()
            except Exception as error:  # the database restarting: keep the process, try again
                self.echo(f"{self.name}: {type(error).__name__}: {error}; trying again")
            self.stopping.wait(self.poll_seconds)
        for thread in list(self.threads.values()):
            thread.join()
        self.store.worker_stopped(self.name)

    def stop(self) -> None:
        """Stop taking campaigns; those driven now let go of their leases for another driver to take."""
        self.stopping.set()

    def take_some(self) -> None:
        self.threads = {cid: t for cid, t in self.threads.items() if t.is_alive()}
        room = self.max_campaigns - len(self.threads)
        if room <= 0:
            return
        for campaign in self.store.campaigns_to_drive(limit=room):
            # Leased before any thread starts: campaigns submitted together see each other in their first window.
            if campaign.id in self.threads or not self.store.take_campaign(
                campaign.id, self.name, self.settings.driver_lease_seconds
            ):
                continue
            thread = threading.Thread(target=self.drive, args=(campaign,), name=f"campaign-{campaign.id}", daemon=True)
            self.threads[campaign.id] = thread
            thread.start()

    def drive(self, campaign: Campaign) -> None:
        """Drive one campaign to its end, or until this driver stops or loses the lease."""
        try:
            run = driver(
                self.store,
                campaign,
                owner=self.name,
                force=False,
                on_warning=lambda line: self.echo(f"{campaign.name}: {line}"),
            )
            run.steering.stop = self.stopping
            run.steering.take()
            self.echo(
                f"{self.name}: took campaign {campaign.name!r} (id {campaign.id}, priority {campaign.priority:g})"
            )
            run.drive()
        except (CampaignBusy, LeaseLost) as error:
            self.echo(f"{self.name}: let go of {campaign.name!r}: {error}")
            return
        except StoreUnavailable as error:
            # Down longer than the store waits: the campaign is not at fault; its lease lets another
            # driver (or this one, at a later poll) carry it on.
            self.echo(f"{self.name}: campaign {campaign.name!r}: {error}; another look once it answers")
            return
        except FleetError as error:
            # The campaign itself cannot go on (its space file changed, its workload is gone): say why.
            self.store.fail_campaign(campaign.id, str(error))
            self.echo(f"{self.name}: campaign {campaign.name!r} failed: {error}")
            return
        except Exception as error:  # the database or broker away: another look at the next poll
            self.echo(f"{self.name}: campaign {campaign.name!r}: {type(error).__name__}: {error}; trying again")
            self.store.release_campaign(campaign.id, self.name)
            return
        ended = self.store.campaign(campaign.id)
        if ended.status in DRIVEN:
            self.echo(f"{self.name}: let go of {campaign.name!r} ({ended.status}) as this driver stops")
        else:
            self.echo(f"{self.name}: campaign {campaign.name!r} {ended.status}")
