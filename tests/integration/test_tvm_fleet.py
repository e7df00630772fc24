"""TVM operators tuned through a real fleet: a `fleet worker` runs `tvm_measure` on the CPU target.

tune-model, fleet best, build_best, run-model, records export/import, and a wrong result recorded invalid.
fleet/tvm/, fleet/tasks/tvm.py, fleet/workers/workloads/tvm.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from sqlalchemy import select

from fleet.driving.campaign import submit, trial_keys
from fleet.settings import Settings
from fleet.space import Space
from fleet.store import Artifact, Measurement, NewTrial, Requeue, Store, Trial
from fleet.tasks import app, configure, send
from fleet.tvm import build_best
from fleet.tvm.models import Layer, tiny_cnn
from fleet.tvm.operators import DENSE, check_problem, random_inputs, reference
from fleet.tvm.tune import campaign_spec
from tests.conftest import Fleet


def _tune(fleet: Fleet, budget: int) -> dict:
    done = fleet.cli(
        "tune-model", "tiny-cnn", "--target", fleet.target, "--batch", "1", "--budget", str(budget), "--json",
        check=True, timeout=240,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_tune_model_best_build_best_run_model_and_records(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker("--build-procs", "1")
    tuned = _tune(fleet, 2)
    layers = tuned["layers"]
    assert [layer["layer"] for layer in layers] == ["conv1", "conv2", "fc"]
    assert all(not layer["skipped"] and layer["gflops"] > 0 for layer in layers)

    with fleet.store.session() as session:
        trials = list(session.scalars(select(Trial)))
        measurements = list(session.scalars(select(Measurement)))
        artifacts = list(session.scalars(select(Artifact)))
    assert len(trials) == 6 and {t.state for t in trials} == {"evaluated"}
    assert all(t.attempts == 1 for t in trials)  # claimed once each, recorded once each
    assert len(measurements) == 6
    for m in measurements:
        assert m.valid and m.objective_name == "gflops" and m.maximize
        assert m.metrics["correct"] is True and m.metrics["time_s"] > 0 and m.metrics["gflops"] == m.objective
        assert m.worker.startswith("eval-") and m.toolchain.startswith("tvm ")
    # tvm_measure builds on the evaluation worker: no build went through the build queue.
    assert all(a.worker.startswith("eval-") for a in artifacts)

    # tvm_measure delivered twice for one trial: claimed, measured and recorded once.
    configure(app, Settings.from_env(fleet.env))
    layer = Layer("tiny", DENSE, check_problem(DENSE, {"m": 4, "n": 8, "k": 4}))
    campaign = submit(fleet.store, campaign_spec(layer, fleet.target, budget=1))
    space = Space.from_dict(campaign.space)
    config = next(iter(space))
    problem_id = fleet.store.add_problem(layer.kind, layer.params)
    build_key, measure_key = trial_keys(campaign, problem_id, config, space)
    [(trial_id, _)] = fleet.store.add_trials(
        campaign.id, fleet.target, [NewTrial(problem_id, config, build_key, measure_key)]
    )
    assert send([Requeue(trial_id, fleet.target, "tvm_measure")] * 2) == 2
    fleet.wait_for(lambda: fleet.store.trial(trial_id).state == "evaluated", timeout=60, what="the duplicate trial")
    time.sleep(1)  # the second delivery has had its chance to (wrongly) measure again
    assert fleet.store.trial(trial_id).attempts == 1
    with fleet.store.session() as session:
        assert len(list(session.scalars(select(Measurement).where(Measurement.trial_id == trial_id)))) == 1

    # Tuned already: a second tune-model measures nothing.
    again = _tune(fleet, 2)
    assert all(layer["skipped"] for layer in again["layers"])

    # fleet best answers for (operator problem, target).
    fc = tiny_cnn(1)[2]
    args = [f"--param={k}={v}" for k, v in fc.params.items() if k in ("m", "n", "k")]
    best = json.loads(
        fleet.cli("best", "--kind", "tvm.dense", *args, "--target", fleet.target, "--json", check=True).stdout
    )
    fc_row = next(layer for layer in layers if layer["layer"] == "fc")
    assert best["gflops"] == fc_row["gflops"] and best["config"] == fc_row["config"]
    assert best["metrics"]["correct"] is True

    # build_best: the compiled operator with the best knobs, nothing tuned.
    compiled = build_best((fc.kind, fc.params), fleet.target, store=fleet.store)
    assert compiled.config == best["config"]
    inputs = random_inputs(fc.kind, fc.params, seed=7)
    np.testing.assert_allclose(compiled(*inputs), reference(fc.kind, fc.params, inputs), rtol=1e-4, atol=1e-4)

    ran = json.loads(
        fleet.cli("run-model", "tiny-cnn", "--target", fleet.target, "--repeats", "2", "--json", check=True).stdout
    )
    assert [r["layer"] for r in ran["layers"]] == ["conv1", "conv2", "fc"]
    assert all(r["tuned"] and r["tuned_s"] > 0 and r["default_s"] > 0 and r["numpy_s"] > 0 for r in ran["layers"])
    assert ran["total"]["tuned_s"] == sum(r["tuned_s"] for r in ran["layers"])

    # Records: export, import into another database, export again: the same file.
    exported = tmp_path / "records.jsonl"
    out = fleet.cli("tvm", "export-records", "-o", str(exported), "--from", "all", check=True).stdout
    assert out.startswith("7 records written")
    lines = exported.read_text().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"problem", "target", "knobs", "time_s", "gflops", "valid", "samples", "provenance"}
    assert first["provenance"]["worker"].startswith("eval-")
    home = fleet.cli("tvm", "import-records", str(exported), check=True).stdout  # where they came from
    assert home.startswith("0 records imported") and "7 already there" in home
    other = {"FLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}"}
    fleet.cli("db", "upgrade", env=other, check=True)
    imported = fleet.cli("tvm", "import-records", str(exported), env=other, check=True).stdout
    assert imported.startswith("7 records imported")
    assert "0 records imported" in fleet.cli("tvm", "import-records", str(exported), env=other, check=True).stdout
    copy = tmp_path / "copy.jsonl"
    fleet.cli("tvm", "export-records", "-o", str(copy), "--from", "all", env=other, check=True)
    assert copy.read_text() == exported.read_text()
    there = fleet.cli("best", "--kind", "tvm.dense", *args, "--target", fleet.target, "--json", env=other, check=True)
    assert json.loads(there.stdout)["config"] == best["config"]
    imported_store = Store(other["FLEET_DATABASE_URL"])
    try:
        assert build_best((fc.kind, fc.params), fleet.target, store=imported_store).config == best["config"]
    finally:
        imported_store.close()


def test_a_wrong_result_is_an_invalid_measurement_never_a_best(fleet: Fleet) -> None:
    # Test-only fault injection on the worker: its NumPy reference is perturbed, so every output is "wrong".
    fleet.start_worker("--build-procs", "1", env={"FLEET_TVM_FAULT": "reference"})
    tuned = _tune(fleet, 1)
    assert all(layer["gflops"] is None for layer in tuned["layers"])
    with fleet.store.session() as session:
        trials = list(session.scalars(select(Trial)))
        measurements = list(session.scalars(select(Measurement)))
    assert {t.state for t in trials} == {"invalid"} and len(measurements) == len(trials) == 3
    assert all(t.reason.startswith("wrong result: relative error") for t in trials)
    assert all(not m.valid and m.metrics["correct"] is False and m.objective > 0 for m in measurements)
    fc = tiny_cnn(1)[2]
    args = [f"--param={k}={v}" for k, v in fc.params.items() if k in ("m", "n", "k")]
    done = fleet.cli("best", "--kind", "tvm.dense", *args, "--target", fleet.target)
    assert done.returncode == 1 and "no valid measurement" in done.stderr
