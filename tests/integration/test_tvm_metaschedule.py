"""MetaSchedule on a real fleet: `fleet tvm tune-ms` runs ms.tune_tir with FleetRunner, a `fleet worker` measures
every candidate (in one resident sandboxed child), its records land in Fleet's database, `fleet best` and
`fleet tvm run-model` use the best of them, and its JSON files go out and come back line for line.

One tuning serves every check: the matmul is tiny-cnn's classifier at batch 16 (16 x 128 x 10), so that run-model
has a layer to use the record for, and it is measured with the shortest repeats (it is the records' handling that
is checked here, not their speed).

fleet/tvm/metaschedule.py, fleet/tvm/msdb.py, fleet/cli/tvm.py (tune-ms, import-ms, export-ms, run-model),
fleet/cli/campaigns.py (best), fleet/store/_metaschedule.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from fleet.store import Measurement, MsRecord, MsWorkload, Store, Trial
from fleet.tvm.metaschedule import KIND, tvm_target
from fleet.tvm.msdb import RECORDS, WORKLOADS, database
from tests.conftest import Fleet

pytestmark = pytest.mark.integration

TRIALS = 8
BATCH = 16
SHAPE = {"m": BATCH, "k": 128, "n": 10}  # tiny-cnn's "fc" at --batch 16


def ms_trials(store: Store) -> list[Trial]:
    from fleet.store import Problem

    with store.session() as session:
        kinds = select(Problem.id).where(Problem.kind == KIND)
        return list(session.scalars(select(Trial).where(Trial.problem_id.in_(kinds)).order_by(Trial.id)))


def test_tune_ms_measures_every_candidate_on_the_fleet_and_survives_a_killed_worker(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_worker("--eval-procs", "1", "--build-procs", "1")
    params = [f"--param={k}={v}" for k, v in SHAPE.items()]
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tvm", "tune-ms", "tvm.dense", *params, "--target", fleet.target,
         "--trials", str(TRIALS), "--per-iter", str(TRIALS), "--cost-model", "random", "--number", "1",
         "--min-repeat-ms", "1", "--work-dir", str(tmp_path / "ms"), "--json"],
        env=fleet.env, cwd=fleet.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        # A worker SIGKILLed mid-batch: its candidate is measured again by the worker that replaces it.
        fleet.wait_for(
            lambda: any(t.state == "evaluating" for t in ms_trials(fleet.store)),
            timeout=240,
            what="a candidate being measured",
        )
        victim = fleet.store.workers(target=fleet.target, role="eval")[0]
        os.killpg(victim.pid, signal.SIGKILL)
        out, err = tune.communicate(timeout=240)
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
    assert tune.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["measured"] == TRIALS and result["best_seconds"] > 0

    # Every candidate was a trial measured once by a worker: none lost, none twice.
    trials = ms_trials(fleet.store)
    assert len(trials) == TRIALS
    assert {t.state for t in trials} == {"evaluated"}, [(t.id, t.state, t.attempts, t.reason) for t in trials]
    assert max(t.attempts for t in trials) == 2  # the one the killed worker held
    with fleet.store.session() as session:
        ids = [t.id for t in trials]
        measurements = list(session.scalars(select(Measurement).where(Measurement.trial_id.in_(ids))))
        records = list(session.scalars(select(MsRecord).order_by(MsRecord.id)))
        workloads = list(session.scalars(select(MsWorkload)))
    assert sorted(m.trial_id for m in measurements) == sorted(t.id for t in trials)
    assert all(m.worker.startswith("eval-") for m in measurements)
    # The Fleet-backed database holds one record per candidate, with where it ran.
    assert len(workloads) == 1 and len(records) == TRIALS
    assert sorted(r.provenance["trial"] for r in records) == sorted(t.id for t in trials)
    assert all(r.provenance["worker"].startswith("eval-") and r.provenance["tvm"] for r in records)

    # query_schedule gives a schedule that builds and computes the matmul.
    import tvm

    from fleet.tvm.operators import DENSE, check_problem, define

    p = check_problem(DENSE, SHAPE)
    mod = tvm.IRModule({"main": define(DENSE, p)})
    target = tvm_target(fleet.target)
    schedule = database(fleet.store, fleet.target).query_schedule(mod, target, workload_name="main")
    assert schedule is not None
    built = tvm.compile(schedule.mod, target=target)
    rng = np.random.default_rng(0)
    m, k, n = SHAPE["m"], SHAPE["k"], SHAPE["n"]
    a, b = rng.standard_normal((m, k)).astype("float32"), rng.standard_normal((k, n)).astype("float32")
    dev = tvm.cpu(0)
    c = tvm.runtime.empty((m, n), "float32", dev)
    built["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)

    # fleet best shows the fastest record the fleet measured (Fleet's own space has no measurement of it) ...
    fastest = min((r for r in records if r.mean_seconds is not None), key=lambda r: (r.mean_seconds, r.id))
    best = json.loads(
        fleet.cli("best", "--kind", "tvm.dense", *params, "--target", fleet.target, "--json", check=True).stdout
    )
    assert best["source"] == "metaschedule" and best["record"] == fastest.id
    assert best["trial"] == fastest.provenance["trial"] and best["worker"].startswith("eval-")
    assert best["metrics"]["time_s"] == pytest.approx(fastest.mean_seconds)
    # ... and run-model builds it for tiny-cnn's classifier, checked against NumPy, and says which it used.
    ran = fleet.cli(
        "tvm",
        "run-model",
        "tiny-cnn",
        "--batch",
        str(BATCH),
        "--target",
        fleet.target,
        "--repeats",
        "1",
        "--json",
        check=True,
    )
    rows = {row["layer"]: row for row in json.loads(ran.stdout)["layers"]}
    assert rows["fc"]["schedule"] == "metaschedule", ran.stderr[-2000:]
    assert rows["fc"]["source"].startswith(f"metaschedule record {fastest.id} (eval-")
    assert rows["conv1"]["schedule"] == "default"  # nothing tuned it

    # MetaSchedule's own JSON database of these records, written by MetaSchedule ...
    import tvm.s_tir.meta_schedule as ms

    written = tmp_path / "json"
    written.mkdir()
    json_db = ms.database.JSONDatabase(work_dir=str(written))
    for record in database(fleet.store).get_all_tuning_records():
        json_db.commit_workload(record.workload.mod)
        json_db.commit_tuning_record(record)
    # ... is what export-ms writes, and comes back through import-ms and export-ms line for line.
    exported = tmp_path / "exported"
    assert fleet.cli("tvm", "export-ms", str(exported), check=True).stdout.startswith(f"{TRIALS} records")
    for name in (WORKLOADS, RECORDS):
        assert (exported / name).read_text() == (written / name).read_text()
    other = {"FLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}"}
    fleet.cli("db", "upgrade", env=other, check=True)
    imported = fleet.cli("tvm", "import-ms", str(written), env=other, check=True).stdout
    assert imported.startswith(f"{TRIALS} records and 1 workloads imported")
    again = fleet.cli("tvm", "import-ms", str(written), env=other, check=True).stdout
    assert again.startswith("0 records and 0 workloads imported") and f"{TRIALS} records already there" in again
    back = tmp_path / "back"
    fleet.cli("tvm", "export-ms", str(back), env=other, check=True)
    for name in (WORKLOADS, RECORDS):
        assert (back / name).read_text().splitlines() == (written / name).read_text().splitlines()


def test_tune_ms_of_a_model_tunes_each_layer_and_run_model_runs_each_with_its_record(fleet: Fleet) -> None:
    fleet.start_worker("--eval-procs", "1", "--build-procs", "1")
    layers = 3  # tiny-cnn: conv1, conv2, fc, all of different shapes
    tuned = fleet.cli(
        "tvm", "tune-ms", "tiny-cnn", "--batch", str(BATCH), "--target", fleet.target, "--trials", str(2 * layers),
        "--per-iter", "2", "--cost-model", "random", "--number", "1", "--min-repeat-ms", "1", "--json",
        timeout=600, check=True,
    )  # fmt: skip
    result = json.loads(tuned.stdout)
    # MetaSchedule's task scheduler gave each layer its share, every candidate measured by the fleet's worker.
    assert result["measured"] == 2 * layers
    assert [row["layer"] for row in result["layers"]] == ["conv1", "conv2", "fc"]
    assert all(row["best_seconds"] > 0 and row["best_gflops"] > 0 for row in result["layers"]), result
    trials = ms_trials(fleet.store)
    assert len(trials) == 2 * layers and {t.state for t in trials} == {"evaluated"}
    with fleet.store.session() as session:
        assert len(list(session.scalars(select(MsWorkload)))) == layers
    # Each layer's record is found by the layer's own operator: run-model builds every layer from its record.
    ran = fleet.cli(
        "tvm", "run-model", "tiny-cnn", "--batch", str(BATCH), "--target", fleet.target, "--repeats", "1", "--json",
        check=True,
    )  # fmt: skip
    rows = json.loads(ran.stdout)["layers"]
    assert [row["schedule"] for row in rows] == ["metaschedule"] * layers, ran.stderr[-2000:]


def test_tune_ms_refuses_what_it_cannot_tune_in_one_line(fleet: Fleet) -> None:
    for args, line in (
        (["resnet"], "resnet is neither a TVM operator (tvm.batch_matmul, tvm.conv2d, tvm.dense), a model "),
        (["tvm.dense", "--param", "m=4", "--batch", "2"], "--batch is for a model"),
        (["tiny-cnn", "--param", "m=4"], "--param is for a TVM operator"),
    ):
        done = fleet.cli("tvm", "tune-ms", *args, "--target", fleet.target)
        assert done.returncode != 0
        assert done.stderr.strip().splitlines()[-1].startswith(f"fleet: error: {line}"), done.stderr
        assert not ms_trials(fleet.store)
