"""`fleet call`: one task by hand, on real workers, PostgreSQL and Redis; and Celery's own `celery call`."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def small_spec(fleet: Fleet) -> dict:
    spec = kernel_spec(fleet)
    spec["workload"] = {**spec["workload"], "warmup": 0, "repeats": 2}
    spec["baseline"] = None
    del spec["baseline"]
    return spec


def call(fleet: Fleet, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return fleet.cli("call", *args, check=check, timeout=180)


def test_call_measures_one_configuration_in_an_adhoc_campaign(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "1")
    spec = write_spec(fleet.home, small_spec(fleet))
    fleet.cli("tune", str(spec), "--json", check=True)

    # A configuration outside the space: its values need not be the campaign's, only its knobs.
    done = call(fleet, "evaluate", "--problem", "kernel", "--config", '{"size": 3, "scale": 7}', "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "evaluated"
    assert result["campaign"] == "kernel.adhoc"
    assert result["objective"] == 21.0  # the kernel scores SIZE * scale
    assert result["samples"] == [21.0, 21.0]
    assert result["worker"].startswith("eval-cpu0@")
    adhoc = fleet.store.campaign("kernel.adhoc")
    assert adhoc.status == "adhoc" and adhoc.target == fleet.target
    assert fleet.store.trial(result["trial"]).campaign_id == adhoc.id

    # Measured by the campaign already: answered from the database, unless --remeasure asks again.
    again = json.loads(call(fleet, "evaluate", "-p", "kernel", "--config", '{"size": 2, "scale": 10}', "--json").stdout)
    assert again["objective"] == 20.0 and again["measured_before"] and again["campaign"] == "kernel"
    fresh = call(fleet, "evaluate", "-p", "kernel", "--config", '{"size": 2, "scale": 10}', "--remeasure")
    assert "score     20" in fresh.stdout and "measured before" not in fresh.stdout

    # compile waits for the artifact only; the trial goes on to be measured, as the fleet always does.
    compiled = json.loads(
        call(fleet, "compile", "-p", "kernel", "--config", '{"size": 5, "scale": 1}', "--json").stdout
    )
    assert compiled["state"] in ("compiled", "evaluating", "evaluated")
    assert compiled["artifact"]["state"] == "built"
    fleet.wait_for(lambda: fleet.store.trial(compiled["trial"]).state == "evaluated", what="the compiled trial")

    # --no-wait prints the Celery task id at once; the result lands in the database.
    task_id = call(fleet, "evaluate", "-p", "kernel", "--config", '{"size": 6, "scale": 1}', "--no-wait").stdout.strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", task_id)
    trial = next(t for t in fleet.store.trials(adhoc.id) if t.config == {"size": 6, "scale": 1})
    fleet.wait_for(lambda: fleet.store.trial(trial.id).state == "evaluated", what="the --no-wait trial")

    # anneal-step: a one-step chain that starts at the configuration.
    step = json.loads(
        call(fleet, "anneal-step", "-p", "kernel", "--config", '{"size": 4, "scale": 3}', "--json").stdout
    )
    assert step["step"] == 0 and step["accepted"] is True and step["objective"] == 12.0
    [chain] = fleet.store.chains(adhoc.id)
    assert chain.state == "done" and chain.config == {"size": 4, "scale": 3}

    # The worker logged each task's start and end with its trial.
    logs = fleet.cli("logs", "--trial", str(result["trial"]), check=True).stdout
    assert f"trial {result['trial']} evaluate start" in logs and f"trial {result['trial']} evaluate end" in logs


def test_call_mistakes_are_one_line(fleet: Fleet) -> None:
    spec = write_spec(fleet.home, small_spec(fleet))
    fleet.cli("tune", str(spec), "--detach", check=True)
    for args, message in [
        (["--config", '{"size": 3}'], "lacks knob 'scale'"),
        (["--config", '{"size": 3, "scale": 1, "x": 1}'], "'x', which is not a knob"),
        (["--config", "size=3"], "--config is not valid JSON"),
        (["--config", '{"size": [1], "scale": 1}'], "is not a bool, number or string"),
    ]:
        done = call(fleet, "evaluate", "-p", "kernel", *args, check=False)
        assert done.returncode == 1 and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1
    done = call(fleet, "evaluate", "-p", "nosuch", "--config", "{}", check=False)
    assert done.returncode == 1 and "no problem 'nosuch'" in done.stderr
    done = call(fleet, "evaluate", "-p", "kernel", "-t", "cpu-other", "--config", "{}", check=False)
    assert done.returncode == 1 and "--spec SPEC" in done.stderr
    assert [c.name for c in fleet.store.campaigns()] == ["kernel"]  # nothing written half way


def celery(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """Celery's own command line, on Fleet's app, in this installation's environment."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "fleet.tasks", *args],
        env=fleet.env,
        cwd=fleet.home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"celery {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def queues(fleet: Fleet) -> dict[str, dict]:
    status = json.loads(fleet.cli("status", "--json", check=True).stdout)
    return {q["queue"]: q for q in status["queues"]}


