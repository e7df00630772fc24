"""Compiles of one build key on a real worker with two build slots, Redis and PostgreSQL: a compile whose
artifact the other slot is building is handed to that build, and its slot goes on to the next build."""

from __future__ import annotations

import os
import signal

from fleet.bench.pipeline import Case, pipeline_spec
from fleet.driving.campaign import submit
from fleet.keys import trial_keys
from fleet.settings import Settings
from fleet.space import Space
from fleet.spec import load_spec
from fleet.store import NewTrial, Requeue
from fleet.store._models import Artifact
from fleet.tasks import app, configure, send
from tests.conftest import Fleet, write_spec
from tests.integration.test_faults import assert_each_recorded_once, trials

BUILD_SECONDS = 3.0


def three_of_a_then_b(fleet: Fleet) -> dict[str, list[int]]:
    """Trials of build ``a`` (three run-time values) and of build ``b``, sent in that order, one to a message."""
    configure(app, Settings.from_env(fleet.env))
    case = Case(build_s=BUILD_SECONDS, run_s=0.1, builds=2, runs=3, build_slots=2, eval_slots=1)
    campaign = submit(fleet.store, load_spec(write_spec(fleet.home, pipeline_spec("shared", fleet.target, case))))
    problem = fleet.store.campaign_problems(campaign.id)[0].id
    space = Space.from_dict(campaign.space)
    configs = [{"b": 0, "r": r} for r in range(3)] + [{"b": 1, "r": 0}]
    added = fleet.store.add_trials(
        campaign.id,
        fleet.target,
        [NewTrial(problem, config, *trial_keys(campaign, problem, config, space)) for config in configs],
    )
    ids = [trial_id for trial_id, _ in added]
    send([Requeue(trial_id, fleet.target, "compile") for trial_id in ids])
    return {"a": ids[:3], "b": ids[3:]}


def artifacts(fleet: Fleet) -> list[Artifact]:
    with fleet.store.session() as session:
        return list(session.query(Artifact).order_by(Artifact.created_at))


def test_a_compile_waiting_for_the_other_slots_build_leaves_its_slot_to_the_next_build(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "2", "--eval-procs", "1")

    three_of_a_then_b(fleet)

    fleet.wait_for(
        lambda: [t.state for t in trials(fleet)] == ["evaluated"] * 4, timeout=90, what="every trial evaluated"
    )
    first, second = artifacts(fleet)
    # a's other two compiles went to a's build: b's build began while a's ran, not after it.
    assert second.created_at < first.built_at
    assert all(t.attempts == 1 for t in trials(fleet))
    assert_each_recorded_once(fleet)
    log = (fleet.home / "worker.log").read_text()
    assert log.count("compile end: handed") == 2


def test_compiles_handed_to_a_build_whose_worker_dies_come_back_once(fleet: Fleet) -> None:
    worker = fleet.start_worker("--build-procs", "2", "--eval-procs", "1")
    ids = three_of_a_then_b(fleet)
    fleet.wait_for(
        lambda: (
            sum(t.worker is not None and t.state == "compiling" for t in trials(fleet)) == 4
            and len({t.worker for t in trials(fleet) if t.id in ids["a"]}) == 1
        ),
        timeout=30,
        what="a's compiles handed to its build",
    )

    os.killpg(worker.pid, signal.SIGKILL)  # the builder, and the trials it holds for others with it
    worker.wait()
    fleet.start_worker("--build-procs", "2", "--eval-procs", "1", expect=0, log="worker2.log")

    fleet.wait_for(
        lambda: [t.state for t in trials(fleet)] == ["evaluated"] * 4, timeout=120, what="every trial evaluated"
    )
    assert_each_recorded_once(fleet)
