"""The schedule of ``fleet bench partition`` (fleet/bench/nemesis.py): drawn from its seed alone, every kind as evenly
as the number of events allows, each event striking a node that can take it. The run itself needs root and
namespaces: tests/integration/test_bench_partition.py."""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner

from fleet.bench.nemesis import KINDS, partition_command, plan

WORKERS, HEADS = ["node1", "node2", "node3"], ["node4", "node5"]


def test_a_seed_draws_one_schedule_and_another_seed_another() -> None:
    first, again = plan(3, 42, WORKERS, HEADS, 10), plan(3, 42, WORKERS, HEADS, 10)
    assert first == again
    assert [(e.kind, e.node, e.hold) for e in plan(4, 42, WORKERS, HEADS, 10)] != [
        (e.kind, e.node, e.hold) for e in first
    ]


def test_forty_five_events_hold_every_kind_five_times_and_fewer_events_than_kinds_differ_in_kind() -> None:
    assert len(KINDS) == 9 and {"clock-jump", "disk-full"} <= set(KINDS)
    assert Counter(e.kind for e in plan(0, 45, WORKERS, HEADS, 10)) == dict.fromkeys(KINDS, 5)
    assert min(Counter(e.kind for e in plan(0, 40, WORKERS, HEADS, 10)).values()) == 4
    assert len({e.kind for e in plan(0, 5, WORKERS, HEADS, 10)}) == 5


def test_each_event_strikes_a_node_that_can_take_it_and_is_held_between_half_and_all_of_the_hold() -> None:
    for event in plan(11, 70, WORKERS, HEADS, 10):
        assert 5 <= event.hold <= 10 and 1 <= event.gap <= 3
        if event.kind == "split":
            # The half that loses the database: never empty, never the database's own.
            assert event.side and "db" not in event.side and len(event.side) <= 3
        elif event.kind == "cut-head":
            assert event.node == ""  # the head driving when it strikes
        elif event.kind in ("crash", "clock-jump"):
            assert event.node in WORKERS + HEADS
        else:  # a worker node's disk fills: its cache and its workloads' scratch are there
            assert event.node in WORKERS
        # Two minutes ahead or behind: far more than a lease, in either direction.
        assert event.clock_s == 0 if event.kind != "clock-jump" else abs(event.clock_s) == 120


def test_without_root_the_bench_says_so_in_one_line_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    if os.geteuid() == 0:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(partition_command, ["--trials", "20", "--events", "1"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["nodes: making network, mount and PID namespaces needs root"]
