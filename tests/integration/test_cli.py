"""The command line as a user meets it: mistakes end in one line and a non-zero exit, and write nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.settings import redact
from fleet.store import Campaign, Problem
from tests.conftest import ROOT, Fleet, write_spec


def good_spec(fleet: Fleet) -> dict:
    shutil.copy(ROOT / "tests" / "data" / "whoami.py", fleet.home / "whoami.py")
    return {
        "name": "cli",
        "target": fleet.target,
        "problems": [{"kind": "whoami", "params": {}}],
        "space": {"knobs": {"x": {"values": [1, 2], "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["whoami.py"],
            "run": [sys.executable, "whoami.py"],
            "objective": {"json": "score"},
        },
    }


def assert_one_line_error(done: object, contains: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)  # type: ignore[attr-defined]
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, done.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("fleet: error: ")
    assert contains in lines[0], lines[0]


def assert_nothing_written(fleet: Fleet) -> None:
    with fleet.store.session() as session:
        assert session.scalar(select(func.count()).select_from(Campaign)) == 0
        assert session.scalar(select(func.count()).select_from(Problem)) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["space"]["knobs"].update(y=[[1, 2]]), "knob 'y': [1, 2] is not a bool, number or string"),
        (lambda s: s["space"]["knobs"].update(y=[None]), "knob 'y': None is not a bool, number or string"),
        (lambda s: s.update(target="gpu9000"), "unknown target 'gpu9000'"),
        (lambda s: s.update(strategy={"name": "magic"}), "unknown strategy 'magic'"),
        (lambda s: s["workload"].update(run="python3 whoami.py"), "a shell string is not allowed"),
        (lambda s: s["workload"].update(run=["./x", "{nope}"]), "uses {nope}, which is neither a knob"),
        (lambda s: s.update(problems=[]), "'problems' must be a non-empty list"),
        (lambda s: s.update(extra=1), "unknown field 'extra'"),
        (
            lambda s: s["space"].update(constraints=["x > 2"]),
            "the space's constraints leave no configuration to try: 'x > 2' is false for all 2 configurations",
        ),
    ],
)
def test_a_bad_spec_is_one_line_and_writes_nothing(fleet: Fleet, change: object, message: str) -> None:
    spec = good_spec(fleet)
    change(spec)  # type: ignore[operator]
    path = write_spec(fleet.home, spec)

    assert_one_line_error(fleet.cli("tune", str(path)), message)
    assert_nothing_written(fleet)


def test_a_file_that_is_not_json_or_not_there(fleet: Fleet) -> None:
    broken = fleet.home / "broken.json"
    broken.write_text("{not json")
    assert_one_line_error(fleet.cli("tune", str(broken)), "not valid JSON")
    assert_one_line_error(fleet.cli("tune", str(fleet.home / "missing.json")), "No such file")
    assert_nothing_written(fleet)


def test_unknown_target_on_the_command_line(fleet: Fleet) -> None:
    path = write_spec(fleet.home, good_spec(fleet))
    assert_one_line_error(fleet.cli("tune", str(path), "--target", "sm90"), "unknown target 'sm90'")
    assert_one_line_error(fleet.cli("best", "--kind", "whoami", "--target", "gfx"), "unknown target 'gfx'")
    assert_one_line_error(fleet.cli("worker", "--target", "tpu-v5"), "unknown target 'tpu-v5'")
    assert_nothing_written(fleet)


def test_a_database_that_does_not_answer(fleet: Fleet) -> None:
    url = "postgresql+psycopg2://fleet@127.0.0.1:1/fleet"
    done = fleet.cli("status", env={"FLEET_DATABASE_URL": url})
    assert_one_line_error(done, "database postgresql+psycopg2://fleet@127.0.0.1:1/fleet does not answer")
    path = write_spec(fleet.home, good_spec(fleet))
    assert_one_line_error(fleet.cli("tune", str(path), env={"FLEET_DATABASE_URL": url}), "does not answer")


def test_a_broker_that_does_not_answer_writes_nothing(fleet: Fleet) -> None:
    path = write_spec(fleet.home, good_spec(fleet))
    done = fleet.cli("tune", str(path), env={"FLEET_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert_one_line_error(done, "broker redis://127.0.0.1:1/0 does not answer")
    assert_nothing_written(fleet)


def test_settings_that_cannot_be_used(fleet: Fleet) -> None:
    assert_one_line_error(fleet.cli("status", env={"FLEET_DATABASE_URL": "mysql://x/y"}), "expected a postgresql://")
    assert_one_line_error(fleet.cli("status", env={"FLEET_LEASE_SECONDS": "soon"}), "is not a number")


def test_best_of_an_unknown_problem(fleet: Fleet) -> None:
    assert_one_line_error(fleet.cli("best", "--kind", "nothing", "--target", "cpu-x86_64"), "no problem 'nothing'")


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["tune"],
        ["resume"],
        ["status"],
        ["best"],
        ["worker"],
        ["up"],
        ["db"],
        ["db", "upgrade"],
        ["bench", "dispatch"],
    ],
)
def test_every_command_has_help(fleet: Fleet, command: list[str]) -> None:
    done = fleet.cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: fleet" in done.stdout


def test_gpu_workers_are_pinned_one_per_gpu_and_measure_on_their_own(fleet: Fleet, tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 9.0, GPU-aaaa'\necho '1, NVIDIA H100 80GB HBM3, 9.0, GPU-bbbb'\n"
    )
    smi.chmod(0o755)
    env = {"PATH": f"{tools}:{fleet.env['PATH']}"}
    dry = fleet.cli("worker", "--dry-run", env=env, check=True)
    assert "eval-gpu0@" in dry.stdout and "CUDA_VISIBLE_DEVICES=0" in dry.stdout
    assert "eval-gpu1@" in dry.stdout and "CUDA_VISIBLE_DEVICES=1" in dry.stdout
    fleet.target = "sm_90"
    proc = fleet.start_worker(expect=3, env=env)
    workers = {w.name.split("@")[0]: w for w in fleet.store.workers(target="sm_90")}
    assert set(workers) == {"eval-gpu0", "eval-gpu1", "build-sm_90"}
    assert workers["eval-gpu1"].gpu == "1:NVIDIA H100 80GB HBM3"
    assert workers["eval-gpu0"].queues == ["eval.sm_90"]
    spec = good_spec(fleet)
    spec["space"]["knobs"]["x"]["values"] = list(range(12))
    path = write_spec(fleet.home, spec)

    done = fleet.cli("tune", str(path), "--target", "sm_90", "--json", check=True)

    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 12}
    from fleet.store import Measurement

    with fleet.store.session() as session:
        rows = session.execute(select(Measurement.gpu, Measurement.metrics)).all()
    for gpu, metrics in rows:
        assert int(gpu.split(":")[0]) == metrics["device"]  # each process saw only its own GPU
    fleet.stop(proc)


def test_bench_dispatch_takes_turns_and_reports_medians(fleet: Fleet) -> None:
    done = fleet.cli("bench", "dispatch", "--trials", "20", "--rounds", "2", "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"fleet_trials_per_s", "celery_trials_per_s", "ratio", "fleet_trials_per_message"}
    assert result["fleet_trials_per_message"] >= 1
    rounds = [line for line in done.stderr.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 1/2", "round 2/2"]
    ratios = [float(line.rsplit("ratio ", 1)[1]) for line in rounds]
    assert result["fleet_trials_per_s"] > 0 and result["celery_trials_per_s"] > 0
    assert result["ratio"] == pytest.approx(sum(ratios) / 2, abs=0.002)  # the median of two is their mean


def test_what_a_newcomer_runs_after_a_first_campaign(fleet: Fleet) -> None:
    from tests.integration.test_campaign import kernel_spec

    fleet.start_worker()
    path = write_spec(fleet.home, kernel_spec(fleet))

    done = fleet.cli("tune", str(path), check=True)

    assert f"on {fleet.target}: 6 evaluated + 2 baselines\n" in done.stdout  # the budget, and the baselines apart
    assert "\r" not in done.stderr  # not a terminal: plain lines, not a bar
    assert done.stderr.splitlines()[-1].startswith("kernel: 8/8 trials, ")
    again = fleet.cli("tune", str(path), check=True)  # the same spec again: found, nothing measured, and said
    assert again.stderr.splitlines()[-1].startswith("nothing new measured: every trial of campaign 'kernel'")
    best = fleet.cli("best", "--kind", "kernel", "--json", check=True)  # results on one target: no --target to give
    assert json.loads(best.stdout)["config"] == {"size": 4, "scale": 10}
    steps = fleet.cli("trials", "kernel", "--csv", "-o", "-", check=True)
    assert steps.stdout.splitlines()[0].startswith("problem,problem_params,chain,step,trial,")
    assert len(steps.stdout.splitlines()) == 9
    assert steps.stderr == "8 trials of campaign kernel written to standard output\n"
    assert not (fleet.home / "-").exists()
    database = redact(fleet.env["FLEET_DATABASE_URL"])
    assert fleet.cli("status", check=True).stdout.startswith(f"database: {database}\n")
    assert f"fleet.cli: database: {database}\n" in fleet.cli("-v", "best", "--kind", "kernel", check=True).stderr
    first = fleet.target
    fleet.target = f"cpu-t{uuid.uuid4().hex[:8]}"
    fleet.start_worker(env={"FLEET_NODE_NAME": "second"})  # a node of its own: eval-cpu0@second
    fleet.cli("tune", str(path), "--target", fleet.target, "--name", "kernel-again", check=True)

    both = ", ".join(sorted([first, fleet.target]))
    assert_one_line_error(
        fleet.cli("best", "--kind", "kernel"), f"has results on 2 targets ({both}); give one with --target"
    )
    assert_one_line_error(fleet.cli("best", "--kind", "nothing"), f"no problem 'nothing' in {database}")


def test_up_needs_no_local_when_embedded(fleet: Fleet, tmp_path: Path) -> None:
    from tests.integration.test_embedded import embedded_env

    assert_one_line_error(fleet.cli("up"), "give --local to start this machine's workers on them anyway")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "up"],
        cwd=tmp_path,
        env=embedded_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout=120)
        assert lines and lines[0].startswith("fleet up: database sqlite:///"), proc.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
