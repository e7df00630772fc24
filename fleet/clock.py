"""The clock that leases, heartbeats and liveness are read on: naive UTC, on the database's clock.

Apart from the store's models, so that a read of the database that does not import SQLAlchemy
(:mod:`fleet.glance`) reads the same clock.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

# The database's clock minus this machine's (Store.sync_clock measures it): leases are compared on the database's
# clock, so a node whose own clock runs ahead does not take live work from the others. FLEET_TEST_CLOCK_SKEW
# moves this machine's clock, for the tests only.
_clock_offset = timedelta(0)
_clock_skew = timedelta(seconds=float(os.environ.get("FLEET_TEST_CLOCK_SKEW") or 0))


def local_utcnow() -> datetime:
    """This machine's clock, as naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None) + _clock_skew


def utcnow() -> datetime:
    """Naive UTC on the database's clock: the one kind of timestamp that compares the same in SQLite and
    PostgreSQL, and on every node."""
    return local_utcnow() + _clock_offset


def set_clock_offset(offset: timedelta) -> None:
    """Take the database's clock to be ``offset`` ahead of this machine's from now on."""
    global _clock_offset
    _clock_offset = offset
