"""The driver's pace: when trials may share messages, and how many to a message."""

from __future__ import annotations

import pytest

from fleet.driving.pace import HORIZON_SECONDS, MAX_BATCH, MAX_DEPTH, PROBE_SECONDS, QUIET_SECONDS, SLOT_DEPTH, Pace


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


def test_cheap_trials_keep_a_second_of_a_slots_work_in_flight() -> None:
    pace = Pace(slots=0.25)  # a quarter of one slot: three other campaigns share it
    assert pace.depth() == SLOT_DEPTH  # nothing known yet
    pace.sent(0.0)
    pace.finished(1, 0.1)
    assert pace.cheap and pace.depth() == SLOT_DEPTH  # 50 ms each: four messages of 32 are seconds of work
    pace.finished(250, 1.1)  # 250 in a second on a quarter slot: a slot does 1,000 trials/s
    assert pace.depth() == pytest.approx(HORIZON_SECONDS * 1000 / MAX_BATCH)
    pace.finished(100_000, 2.1)
    assert pace.depth() == MAX_DEPTH
    pace.finished(1, 3.1)  # slow again: back to one trial per message, SLOT_DEPTH of them
    assert pace.depth() == SLOT_DEPTH


def test_a_second_without_trials_back_says_little_five_say_they_are_slow() -> None:
    # Twenty campaigns sharing a queue see their trials back a message at a time, behind the others' messages.
    pace = Pace(slots=0.05)
    pace.sent(0.0)
    pace.finished(32, 0.2)
    pace.finished(32, 1.3)  # 32 in 1.1 s on a twentieth of a slot: 1.7 ms each
    assert pace.cheap
    pace.finished(0, 2.5)
    pace.finished(0, 3.5)
    assert pace.cheap  # none back for 2.2 s: their message waits behind others
    pace.finished(32, 3.6)  # 32 in 2.3 s
    assert pace.cheap and pace.seconds == pytest.approx(0.05 * 2.3 / 32)
    pace.finished(0, 3.6 + QUIET_SECONDS)
    assert not pace.cheap and pace.batch(1000) == 1


def test_campaigns_sharing_a_queue_keep_the_same_depth_whichever_got_more_of_it() -> None:
    # Two equal campaigns on one slot: the first got three quarters of it for a second. Sized from how soon
    # their trials came back, the first would keep three times the second's depth and so keep its lead; the
    # workers' time per trial is the same for both.
    ahead, behind = Pace(slots=0.5), Pace(slots=0.5)
    for pace, count in ((ahead, 750), (behind, 250)):
        pace.sent(0.0)
        pace.finished(1, 0.1, evaluated=[0.001])
        pace.finished(count, 1.1, evaluated=[0.001] * count)
    assert ahead.seconds == pytest.approx(behind.seconds / 3)
    assert ahead.depth() == behind.depth() == pytest.approx(HORIZON_SECONDS / (0.001 * MAX_BATCH))


def test_untimed_trials_leave_the_depth_to_their_pace() -> None:
    # Trials that errored before their evaluation, or recorded by workers that did not time them.
    pace = Pace(slots=1)
    pace.sent(0.0)
    pace.finished(1, 0.1)
    pace.finished(250, 1.1)
    assert pace.work is None and pace.depth() == pytest.approx(HORIZON_SECONDS / (1 / 250 * MAX_BATCH))


def test_a_first_trial_back_soon_is_slow_when_its_worker_took_long_over_it() -> None:
    pace = Pace(slots=1)
    pace.sent(0.0)
    pace.finished(1, 0.4, evaluated=[0.3])  # back within the probe, but its measurement took 0.3 s
    assert not pace.probing and not pace.cheap and pace.batch(1000) == 1


def test_trials_waiting_behind_another_campaigns_are_cheap_once_their_workers_say_so() -> None:
    # A campaign joining one that fills the queue: its first trials wait behind a second of the other's.
    pace = Pace(slots=0.5)
    pace.sent(0.0)
    pace.finished(0, PROBE_SECONDS + 0.01)
    assert not pace.cheap
    pace.finished(2, 1.0, evaluated=[0.0005, 0.0005])  # 2 back after a second: slow by their pace, not their work
    assert pace.cheap and pace.batch(1000) == MAX_BATCH and pace.depth() == MAX_DEPTH
    pace.finished(0, 1.0 + QUIET_SECONDS)  # then none back for five seconds: slow again
    assert not pace.cheap and pace.work is None


def test_trials_cheap_to_measure_but_each_built_are_slow() -> None:
    # A grid of compiler flags: every trial builds for seconds, then runs for a millisecond.
    pace = Pace(slots=1)
    pace.sent(0.0)
    pace.finished(1, 3.0, evaluated=[0.001], compiled=[2.5])
    assert not pace.cheap and pace.batch(1000) == 1 and pace.depth() == SLOT_DEPTH
    # Run-time knobs over a few builds: most trials find their artifact built, and their compiles are not timed.
    shared = Pace(slots=1)
    shared.sent(0.0)
    shared.finished(1, 0.2, evaluated=[0.001], compiled=[0.3])
    assert not shared.cheap  # one trial back, and it built: so far, every trial builds
    shared.finished(99, 1.2, evaluated=[0.001] * 99)  # the next 99 used its artifact
    assert shared.build == 0.0 and shared.cheap


def test_a_slow_build_shared_by_many_trials_leaves_them_cheap_even_when_few_come_back() -> None:
    # One of twenty campaigns sharing a queue, one message of its trials back per second: a build among them
    # took longer than a cheap trial (a busy moment). Taken per build, the campaign stayed slow until its next
    # build, 500 trials on, which at one trial a second never came.
    pace = Pace(slots=0.05)
    pace.sent(0.0)
    pace.finished(32, 1.0, evaluated=[0.001] * 32, compiled=[0.064])
    assert pace.build == pytest.approx(0.002) and pace.cheap
    pace.finished(1, 2.5, evaluated=[0.001], compiled=[0.064])  # a span in which only a builder came back
    assert not pace.cheap
    pace.finished(1, 3.8, evaluated=[0.001])  # the next trial back used the artifact built
    assert pace.build == 0.0 and pace.cheap
