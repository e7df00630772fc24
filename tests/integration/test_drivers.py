"""Campaigns as a service, on real PostgreSQL, Redis, `fleet driver` and `fleet worker` processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from fleet.store import Campaign, Measurement, Trial
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec

LEASE = "3"


def slow_spec(fleet: Fleet, name: str, sleep: float, **overrides: object) -> Path:
    """The test kernel over 16 configurations, each measurement taking ``sleep`` seconds."""
    spec = kernel_spec(fleet, name=name, **overrides)
    spec["problems"] = [{"kind": "kernel", "params": {"sleep": sleep}}]
    spec["space"] = {"knobs": {"size": [1, 2, 3, 4, 5, 6, 7, 8], "scale": {"values": [1, 10], "build": False}}}
    spec.pop("baseline")
    spec["workload"] = {**spec["workload"], "warmup": 0, "repeats": 1}
    return write_spec(fleet.home, spec, f"{name}.json")


def start_driver(fleet: Fleet, name: str) -> subprocess.Popen[bytes]:
    with (fleet.home / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", "driver", "--name", name],
            env={**fleet.env, "FLEET_DRIVER_LEASE_SECONDS": LEASE},
            cwd=fleet.home,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    fleet.procs.append(proc)
    fleet.wait_for(lambda: any(w.name == name for w in fleet.store.workers(role="driver", within=5)), what=name)
    return proc


def campaign(fleet: Fleet, name: str) -> Campaign:
    return fleet.store.campaign(name)


def counts(fleet: Fleet, name: str) -> dict[str, int]:
    return fleet.store.trial_counts(campaign(fleet, name).id)


def recorded_once(fleet: Fleet, name: str) -> None:
    """Every finished trial has one measurement, and no configuration was tried twice."""
    with fleet.store.session() as session:
        cid = campaign(fleet, name).id
        evaluated = session.scalar(select(func.count()).where(Trial.campaign_id == cid, Trial.state == "evaluated"))
        measured = session.scalar(
            select(func.count()).select_from(Measurement).join(Trial).where(Trial.campaign_id == cid)
        )
        configs = session.scalars(select(Trial.config_key).where(Trial.campaign_id == cid)).all()
    assert evaluated == measured
    assert len(configs) == len(set(configs))


def test_a_campaign_submitted_from_a_process_that_exits_runs_to_its_end(fleet: Fleet) -> None:
    fleet.start_worker()
    start_driver(fleet, "driver-a")
    spec = slow_spec(fleet, "walkaway", 0)
    code = f"import fleet; h = fleet.submit({str(spec)!r}, priority=2); print(h.name, h.status()['status'])"

    submitted = subprocess.run(
        [sys.executable, "-c", code], env=fleet.env, cwd=fleet.home, capture_output=True, text=True, check=True
    )

    assert submitted.stdout.split() == ["walkaway", "running"]
    fleet.wait_for(lambda: campaign(fleet, "walkaway").status == "done", timeout=120, what="the campaign to end")
    assert counts(fleet, "walkaway") == {"evaluated": 16}
    assert campaign(fleet, "walkaway").priority == 2
    # Let go at the end: after the campaign is marked done, so that no other driver takes it meanwhile.
    fleet.wait_for(lambda: campaign(fleet, "walkaway").driver is None, timeout=30, what="the driver to let go")
    recorded_once(fleet, "walkaway")
    status = json.loads(fleet.cli("status", "--json", check=True).stdout)
    drivers = [w for w in status["workers"] if w["role"] == "driver"]
    assert [(d["name"], d["drives"]) for d in drivers] == [("driver-a", [])]


def test_cli_submit_returns_at_once_and_names_what_to_run_next(fleet: Fleet) -> None:
    spec = slow_spec(fleet, "later", 0)

    done = fleet.cli("submit", str(spec), "--priority", "3", check=True)

    assert "submitted campaign later" in done.stdout
    assert "fleet status later" in done.stdout
    assert "no `fleet driver` is running" in done.stderr
    found = campaign(fleet, "later")
    assert (found.submitted, found.priority, found.status) == (True, 3.0, "running")
    assert counts(fleet, "later") == {}


def test_a_sigkilled_driver_of_a_dynamic_campaign_is_replaced_and_no_trial_is_lost_or_measured_twice(
    fleet: Fleet,
) -> None:
    fleet.start_worker()
    first = start_driver(fleet, "driver-a")
    # Long enough measurements that the driver is killed half way, whatever the machine's load.
    spec = slow_spec(fleet, "dynamic", 1.0, strategy={"name": "anneal", "budget": 12, "seed": 1})
    fleet.cli("submit", str(spec), check=True)
    fleet.wait_for(lambda: counts(fleet, "dynamic").get("evaluated", 0) >= 3, timeout=120, what="3 trials")
    assert campaign(fleet, "dynamic").driver == "driver-a"
    shown = fleet.cli("status", check=True).stdout
    assert "driven by driver-a, priority 1" in shown
    assert any(line.split()[:1] == ["driver-a"] and line.endswith("drives dynamic") for line in shown.splitlines())

    first.send_signal(signal.SIGKILL)
    first.wait()
    killed = time.monotonic()
    # Trials the killed driver had sent are measured, not lost; the new driver's searcher, replaying what
    # finished in another order, may not propose all of them again.
    orphans = sum(n for state, n in counts(fleet, "dynamic").items() if state != "evaluated")
    start_driver(fleet, "driver-b")
    fleet.wait_for(lambda: campaign(fleet, "dynamic").driver == "driver-b", timeout=60, what="driver-b to take over")
    takeover = time.monotonic() - killed

    fleet.wait_for(lambda: campaign(fleet, "dynamic").status == "done", timeout=180, what="the campaign to end")
    assert takeover < float(LEASE) + 10
    found = counts(fleet, "dynamic")
    # The budget is the campaign's: the new driver's searcher may propose other configurations than the
    # first one's, and none of them is a trial past 12 (there were 12 + the orphans).
    assert found == {"evaluated": 12}, (found, orphans)
    recorded_once(fleet, "dynamic")


def test_cancel_stops_the_running_measurement_and_starts_nothing_new(fleet: Fleet) -> None:
    fleet.start_worker()
    start_driver(fleet, "driver-a")
    spec = slow_spec(fleet, "doomed", 30)
    fleet.cli("submit", str(spec), check=True)
    fleet.wait_for(lambda: counts(fleet, "doomed").get("evaluating", 0) >= 1, timeout=120, what="a measurement")
    fleet.wait_for(lambda: measuring("30"), timeout=30, what="the 30 s measurement to run")

    done = fleet.cli("cancel", "doomed", check=True)
    cancelled_at = time.monotonic()

    assert done.stdout.startswith("cancelled campaign doomed: trials cancelled:")
    # The worker's lease renewal fails, and it kills the measurement: the worker is free again long before 30 s
    # (often before `fleet cancel` itself has exited).
    fleet.wait_for(lambda: not measuring("30"), timeout=10, what="the running measurement to be killed")
    assert time.monotonic() - cancelled_at < 10
    time.sleep(3)
    found = campaign(fleet, "doomed")
    assert found.status == "cancelled"
    trials = counts(fleet, "doomed")
    assert set(trials) == {"cancelled"}, trials
    with fleet.store.session() as session:
        assert session.scalar(select(func.count()).select_from(Measurement)) == 0

    again = fleet.cli("cancel", "doomed")
    assert again.returncode != 0
    assert again.stderr.strip().splitlines() == [
        "fleet: error: cannot cancel campaign 'doomed': it has ended (cancelled)"
    ]


def test_a_campaign_of_cheap_trials_joining_a_running_one_gets_its_share(fleet: Fleet) -> None:
    # Several trials to a message, whose windows are sized from the workers' time per trial. Sized from how
    # fast each campaign's own trials came back, the running one kept its lead: the newcomer got 1-18%.
    from fleet import api
    from fleet.bench.share import cheap_spec, joined_shares

    fleet.start_worker()
    start_driver(fleet, "driver-a")
    first = write_spec(fleet.home, cheap_spec("alone", fleet.target, 3000), "alone.json")
    fleet.cli("submit", str(first), check=True)
    fleet.wait_for(lambda: counts(fleet, "alone").get("evaluated", 0) >= 300, timeout=120, what="a tenth")
    # Early, and through the API in this process: the first campaign's last three quarters took its one worker
    # about 4 s, and a `fleet submit` on a loaded machine took as long, so the second began as the first ended and
    # had no time left to get its share (0 to 1%, and 28% with the API but three quarters left).
    api.submit(cheap_spec("joining", fleet.target, 1500), fleet.store)
    ids = campaign(fleet, "alone").id, campaign(fleet, "joining").id

    fleet.wait_for(lambda: all(fleet.store.campaign(i).status == "done" for i in ids), timeout=300, what="both")

    # Its first half includes its start behind the other's queue; by its second it has its share.
    assert 0.35 <= joined_shares(fleet.store, *ids)["share_second_half"] <= 0.65
    for name in ("alone", "joining"):
        recorded_once(fleet, name)


def test_pause_holds_new_trials_and_resume_goes_on(fleet: Fleet) -> None:
    fleet.start_worker()
    start_driver(fleet, "driver-a")
    spec = slow_spec(fleet, "held", 1.0)  # 14 trials left outlast a loaded machine's `fleet pause`
    fleet.cli("submit", str(spec), check=True)
    fleet.wait_for(lambda: counts(fleet, "held").get("evaluated", 0) >= 2, timeout=120, what="2 trials")

    fleet.cli("pause", "held", check=True)
    fleet.wait_for(
        lambda: not {"compiling", "evaluating"} & set(counts(fleet, "held")), timeout=30, what="running trials"
    )
    settled = counts(fleet, "held").get("evaluated")
    time.sleep(3)

    # The driver may write a trial it proposed before it saw the pause; no trial starts.
    assert counts(fleet, "held").get("evaluated") == settled
    assert not {"compiling", "evaluating"} & set(counts(fleet, "held"))
    assert campaign(fleet, "held").status == "paused"
    twice = fleet.cli("pause", "held")
    assert twice.returncode != 0
    assert "it is paused already" in twice.stderr
    fleet.cli("resume", "held", check=True)
    fleet.wait_for(lambda: campaign(fleet, "held").status == "done", timeout=120, what="the campaign to end")
    assert counts(fleet, "held") == {"evaluated": 16}
    recorded_once(fleet, "held")


def test_steering_what_does_not_exist_is_one_line_and_an_error(fleet: Fleet) -> None:
    for command in ("cancel", "pause", "resume"):
        done = fleet.cli(command, "no-such-campaign")
        assert done.returncode != 0
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("fleet: error: no campaign 'no-such-campaign' in postgresql"), line
    bad = fleet.cli("submit", str(write_spec(fleet.home, {"name": "x"}, "bad.json")))
    assert bad.returncode != 0
    assert len(bad.stderr.strip().splitlines()) == 1
    assert fleet.store.campaigns() == []


def measuring(seconds: str) -> bool:
    """Whether a test kernel that sleeps ``seconds`` runs on this machine (a measurement of this test)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [b"./kernel"] and argv[2:3] == [seconds.encode()]:
            return True
    return False


