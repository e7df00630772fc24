"""The Python API: describe a campaign, submit it, watch or steer it, ask for the best.

import fleet
campaign = fleet.submit("examples/matmul-c/spec.json")    # a path, a dict or a fleet.CampaignSpec
summaries = campaign.wait()                                 # drivers on the fleet drive it; embedded: this process
campaign.trials(state="evaluated")                          # plain records; campaign.to_pandas() with pandas
campaign.best()                                             # the best trial of each problem
fleet.run("examples/matmul-c/spec.json")                    # the blocking form: submit and drive here

A submitted campaign is driven by a ``fleet driver`` process when one runs (the caller may exit), and by
the waiting process otherwise in embedded mode.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from fleet.driving.campaign import CampaignBusy, CampaignSpec, Summary, parse_spec, summarize
from fleet.driving.campaign import submit as _submit
from fleet.driving.drivers import driver
from fleet.errors import FleetError, SpecError
from fleet.settings import get_settings
from fleet.spec import load_spec
from fleet.spec.campaign import check_priority
from fleet.states import ENDED, CampaignStatus
from fleet.store import Campaign, Measurement, Store, TrialRecord, TrialResult, connect
from fleet.trust import Drawn

log = logging.getLogger(__name__)


def _connect() -> Store:
    """The environment's store. A new embedded database is said in one line: a script run in another folder than
    the one ``make run`` filled starts its own, and its user should know why nothing tuned before is there."""
    settings = get_settings()
    new = settings.embedded_database and not (settings.home / "fleet.db").exists()
    store = connect()
    if new and not os.environ.get("FLEET_HOME"):
        log.warning(
            "fleet: a new embedded database, %s: no .fleet/ in %s or above it holds one (run from the folder that "
            "does, or set FLEET_HOME)",
            settings.home / "fleet.db",
            settings.home.parent,
        )
    return store


def _spec(spec: CampaignSpec | Mapping[str, Any] | str | Path) -> CampaignSpec:
    if isinstance(spec, CampaignSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_spec(dict(spec), Path.cwd(), name=spec.get("name") or None)
    if isinstance(spec, str | Path):
        return load_spec(spec)
    raise SpecError(f"a spec is a path, a dict or a fleet.CampaignSpec, not {type(spec).__name__}")


def submit(
    spec: CampaignSpec | Mapping[str, Any] | str | Path,
    store: Store | None = None,
    *,
    priority: float | None = None,
    team: str | None = None,
) -> CampaignHandle:
    """Write the campaign and hand it to the fleet's drivers; returns at once.

    Parameters
    ----------
    spec:
        A spec file's path, its JSON as a dict (sources relative to the current directory), or a spec.
    priority:
        The campaign's weight on its target's evaluation slots (default: the spec's, else 1).
    team:
        The team that owns it, on PostgreSQL (default: the one team the database login is a member of); only its
        members read and steer it.
    """
    # The spec (and the priority) are checked whole before the store is opened: a bad one writes nothing.
    campaign_spec = _spec(spec)
    if priority is not None:
        check_priority(priority)
    store = store or _connect()
    campaign = _submit(store, campaign_spec, team)
    store.submit_campaign(campaign.id, priority)
    return CampaignHandle(store, campaign.id)


def run(
    campaign: CampaignHandle | Campaign | CampaignSpec | Mapping[str, Any] | str | int | Path,
    *,
    store: Store | None = None,
    local: bool | None = None,
    window: int | None = None,
    on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> list[Summary]:
    """Drive a campaign to its end in this process (or resume it) and return what it found per problem.

    Parameters
    ----------
    campaign:
        A handle, a campaign, its name or id, or a spec (a path, a dict or a spec), which is written first.
    local:
        Start this machine's workers for the run; by default when running embedded.
    window:
        Trials in flight at once; by default unbounded for static strategies, two per worker otherwise.
    """
    from fleet.local import LocalFleet

    settings = get_settings()
    store = store or _connect()
    campaign = _campaign(store, campaign)
    local = settings.embedded if local is None else local
    try:
        with LocalFleet(settings, campaign.target) if local else nullcontext():
            run = driver(store, campaign, window=window, on_progress=on_progress, on_warning=on_warning, user_code=True)
            return run.run()
    except CampaignBusy:
        # A driver on the fleet has it: waiting for it is what this call promises.
        return CampaignHandle(store, campaign.id).wait(drive=False)


def _campaign(store: Store, ref: Any) -> Campaign:
    """The stored campaign that ``ref`` names; a spec is written first (the same spec again finds it)."""
    if isinstance(ref, Campaign):
        return ref
    if isinstance(ref, CampaignHandle):
        return ref.campaign()
    if isinstance(ref, int) or (isinstance(ref, str) and not ref.endswith(".json")):
        return store.campaign(ref)
    return _submit(store, _spec(ref))


def status(campaign: CampaignHandle | Campaign | str | int, store: Store | None = None) -> dict[str, int]:
    """Trials of a campaign by state."""
    store = store or _connect()
    return store.trial_counts(_campaign(store, campaign).id)


def campaign(ref: str | int, store: Store | None = None) -> CampaignHandle:
    """The campaign named ``ref`` (or with id ``ref``)."""
    store = store or _connect()
    return CampaignHandle(store, store.campaign(ref).id)


def campaigns(store: Store | None = None) -> list[CampaignHandle]:
    """Every campaign of the database, the oldest first."""
    store = store or _connect()
    return [CampaignHandle(store, c.id) for c in store.campaigns()]


class CampaignHandle:
    """A stored campaign, to watch and steer from Python; every method reads the database afresh.

    Parameters
    ----------
    store:
        The database the campaign is in.
    campaign_id:
        The campaign's id.
    """

    def __init__(self, store: Store, campaign_id: int) -> None:
        self.store = store
        self.id = campaign_id
        first = store.campaign(campaign_id)
        self.name, self.target = first.name, first.target

    def __repr__(self) -> str:
        return f"<campaign {self.name!r} ({self.campaign().status})>"

    def campaign(self) -> Campaign:
        """The campaign's row as it is now."""
        return self.store.campaign(self.id)

    def status(self) -> dict[str, Any]:
        """Its status, priority and driver, and its trials by state."""
        c = self.campaign()
        return {
            "name": c.name,
            "status": c.status,
            "reason": c.reason,
            "priority": c.priority,
            "driver": c.driver,
            "trials": self.store.trial_counts(c.id),
        }

    def trials(self, state: str | None = None) -> list[TrialRecord]:
        """Its trials (those in ``state``): id, config, state, objective, samples, reason, worker, attempts."""
        return self.store.trial_records(self.id, state)

    def to_pandas(self, state: str | None = None) -> Any:
        """:meth:`trials` as a pandas DataFrame, one column per knob (``pip install pandas``)."""
        try:
            import pandas
        except ImportError:
            raise FleetError("to_pandas() needs pandas: pip install pandas") from None
        rows = []
        for t in self.trials(state):
            row = {k: v for k, v in vars(t).items() if k != "config"}
            rows.append({**row, **{f"config.{k}": v for k, v in t.config.items()}})
        return pandas.DataFrame(rows)

    def best(self) -> list[TrialResult]:
        """The best trial of each problem that has a valid measurement, in the order of the problems."""
        return [s.best for s in summarize(self.store, self.campaign()) if s.best is not None]

    def wait(self, timeout: float | None = None, *, drive: bool | None = None) -> list[Summary]:
        """Block until the campaign ends; what it found per problem.

        In embedded mode, when no driver holds the campaign, this process drives it (with local
        workers), since no ``fleet driver`` runs there. Raises ``TimeoutError`` after ``timeout``
        seconds, :class:`fleet.diagnose.NoValidMeasurement` when a problem ended with no valid
        measurement, and :class:`FleetError` when the campaign failed.

        Parameters
        ----------
        timeout:
            Seconds to wait at most; None waits as long as it takes (not checked while driving here).
        drive:
            Drive the campaign here when no driver holds it (default: in embedded mode).
        """
        drive = get_settings().embedded if drive is None else drive
        deadline = None if timeout is None else time.monotonic() + timeout
        while (c := self.campaign()).status not in ENDED:
            if drive and not _held(c):
                try:
                    run(c, store=self.store)
                    continue
                except CampaignBusy:
                    pass  # a driver took it meanwhile
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"campaign {self.name!r} is still {c.status} after {timeout} s")
            time.sleep(0.5)
        if c.status == CampaignStatus.FAILED:
            raise FleetError(f"campaign {self.name!r} failed: {c.reason}")
        summaries = summarize(self.store, c)
        if c.status == CampaignStatus.DONE:
            from fleet.diagnose import no_valid_measurement

            failure = no_valid_measurement(self.store, c, summaries)
            if failure is not None:
                raise failure
        return summaries

    def cancel(self) -> dict[str, int]:
        """Stop the campaign: no new trial starts, and running ones are killed; unfinished trials by state."""
        return self.store.cancel_campaign(self.id)

    def pause(self) -> None:
        """Hold new trials; running ones finish."""
        self.store.pause_campaign(self.id)

    def resume(self) -> None:
        """Go on after :meth:`pause`."""
        self.store.resume_campaign(self.id)

    def report(self, path: str | Path = "report.html") -> Path:
        """Write the campaign's HTML report to ``path``."""
        from fleet.report import render

        path = Path(path)
        path.write_text(render(self.store, self.campaign()))
        return path


