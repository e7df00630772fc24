"""The order in which a driver sends a batch of compiles: every build slot building, none waiting on another's key."""

from __future__ import annotations

from fleet.driving.campaign import build_order
from fleet.store import Requeue

KEYS = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]


def ids(order: list[Requeue]) -> list[int]:
    return [r.trial_id for r in order]


def work(count: int) -> list[Requeue]:
    return [Requeue(n, "cpu", "compile") for n in range(count)]


def test_one_build_slot_keeps_the_searchers_order() -> None:
    assert ids(build_order(work(9), KEYS, 1)) == list(range(9))


def test_each_keys_other_trials_follow_once_every_slot_has_a_build() -> None:
    # Two slots build a and b; a's others come after b's first, when a's build is about done.
    assert ids(build_order(work(9), KEYS, 2)) == [0, 3, 1, 2, 6, 4, 5, 7, 8]
    assert ids(build_order(work(9), KEYS, 3)) == [0, 3, 6, 1, 2, 4, 5, 7, 8]
    # More slots than keys: every first trial, then the rest; nothing is lost or sent twice.
    assert ids(build_order(work(9), KEYS, 8)) == [0, 3, 6, 1, 2, 4, 5, 7, 8]


def test_evaluations_go_first_and_no_trial_is_lost() -> None:
    batch = [Requeue(99, "cpu", "evaluate"), *work(9)]
    order = build_order(batch, [None, *KEYS], 2)
    assert ids(order)[0] == 99
    assert sorted(ids(order)) == sorted(ids(batch))
