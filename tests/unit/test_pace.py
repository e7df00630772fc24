"""The driver's pace: when trials may share messages, and how many to a message."""

from __future__ import annotations

from fleet.pace import MAX_BATCH, PROBE_SECONDS, Pace


def test_nothing_is_batched_before_the_first_trials_come_back() -> None:
    pace = Pace(slots=2)
    assert pace.probing and pace.probe == 4
    assert pace.batch(1000) == 1
    pace.finished(0, 10.0)  # nothing sent yet: no clock
    assert pace.probing


def test_first_trials_back_soon_make_trials_cheap_then_the_rate_decides() -> None:
    pace = Pace(slots=1)
    pace.sent(0.0)
    pace.finished(0, 0.1)
    assert pace.probing
    pace.finished(2, 0.2)
    assert pace.cheap and pace.batch(1000) == MAX_BATCH
    assert pace.batch(40) == 20  # two messages per slot
    pace.finished(100, 1.5)  # 100 in 1.3 s on one slot: 13 ms each
    assert pace.cheap
    pace.finished(2, 3.0)  # 2 in 1.5 s: slow now
    assert not pace.cheap and pace.batch(1000) == 1


def test_first_trials_not_back_in_time_are_slow_until_the_rate_says_otherwise() -> None:
    pace = Pace(slots=4)
    pace.sent(0.0)
    pace.finished(0, PROBE_SECONDS + 0.01)
    assert not pace.probing and not pace.cheap
    pace.finished(400, PROBE_SECONDS + 1.1)  # 400 in 1.1 s on four slots: 11 ms each
    assert pace.cheap and pace.batch(80) == 10
