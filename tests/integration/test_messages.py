"""Messages are JSON only: a worker refuses anything else, and the refused message does nothing."""

from __future__ import annotations

import time

from fleet.settings import Settings
from fleet.store import NewTrial
from fleet.tasks import app, configure
from tests.conftest import Fleet


def test_the_app_speaks_json_only() -> None:
    conf = configure(app, Settings.from_env({"FLEET_BROKER_URL": "redis://127.0.0.1:1/0"})).conf
    assert conf.accept_content == ["json"]
    assert (conf.task_serializer, conf.result_serializer, conf.event_serializer) == ("json", "json", "json")
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_send_task_events and conf.task_send_sent_event


def test_a_pickled_message_is_refused_by_the_worker(fleet: Fleet) -> None:
    configure(app, Settings.from_env(fleet.env))
    problem = fleet.store.add_problem("noop", {})
    from fleet.driving.campaign import CampaignSpec, ProblemSpec, submit
    from fleet.space import Knob, Space

    spec = CampaignSpec(
        name="pickle",
        problems=[ProblemSpec("noop", {})],
        target=fleet.target,
        space=Space((Knob("i", (1,)),)),
        workload={"kind": "noop"},
    )
    campaign = submit(fleet.store, spec)
    [(trial_id, _)] = fleet.store.add_trials(campaign.id, fleet.target, [NewTrial(problem, {"i": 1}, "b", "m")])
    fleet.start_worker()

    app.send_task(
        "fleet.compile",
        kwargs={"trial_id": trial_id, "target": fleet.target},
        queue=f"build.{fleet.target}",
        serializer="pickle",
    )
    time.sleep(3)

    assert fleet.store.trial(trial_id).state == "new"  # nothing ran it
    log = (fleet.home / "worker.log").read_text()
    assert "ContentDisallowed" in log or "Refusing to deserialize" in log