def test_celery_call_routes_fleet_tasks_by_target(fleet: Fleet) -> None:
    spec = write_spec(fleet.home, small_spec(fleet), name="adhoc.json")
    # --spec: no campaign has to exist; --no-send writes the trial and prints its id, for `celery call`.
    trial_id = int(
        call(
            fleet, "evaluate", "--spec", str(spec), "-p", "kernel", "--config", '{"size": 3, "scale": 2}', "--no-send"
        ).stdout.strip()
    )
    assert fleet.store.trial(trial_id).state == "new"

    kwargs = json.dumps({"trial_id": trial_id, "target": fleet.target})
    sent = celery(fleet, "call", "fleet.compile", "--kwargs", kwargs).stdout.strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", sent)
    celery(fleet, "call", "fleet.evaluate", "--kwargs", kwargs)
    # The router read the target: each task waits in its kind's queue of that target, and nobody consumes them.
    found = queues(fleet)
    assert found[f"build.{fleet.target}"]["waiting"] == 1
    assert found[f"eval.{fleet.target}"]["waiting"] == 1
    assert (
        found[f"eval.{fleet.target}"]["warning"]
        == f"eval.{fleet.target}: 1 messages wait and no worker consumes the queue"
    )

    fleet.start_worker()
    fleet.wait_for(lambda: fleet.store.trial(trial_id).state == "evaluated", what="the trial sent with celery call")
    # The early evaluate found the trial not built and did nothing; the compile sent the real one.
    result = json.loads(
        call(
            fleet, "evaluate", "--spec", str(spec), "-p", "kernel", "--config", '{"size": 3, "scale": 2}', "--json"
        ).stdout
    )
    assert result["trial"] == trial_id and result["objective"] == 6.0
    fleet.wait_for(
        lambda: all(q["waiting"] == 0 and not q["unacked"] for q in queues(fleet).values()), what="empty queues"
    )


def test_call_tvm_measure_times_one_schedule(fleet: Fleet) -> None:
    from fleet.driving.campaign import submit
    from fleet.tvm.models import tiny_cnn
    from fleet.tvm.tune import campaign_spec

    dense = tiny_cnn(1)[2]
    spec = campaign_spec(dense, fleet.target, budget=1)
    campaign = submit(fleet.store, spec)  # a campaign of the operator, never driven: `fleet call` tries one schedule
    [problem] = fleet.store.campaign_problems(campaign.id)
    config = next(iter(spec.space))
    fleet.start_worker("--build-procs", "1")

    done = call(fleet, "tvm-measure", "-p", str(problem.id), "--config", json.dumps(config), "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "evaluated" and result["campaign"] == f"{campaign.name}.adhoc"
    assert result["objective_name"] == "gflops" and result["objective"] > 0 and result["metrics"]["correct"] is True
    assert result["worker"].startswith("eval-cpu0@")
    logs = fleet.cli("logs", "--trial", str(result["trial"]), check=True).stdout
    assert f"trial {result['trial']} tvm_measure end: evaluated" in logs