def test_the_python_handle_steers_and_refuses_what_cannot_be_done(fleet: Fleet, monkeypatch: object) -> None:
    import pytest

    import fleet as api
    from fleet.settings import reset_settings
    from fleet.store import SteeringError

    for key, value in fleet.env.items():
        if key.startswith("FLEET_"):
            monkeypatch.setenv(key, value)  # type: ignore[attr-defined]
    reset_settings()
    spec = json.loads(slow_spec(fleet, "steered", 0).read_text())
    monkeypatch.chdir(fleet.home)  # type: ignore[attr-defined]

    handle = api.submit(spec, priority=2)

    assert api.campaign("steered").id == handle.id
    assert [c.name for c in api.campaigns()] == ["steered"]
    handle.pause()
    with pytest.raises(SteeringError, match="it is paused already"):
        handle.pause()
    handle.resume()
    with pytest.raises(SteeringError, match="it is not paused"):
        handle.resume()
    assert handle.cancel() == {}  # no driver wrote a trial yet
    with pytest.raises(SteeringError, match=r"it has ended \(cancelled\)"):
        handle.cancel()
    assert [s.best for s in handle.wait(timeout=5)] == [None]  # a cancelled campaign ends the wait, no error
    assert handle.status()["status"] == "cancelled"
    assert handle.trials() == []
    reset_settings()


