"""A campaign end to end: CLI, real PostgreSQL, real Redis, real worker processes, real gcc."""

from __future__ import annotations

import json
import shutil

from sqlalchemy import func, select

from fleet.store import Artifact, Measurement, Trial
from tests.conftest import ROOT, Fleet, write_spec


def kernel_spec(fleet: Fleet, **overrides: object) -> dict:
    shutil.copy(ROOT / "tests" / "data" / "kernel.c", fleet.home / "kernel.c")
    spec = {
        "name": "kernel",
        "target": fleet.target,
        "problems": [{"kind": "kernel", "params": {"sleep": 0}, "tags": ["test"]}],
        "space": {"knobs": {"size": [2, 3, 4], "scale": {"values": [1, 10], "build": False}}},
        "strategy": {"name": "grid"},
        "baseline": {"size": 1},
        "workload": {
            "kind": "command",
            "sources": ["kernel.c"],
            "build": ["gcc", "-O1", "-DSIZE={size}", "kernel.c", "-o", "kernel"],
            "artifacts": ["kernel"],
            "run": ["./kernel", "{scale}", "{sleep}"],
            "objective": {"json": "score", "goal": "max"},
            "warmup": 1,
            "repeats": 3,
        },
    }
    spec.update(overrides)
    return spec


def test_tune_builds_each_key_once_and_reports_the_best(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "2")
    spec = write_spec(fleet.home, kernel_spec(fleet))

    done = fleet.cli("tune", str(spec), "--json", check=True)

    result = json.loads(done.stdout)
    problem = result["problems"][0]
    assert problem["trials"] == {"evaluated": 8}  # 6 configurations and the baseline at both scales
    assert problem["best"]["config"] == {"size": 4, "scale": 10}
    assert problem["best"]["score"] == 40.0
    assert problem["baseline"]["config"] == {"size": 1, "scale": 10}
    assert problem["speedup"] == 4.0
    with fleet.store.session() as session:
        assert session.scalar(select(func.count()).select_from(Artifact)) == 4  # sizes 1 (the baseline), 2, 3, 4
        assert session.scalar(select(func.count()).select_from(Measurement)) == 8
        samples = session.scalars(select(Measurement.samples)).all()
        assert all(len(s) == 3 for s in samples)  # the warm-up run is not kept

    best = fleet.cli("best", "--kind", "kernel", "--target", fleet.target, "--json", check=True)
    assert json.loads(best.stdout)["config"] == {"size": 4, "scale": 10}

    status = fleet.cli("status", "kernel", check=True)
    assert "evaluated 8" in status.stdout


def test_measured_configurations_are_not_measured_again(fleet: Fleet) -> None:
    fleet.start_worker()
    first = write_spec(fleet.home, kernel_spec(fleet))
    fleet.cli("tune", str(first), check=True)
    second = write_spec(fleet.home, kernel_spec(fleet, name="again"), name="again.json")

    done = fleet.cli("tune", str(second), "--json", check=True)

    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 8}
    with fleet.store.session() as session:
        assert session.scalar(select(func.count()).select_from(Measurement)) == 8
        reused = session.scalar(select(func.count()).select_from(Trial).where(Trial.source_trial_id.is_not(None)))
        assert reused == 8


def test_export_steps_writes_every_trial_with_its_statistics(fleet: Fleet) -> None:
    import csv

    fleet.start_worker()
    spec = write_spec(fleet.home, kernel_spec(fleet))
    fleet.cli("tune", str(spec), check=True)
    out = fleet.home / "steps.csv"

    done = fleet.cli("trials", "kernel", "--csv", "-o", str(out), check=True)

    assert "8 trials of campaign kernel" in done.stdout
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8
    assert {"size", "scale", "objective", "samples", "best_so_far", "build_seconds", "worker"} <= set(rows[0])
    assert all(len(r["samples"].split(";")) == 3 for r in rows)
    # Its compile's and its evaluation's time on workers' slots: parts of the step, which counts its wait too. A
    # trial handed to another's build has no compile time of its own; each build has one trial that does.
    # The slots' seconds are the workers' laps; the step is two timestamps that two workers (build, evaluation)
    # record on the database's clock, each through its own estimate of its offset, which is off by up to half a
    # round trip: 60 ms under a parallel test run.
    for r in rows:
        assert 0 < float(r["compile_seconds"] or 0) + float(r["eval_seconds"]) <= float(r["step_seconds"]) + 0.25
    assert sum(bool(r["compile_seconds"]) for r in rows) >= len({r["size"] for r in rows})
    assert max(float(r["best_so_far"]) for r in rows) == 40.0
    missing = fleet.cli("trials", "nope", "--csv", "-o", str(fleet.home / "x.csv"))
    assert missing.returncode == 1 and "no campaign 'nope'" in missing.stderr
    assert not (fleet.home / "x.csv").exists()


def test_a_recorded_space_replays_on_real_workers(fleet: Fleet) -> None:
    import gzip

    from tests.conftest import SPACES

    with gzip.open(SPACES / "pnpoly__RTX_2080_Ti.json.gz") as handle:
        recorded = json.loads(handle.read())
    spec = {
        "name": "replay",
        "target": fleet.target,
        "problems": [{"kind": "pnpoly", "params": {}}],
        "space": {"knobs": recorded["tune_params"]},
        "strategy": {"name": "auto", "budget": 24, "seed": 1},
        "workload": {"kind": "replay", "space": "pnpoly__RTX_2080_Ti.json.gz"},
    }
    fleet.start_worker()
    path = write_spec(fleet.home, spec)

    done = fleet.cli("tune", str(path), "--json", check=True, timeout=300)

    problem = json.loads(done.stdout)["problems"][0]
    assert sum(problem["trials"].values()) <= 24
    best = problem["best"]
    key = ",".join(str(best["config"][k]) for k in recorded["tune_params_keys"])
    assert best["time_ms"] == recorded["cache"][key]["time"]  # the answer is the recorded time
    assert best["metrics"]["benchmark_s"] > 0
