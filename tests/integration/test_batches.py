"""Several trials to a message, on a real worker, Redis and PostgreSQL: each trial is still claimed, recorded
and given back on its own."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from fleet.driving.campaign import CampaignSpec, Driver, ProblemSpec, submit
from fleet.driving.pace import MAX_BATCH
from fleet.keys import trial_keys
from fleet.messages import CHEAP_SECONDS
from fleet.settings import Settings
from fleet.space import Knob, Space
from fleet.spec import load_spec
from fleet.store import Campaign, NewTrial, Requeue, Trial
from fleet.tasks import app, configure, send
from tests.conftest import Fleet, write_spec
from tests.integration.test_faults import assert_each_recorded_once, script_spec, trials


def noop_campaign(fleet: Fleet, name: str, *knobs: Knob) -> Campaign:
    """A grid campaign of the noop workload, with a worker listening: trials as cheap as they come."""
    configure(app, Settings.from_env(fleet.env))
    fleet.start_worker()
    spec = CampaignSpec(
        name=name,
        problems=[ProblemSpec("noop", {})],
        target=fleet.target,
        space=Space(knobs),
        strategy={"name": "grid"},
        workload={"kind": "noop"},
    )
    return submit(fleet.store, spec)


def recorded(batches: list[int], sizes: list[int] | None = None) -> Callable[[list[Requeue], int], int]:
    """``send``, noting the trials per message the driver asked for (and, in ``sizes``, the trials it sent)."""

    def dispatch(work: list[Requeue], batch: int) -> int:
        batches.append(batch)
        if sizes is not None:
            sizes.append(len(work))
        return send(work, batch)

    return dispatch


def script_trials(fleet: Fleet, modes: list[str], **workload: object) -> list[int]:
    """The trials of a script campaign, one per mode, written but not sent: a test sends them as it needs."""
    configure(app, Settings.from_env(fleet.env))
    campaign = submit(fleet.store, load_spec(write_spec(fleet.home, script_spec(fleet, modes, **workload))))
    problem = fleet.store.campaign_problems(campaign.id)[0].id
    space = Space.from_dict(campaign.space)
    new = [NewTrial(problem, {"mode": mode}, *trial_keys(campaign, problem, {"mode": mode}, space)) for mode in modes]
    return [trial_id for trial_id, _ in fleet.store.add_trials(campaign.id, fleet.target, new)]


def test_cheap_trials_share_messages_and_each_is_recorded_once(fleet: Fleet) -> None:
    campaign = noop_campaign(fleet, "cheap", Knob("i", tuple(range(300))), Knob("r", (0, 1), build=False))
    batches: list[int] = []
    sizes: list[int] = []

    # A window smaller than the campaign: the driver sends again as trials finish, knowing their pace.
    Driver(fleet.store, campaign, recorded(batches, sizes), window=200).run()

    assert batches[0] == 1  # the first trials go alone: nothing is known of their pace yet
    assert max(batches) > 1
    # Once cheap, trials go out a message's worth at a time, not as they trickle back (the last may be less).
    cheap = [size for size, batch in zip(sizes, batches, strict=True) if batch > 1]
    assert cheap and min(cheap[:-1] or [MAX_BATCH]) >= MAX_BATCH
    assert fleet.store.trial_counts(campaign.id) == {"evaluated": 600}
    assert_each_recorded_once(fleet)


def slow_build_campaign(fleet: Fleet, name: str, *knobs: Knob) -> Campaign:
    """A grid campaign of a command whose builds (one per value of the first knob) take 0.3 s, and runs a few ms."""
    configure(app, Settings.from_env(fleet.env))
    fleet.start_worker()
    spec = CampaignSpec(
        name=name,
        problems=[ProblemSpec(name, {})],
        target=fleet.target,
        space=Space(knobs),
        strategy={"name": "grid"},
        workload={
            "kind": "command",
            "build": [sys.executable, "-c", "import time; time.sleep(0.3)", f"{{{knobs[0].name}}}"],
            "run": ["sh", "-c", "echo '{\"score\": 1}'"],
            "objective": {"json": "score"},
            "repeats": 1,
        },
    )
    return submit(fleet.store, spec)


def test_trials_each_built_for_long_go_one_to_a_message_however_cheap_their_runs(fleet: Fleet) -> None:
    # A grid of compiler flags: its messages are compile messages, and its builds are what takes time.
    campaign = slow_build_campaign(fleet, "flags", Knob("i", tuple(range(12))))
    batches: list[int] = []

    driver = Driver(fleet.store, campaign, recorded(batches), window=4)
    driver.run()

    assert driver.pace.build is not None and driver.pace.build > 0.3 and not driver.pace.cheap
    assert set(batches) == {1}
    assert fleet.store.trial_counts(campaign.id) == {"evaluated": 12}


def test_trials_sharing_a_few_long_builds_go_many_to_a_message(fleet: Fleet) -> None:
    # Run-time knobs over two builds: each build is slow, each trial is not.
    campaign = slow_build_campaign(fleet, "shared-builds", Knob("b", (0, 1)), Knob("i", tuple(range(200)), build=False))
    batches: list[int] = []

    driver = Driver(fleet.store, campaign, recorded(batches), window=200)
    driver.run()

    # Taken per build rather than per trial, the builds kept every trial to a message of its own. The first
    # window goes one to a message (nothing was known), and how much of the rest shares messages depends on
    # how soon the first trials come back (90 and 154 of the 199 after it, in two runs).
    assert driver.pace.build is not None and driver.pace.build <= CHEAP_SECONDS
    assert max(batches) > 1
    assert fleet.store.trial_counts(campaign.id) == {"evaluated": 400}
    assert_each_recorded_once(fleet)


def test_a_static_campaign_submitted_without_a_driver_sends_every_trial_at_once(fleet: Fleet) -> None:
    campaign = noop_campaign(fleet, "detached", Knob("i", tuple(range(50))))
    batches: list[int] = []

    Driver(fleet.store, campaign, recorded(batches)).submit_all()  # what fleet tune --detach does

    assert batches == [1]  # every trial, one to a message: no driver stays to learn their pace
    assert len(fleet.store.trials(campaign.id)) == 50
    fleet.wait_for(lambda: fleet.store.trial_counts(campaign.id) == {"evaluated": 50}, what="every trial")


def test_a_share_of_the_slots_admits_a_message_of_cheap_trials_per_trial_it_allows(fleet: Fleet) -> None:
    campaign = noop_campaign(fleet, "shared", Knob("i", tuple(range(400))))
    batches: list[int] = []

    # Two trials in flight at one a message, as fleet driver's shares are: cheap trials come a message's worth each.
    driver = Driver(fleet.store, campaign, recorded(batches), window=2, window_for=lambda depth: 2)
    driver.run()

    assert driver.pace.cheap and driver.window == 2 * MAX_BATCH
    assert max(batches) > 1
    assert fleet.store.trial_counts(campaign.id) == {"evaluated": 400}
    assert_each_recorded_once(fleet)


def test_a_worker_killed_in_the_middle_of_a_message_gives_each_of_its_trials_back_once(fleet: Fleet) -> None:
    marker = fleet.home / "killed"
    modes = ["a", "killonce", "bb", "ccc", "dddd", "eeeee"]
    trial_ids = script_trials(fleet, modes, run=[sys.executable, "poison.py", "{mode}", str(marker)])
    # Without the sandbox: in it, a workload can reach neither its worker nor a file outside its scratch.
    fleet.start_worker("--eval-procs", "1", env={"FLEET_SANDBOX": "none"})

    # One message for all six: the second run kills the process measuring them, the others wait in it.
    send([Requeue(trial_id, fleet.target, "compile") for trial_id in trial_ids], batch=len(trial_ids))

    fleet.wait_for(
        lambda: all(t.state in ("evaluated", "errored") for t in trials(fleet)), timeout=90, what="every trial"
    )
    assert marker.exists()
    assert {t.config["mode"]: t.state for t in trials(fleet)} == dict.fromkeys(modes, "evaluated")
    killed = next(t for t in trials(fleet) if t.config["mode"] == "killonce")
    assert killed.attempts == 2  # given back by its lease, measured again
    assert all(t.attempts == 1 for t in trials(fleet) if t.config["mode"] != "killonce")
    assert_each_recorded_once(fleet)


def in_one_message(fleet: Fleet, modes: list[str]) -> tuple[list[Trial], dict[int, set[str]]]:
    """Trials of the script workload, one per mode, sent to a worker of two evaluation slots in one message.

    Returns the trials once each is evaluated, and the tasks (messages) that evaluated each, from its log lines.
    """
    trial_ids = script_trials(fleet, modes)
    fleet.start_worker("--eval-procs", "2")

    send([Requeue(trial_id, fleet.target, "compile") for trial_id in trial_ids], batch=len(trial_ids))

    fleet.wait_for(lambda: all(t.state == "evaluated" for t in trials(fleet)), timeout=90, what="every trial")
    assert_each_recorded_once(fleet)
    tasks: dict[int, set[str]] = {}
    for trial_id, task in re.findall(
        r"trial (\d+) evaluate start \(task (\S+)\)", (fleet.home / "worker.log").read_text()
    ):
        tasks.setdefault(int(trial_id), set()).add(task)
    return trials(fleet), tasks


def test_a_message_of_slow_trials_is_split_once_it_has_held_its_slot_a_second(fleet: Fleet) -> None:
    done, tasks = in_one_message(fleet, [f"sleep0.3{n}" for n in range(8)])

    # The first message ran trials until it had held its slot a second (three or four of them, two when each
    # run's own cost is high); the rest went one to a message.
    first = tasks[done[0].id]
    together = sum(1 for t in done if tasks[t.id] == first)
    assert 2 <= together <= 4
    assert len(set().union(*tasks.values())) == 1 + len(done) - together
    assert len({t.worker for t in done}) == 2  # the other slot took some of them


def test_a_message_of_cheap_trials_that_a_pause_slows_is_not_split(fleet: Fleet) -> None:
    # The first trial takes four times what a cheap one may, but the message holds its slot well under a second:
    # splitting it would add messages when the fleet is busiest (a vacuum, a busy CPU slow every trial).
    done, tasks = in_one_message(fleet, ["sleep0.2", "a", "bb"])

    assert len(set().union(*tasks.values())) == 1
    assert len({t.worker for t in done}) == 1