def _held(campaign: Campaign) -> bool:
    """Whether a live driver holds ``campaign``'s lease."""
    from fleet.store import utcnow

    expires = campaign.driver_lease_expires_at
    return campaign.driver is not None and expires is not None and expires >= utcnow()


Best = Drawn[Measurement, dict[str, Any]]
"""One best: the pair ``(measurement, config)``, and ``.campaign``, the name of the campaign it came from."""


def best(
    problem_id: int,
    target: str,
    limit: int = 1,
    store: Store | None = None,
    *,
    campaigns: str | Iterable[str] | None = None,
) -> list[Best]:
    """The best valid measurements of a problem on a target among the campaigns named, best first: each a
    ``(measurement, config)`` pair that says its ``campaign``.

    As ``fleet best --from`` (fleet.trust's rule), so that another campaign's numbers decide no answer unasked.

    Parameters
    ----------
    campaigns:
        The campaigns to draw on: a list of names, names separated by commas, or ``"all"``. None: the one campaign
        that measured the problem on ``target``; where several did, :class:`FleetError` names them.
    """
    from fleet.trust import best as trusted_best
    from fleet.trust import named

    store = store or _connect()
    what = f"problem {problem_id} on {target}"
    how = "campaigns=[...] or campaigns='all'"
    rows = trusted_best(store, problem_id, target, named(campaigns), limit, what=what, how=how)
    return [Drawn(m, config, campaign) for m, config, campaign in rows]