def test_a_driver_that_takes_over_never_runs_the_campaign_past_its_budget(fleet: Fleet) -> None:
    """The first driver's searcher sent 3 configurations that the next one's would not propose (as Optuna's
    TPE, fed its runs in another order, does not): the campaign still ends with its budget of 6 trials."""
    from fleet.driving.campaign import submit
    from fleet.keys import trial_keys
    from fleet.search import make_searcher
    from fleet.spec import load_spec
    from fleet.store import NewTrial

    fleet.start_worker()
    path = slow_spec(fleet, "takeover", 0, strategy={"name": "random", "budget": 6, "seed": 1})
    spec = load_spec(path)
    created = submit(fleet.store, spec)
    [problem] = fleet.store.campaign_problems(created.id)
    proposed = list(make_searcher("random", spec.space, budget=6, seed=1).generate())
    others = [c for c in spec.space if c not in proposed][:3]
    fleet.store.add_trials(
        created.id,
        fleet.target,
        [NewTrial(problem.id, c, *trial_keys(created, problem.id, c, spec.space), seq=i) for i, c in enumerate(others)],
    )

    fleet.cli("resume", "takeover", check=True, env={"FLEET_REQUEUE_SECONDS": "2"})

    assert campaign(fleet, "takeover").status == "done"
    assert counts(fleet, "takeover") == {"evaluated": 6}  # before: 9, the 3 the first driver sent and 6 more
    recorded_once(fleet, "takeover")
