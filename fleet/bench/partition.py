"""The checker of a campaign run through network partitions (issue 39), and the watch it reads drivers' leases from.

After the last heal, over the database (read from the machine through PostgreSQL's unix socket, so no partition
hides it) and what a :class:`LeaseWatch` saw while the run went on:

- every planned trial recorded exactly once with its right value, none lost, duplicated or stuck
  (:func:`fleet.bench.chaos.tally`, the same counts as ``fleet bench chaos``);
- every measurement attributed to the node that ran it: its ``node`` is the node in its worker's name (both come
  from ``FLEET_NODE_NAME``) and one of the nodes that ran workers, never the host name the nodes share;
- no two drivers driving one campaign at overlapping times: each new holder's lease began (its expiry less the
  lease length, on the database's clock) no earlier than the last expiry the holder before it was seen with;
- no result recorded by a node while it was cut off from the database, once its leases had run out.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnClause, literal_column

from fleet.bench.chaos import tally

# Naive UTC on the database's clock, as the store's leases and timestamps are (fleet.store._models.utcnow).
_DB_NOW: ColumnClause[datetime] = literal_column("clock_timestamp() AT TIME ZONE 'UTC'")


@dataclass(frozen=True)
class Cut:
    """A node cut off from the database (and maybe more) between two instants of the database's clock."""

    node: str
    start: datetime
    end: datetime


@dataclass
class LeaseWatch:
    """Samples a campaign's driver and lease expiry (with the database's clock) until stopped, in a thread."""

    store: Any
    campaign_id: int
    every: float = 0.2
    samples: list[tuple[datetime, str | None, datetime | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LeaseWatch:
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        from sqlalchemy import select

        from fleet.store import Campaign

        while not self._stop.is_set():
            try:
                with self.store.session() as session:
                    row = session.execute(
                        select(_DB_NOW, Campaign.driver, Campaign.driver_lease_expires_at).where(
                            Campaign.id == self.campaign_id
                        )
                    ).one()
                self.samples.append((row[0], row[1], row[2]))
            except Exception:  # a watch outlives a moment the database does not answer
                pass
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def holders(self) -> list[tuple[str, datetime, datetime]]:
        """Each holder in turn: its name, the first and the last lease expiry it was seen with."""
        turns: list[tuple[str, datetime, datetime]] = []
        for _, driver, expires in self.samples:
            if driver is None or expires is None:
                continue
            if turns and turns[-1][0] == driver:
                turns[-1] = (driver, turns[-1][1], max(turns[-1][2], expires))
            else:
                turns.append((driver, expires, expires))
        return turns

    def overlaps(self, lease_seconds: float) -> list[str]:
        """Each change of holder whose new lease began before the old one's last seen expiry."""
        found = []
        turns = self.holders()
        for (old, _, old_last), (new, new_first, _) in itertools.pairwise(turns):
            began = new_first - timedelta(seconds=lease_seconds)
            if began < old_last:
                found.append(f"{new} took over at {began:%H:%M:%S.%f} while {old} held until {old_last:%H:%M:%S.%f}")
        return found


def now(store: Any) -> datetime:
    """The database's clock, which leases run on."""
    from sqlalchemy import select

    with store.session() as session:
        return session.execute(select(_DB_NOW)).scalar_one()


def check(
    store: Any,
    campaign_id: int | None,
    planned: list[dict[str, Any]],
    *,
    nodes: Sequence[str],
    cuts: Sequence[Cut] = (),
    watch: LeaseWatch | None = None,
    lease_seconds: float = 0.0,
    driver_lease_seconds: float = 0.0,
) -> dict[str, Any]:
    """Every count of the checker (see the module's text); ``ok`` when each that must be 0 is."""
    from sqlalchemy import select

    from fleet.store import Measurement, Trial

    counts = tally(store, campaign_id, planned)
    rows: list[Any] = []
    if campaign_id is not None:
        with store.session() as session:
            rows = list(
                session.execute(
                    select(Measurement.node, Measurement.worker, Measurement.created_at)
                    .join(Trial, Trial.id == Measurement.trial_id)
                    .where(Trial.campaign_id == campaign_id)
                ).all()
            )
    misattributed = [r for r in rows if r.node not in nodes or (r.worker or "").rpartition("@")[2] != r.node]
    # A cut node's leases have all run out one lease after the cut began: from then until the heal, nothing of it.
    late = [
        r
        for r in rows
        for cut in cuts
        if r.node == cut.node and cut.start + timedelta(seconds=lease_seconds) < r.created_at < cut.end
    ]
    overlaps = watch.overlaps(driver_lease_seconds) if watch is not None else []
    counts.pop("snapshot", None)
    counts.update(
        measured_by=dict(Counter(r.node for r in rows)),
        misattributed=len(misattributed),
        recorded_while_cut=len(late),
        overlapping_driver_leases=len(overlaps),
        driver_turns=[name for name, _, _ in watch.holders()] if watch is not None else [],
    )
    counts["examples"].update(misattributed=[tuple(r) for r in misattributed[:5]], overlaps=overlaps[:5])
    must_be_zero = ("lost", "duplicated", "stuck", "wrong_valued", "misattributed", "recorded_while_cut")
    counts["ok"] = not any(counts[k] for k in (*must_be_zero, "overlapping_driver_leases"))
    return counts


def wait_done(store: Any, campaign_id: int, timeout: float) -> str:
    """Wait for the campaign to end (done, failed, cancelled); its status then, or its status at the timeout."""
    from fleet.states import ENDED
    from fleet.store import Campaign

    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        with store.session() as session:
            status = str(session.get(Campaign, campaign_id).status)
        if status in ENDED:
            return status
        time.sleep(0.5)
    return status
