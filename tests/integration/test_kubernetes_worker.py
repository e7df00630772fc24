"""The worker containers of deploy/kubernetes/ started as the kubelet would: the Deployments' own command and
environment, the fleet's URLs read from Secret files, against real Redis and PostgreSQL. A campaign runs on them,
and SIGTERM mid-trial (what a scale-down or a rollout sends) drains the evaluation worker well within the pod's
terminationGracePeriodSeconds, losing and repeating no trial."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from fleet.ops.kubernetes import HOME, SECRET_FOLDER, target_objects
from fleet.store import Measurement, Trial
from tests.conftest import Fleet, write_spec

RUN = """import json, sys, time
time.sleep(float(sys.argv[2]))
print(json.dumps({"score": int(sys.argv[1])}))
"""


def container(fleet: Fleet, deployment: dict[str, Any]) -> tuple[list[str], dict[str, str], int]:
    """The container's argv, environment and grace period, its mounts laid out under the test's home: the Secret
    as files (0440, as the kubelet writes them), FLEET_HOME and /tmp as empty folders."""
    pod = deployment["spec"]["template"]["spec"]
    spec = pod["containers"][0]
    secrets = fleet.home / "secrets"
    secrets.mkdir(exist_ok=True)
    for key, name in (("database-url", "FLEET_DATABASE_URL"), ("broker-url", "FLEET_BROKER_URL")):
        (secrets / key).write_text(fleet.env[name])
        (secrets / key).chmod(0o440)
    home = fleet.home / "var-lib-fleet"
    home.mkdir(exist_ok=True)
    moved = {SECRET_FOLDER: str(secrets), HOME: str(home)}
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "FLEET_HEARTBEAT_SECONDS": "0.5"}
    for variable in spec["env"]:
        value = variable["value"]
        for inside, outside in moved.items():
            value = value.replace(inside, outside)
        env[variable["name"]] = value
    argv = [str(Path(sys.executable).parent / spec["command"][0]), *spec["command"][1:]]
    return argv, env, pod["terminationGracePeriodSeconds"]


def test_worker_pods_run_a_campaign_from_secret_files_and_drain_on_sigterm(fleet: Fleet) -> None:
    fleet.target = "sm_90"
    evals, builds, *_ = target_objects("sm_90", gpus=1, stop_timeout=60)
    (fleet.home / "run.py").write_text(RUN)
    started = []
    for deployment in (builds, evals):
        argv, env, grace = container(fleet, deployment)
        assert not {"FLEET_DATABASE_URL", "FLEET_BROKER_URL"} & env.keys()
        log = (fleet.home / f"{deployment['metadata']['name']}.log").open("ab")
        proc = subprocess.Popen(
            argv, env=env, cwd=fleet.home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        fleet.procs.append(proc)
        started.append((proc, grace))
    fleet.wait_for(lambda: len(fleet.store.workers(target="sm_90", within=2)) >= 2, timeout=60, what="both pods")
    for worker in fleet.store.workers(target="sm_90", within=2):
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes()
        assert b"FLEET_DATABASE_URL=" not in environ and b"FLEET_BROKER_URL=" not in environ

    spec = write_spec(
        fleet.home,
        {
            "name": "pods",
            "target": "sm_90",
            "problems": [{"kind": "pods", "params": {}}],
            "space": {"knobs": {"x": {"values": [0, 1, 2, 3], "build": False}}},
            "workload": {
                "kind": "command",
                "sources": ["run.py"],
                "run": [sys.executable, "run.py", "{x}", "2"],
                "objective": {"json": "score"},
                "repeats": 1,
            },
        },
    )
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec), "--json"],
        env=fleet.env, cwd=fleet.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    fleet.wait_for(lambda: _count(fleet, Trial.state == "evaluating") == 1, timeout=60, what="a trial evaluating")
    eval_proc, grace = started[1]
    stopped = time.monotonic()
    eval_proc.send_signal(signal.SIGTERM)  # the kubelet's stop: to the container's first process
    assert eval_proc.wait(timeout=grace) == 0
    took = time.monotonic() - stopped
    assert took < grace, took
    assert _count(fleet, Trial.state == "evaluated") >= 1  # the running trial finished before the worker left

    # A new pod (KEDA's next scale-up) finishes the campaign.
    argv, env, _ = container(fleet, evals)
    with (fleet.home / "eval-2.log").open("ab") as log:
        fleet.procs.append(
            subprocess.Popen(
                argv, env=env, cwd=fleet.home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    out, err = tune.communicate(timeout=180)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 4}
    with fleet.store.session() as session:
        measured = dict(
            session.execute(select(Measurement.trial_id, func.count()).group_by(Measurement.trial_id)).all()
        )
    assert sorted(measured.values()) == [1, 1, 1, 1]  # none lost, none measured twice


def _count(fleet: Fleet, condition: Any) -> int:
    with fleet.store.session() as session:
        return int(session.scalar(select(func.count()).select_from(Trial).where(condition)) or 0)
