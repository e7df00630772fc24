"""The clock leases run on (fleet/clock.py): the database's, read on by the time since boot after a sync, so that a
step of this machine's wall clock moves nothing (issue 39's clock-jump)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleet import clock


def test_before_any_sync_it_is_this_machines_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_database_clock", None)
    assert abs(clock.utcnow() - clock.local_utcnow()) < timedelta(seconds=1)


def test_after_a_sync_a_step_of_the_wall_clock_moves_it_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_database_clock", None)
    theirs = datetime(2030, 1, 1, 12, 0, 0)
    ahead = clock.sync_clock(lambda: theirs)
    assert abs(ahead - (theirs - clock.local_utcnow())) < timedelta(seconds=1)
    for step in (timedelta(minutes=2), timedelta(minutes=-2)):
        monkeypatch.setattr(clock, "_clock_skew", step)  # as NTP or `date -s` would step it
        assert timedelta(0) <= clock.utcnow() - theirs < timedelta(seconds=1)
