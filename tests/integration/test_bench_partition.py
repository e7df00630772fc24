"""``fleet bench partition`` on a short schedule (issue 39): four events of four kinds drawn from a fixed seed over a
bed of two worker nodes and two head nodes, then the checker; every count 0, every planned trial recorded once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fleet.bench.nemesis import COUNTS, HEADS, plan, run
from fleet.ops.nodes import Bed
from tests.nodes import SHARED_HOSTNAME, make_bed

SEED = 110  # the driving head cut, a worker node crashed, a worker node's disk filled, a worker's clock 2 min ahead
EVENTS = 4
TRIALS = 60


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    """Two worker nodes and two head nodes (the bench's heads are the last two), sharing one host name."""
    made = make_bed(2 + HEADS, hostname=SHARED_HOSTNAME)
    try:
        yield made
    finally:
        made.down()


def test_a_short_seeded_schedule_loses_duplicates_and_misattributes_nothing_and_work_resumes(bed: Bed) -> None:
    planned = plan(SEED, EVENTS, ["node1", "node2"], ["node3", "node4"], 4)
    assert len({event.kind for event in planned}) == EVENTS
    # Builds and runs of 0.6 s: the campaign outlasts the events, so that work is left after each heal.
    result = run(trials=TRIALS, events=EVENTS, seed=SEED, seconds=0.6, hold=4, timeout=240, bed=bed)
    shown = {k: v for k, v in result.items() if k not in ("examples", "events")}
    print(f"\npartition bench, seed {SEED}: {json.dumps(shown, default=str)}")
    for event in result["events"]:
        print(f"  {event}")
    assert [e["kind"] for e in result["events"]] == [e.kind for e in planned]  # the seed's schedule, as planned
    assert result["ok"], result
    zero = [key for key in COUNTS if key not in ("trials_planned", "recorded")]
    assert {key: result[key] for key in zero} == dict.fromkeys(zero, 0), result
    assert result["recorded"] == result["trials_planned"] == TRIALS
    assert sum(result["measured_by"].values()) == TRIALS and set(result["measured_by"]) <= {"node1", "node2"}
    assert result["events_made"] == EVENTS and not result["not_resumed"], result["events"]
