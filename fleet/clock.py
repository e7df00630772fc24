"""The clock that leases, heartbeats and liveness are read on: naive UTC, on the database's clock.

Apart from the store's models, so that a read of the database that does not import SQLAlchemy
(:mod:`fleet.glance`) reads the same clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

# The database's clock as read at one instant of this machine's boot clock (Store.sync_clock reads it), and read on
# from there by the boot clock: leases are compared on the database's clock, so a node whose own clock runs ahead
# does not take live work from the others, and a step of this machine's wall clock (NTP, `date -s`: the nemesis's
# clock-jump, issue 39) moves nothing until the next sync, in processes that never sync again too (a worker's pool).
# None until the first sync, and with SQLite: this machine's own wall clock. FLEET_TEST_CLOCK_SKEW moves this
# machine's wall clock, for the tests only.
_database_clock: tuple[datetime, float] | None = None
_clock_skew = timedelta(seconds=float(os.environ.get("FLEET_TEST_CLOCK_SKEW") or 0))
# The time since boot, suspended time included, which no step of the wall clock moves (macOS: the monotonic clock).
_since_boot: Callable[[], float] = (
    (lambda: time.clock_gettime(time.CLOCK_BOOTTIME)) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)


def local_utcnow() -> datetime:
    """This machine's clock, as naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None) + _clock_skew


def utcnow() -> datetime:
    """Naive UTC on the database's clock: the one kind of timestamp that compares the same in SQLite and
    PostgreSQL, and on every node."""
    found = _database_clock
    if found is None:
        return local_utcnow()
    theirs, at = found
    return theirs + timedelta(seconds=_since_boot() - at)


def sync_clock(read: Callable[[], datetime]) -> timedelta:
    """Take the database's clock, which ``read`` returns, to be the one :func:`utcnow` reads from now on; returns
    how far it is ahead of this machine's wall clock."""
    global _database_clock
    before, started = local_utcnow(), _since_boot()
    theirs = read()
    after, ended = local_utcnow(), _since_boot()
    _database_clock = (theirs, (started + ended) / 2)
    return theirs - (before + (after - before) / 2)
