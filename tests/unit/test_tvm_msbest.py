"""MetaSchedule records as a TVM operator's best (issue 32): ``fleet tvm run-model`` builds the fastest record of a
layer's operator on the target and says so, ``fleet best`` shows it; records of another target, or failed ones,
are never picked. Real TVM and a real SQLite store; the records are made by hand (no tuning), with made-up run
times. tests/integration/test_tvm_metaschedule.py does the same with records a fleet measured.

fleet/tvm/msdb.py (best_records), fleet/tvm/run.py, fleet/tvm/best.py, fleet/cli/campaigns.py (best).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm")

import tvm
import tvm.s_tir.meta_schedule as ms

from fleet.store import Store
from fleet.tvm.measure import tvm_target
from fleet.tvm.models import tiny_cnn
from fleet.tvm.msdb import RECORDS, WORKLOADS, best_records, database, import_dir
from fleet.tvm.operators import DENSE, check_problem, define
from fleet.tvm.run import run_layers

TARGET = "cpu-x86_64"
FC = check_problem(DENSE, {"m": 1, "k": 128, "n": 10})  # tiny-cnn's classifier at batch 1


def split(factor: int) -> tvm.s_tir.Schedule:
    """A schedule of the classifier with its j loop split by ``factor`` and the halves reordered."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": define(DENSE, FC)}))
    _, j, k = sch.get_loops(sch.get_sblock("C"))
    outer, inner = sch.split(j, factors=[None, factor])
    sch.reorder(outer, k, inner)
    return sch


def commit(db: object, sch: tvm.s_tir.Schedule, seconds: float, target: dict) -> None:
    mod = tvm.IRModule({"main": define(DENSE, FC)})
    workload = db.commit_workload(mod)  # type: ignore[attr-defined]
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    record = ms.database.TuningRecord(sch.trace, workload, [seconds], tvm.target.Target(target), args)
    db.commit_tuning_record(record)  # type: ignore[attr-defined]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    s.upgrade()
    here = dict(tvm_target(TARGET).export())
    ours, theirs = database(s, TARGET), database(s, "cpu-elsewhere")
    commit(ours, split(5), 2e-6, here)  # the best of this target
    commit(ours, split(2), 4e-6, here)
    commit(ours, split(10), 1e10, here)  # failed: MetaSchedule's 1e10
    commit(theirs, split(10), 1e-7, here)  # faster, but measured on another Fleet target
    yield s
    s.close()


def test_the_best_record_of_the_target_is_built_and_computes_the_layer(store: Store) -> None:
    found = best_records(store, DENSE, FC, TARGET, limit=5)
    assert [f.mean_seconds for f in found] == [2e-6, 4e-6]  # fastest first; failed and other targets left out
    best = found[0]
    assert best.provenance["target"] == TARGET and best.describe().startswith(f"metaschedule record {best.record_id}")
    assert "sch.split" in str(best.schedule.trace)  # the record's trace, applied to its workload
    module = best.build(TARGET)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 128)).astype("float32")
    b = rng.standard_normal((128, 10)).astype("float32")
    dev = tvm.cpu(0)
    c = tvm.runtime.empty((1, 10), "float32", dev)
    module["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert best_records(store, DENSE, check_problem(DENSE, {"m": 2, "k": 128, "n": 10}), TARGET) == []


def test_imported_records_serve_the_target_of_their_cpu(tmp_path: Path) -> None:
    """A record from MetaSchedule's files says no Fleet target: its TVM target's kind and CPU decide."""
    written = tmp_path / "json"
    written.mkdir()
    json_db = ms.database.JSONDatabase(work_dir=str(written))
    commit(json_db, split(5), 3e-6, dict(tvm_target(TARGET).export()))
    commit(json_db, split(2), 1e-6, {"kind": "llvm", "mcpu": "cortex-a72", "mtriple": "aarch64-linux-gnu"})
    s = Store(f"sqlite:///{tmp_path / 'other.db'}")
    s.upgrade()
    assert import_dir(s, written) == (1, 2, 0) and (written / WORKLOADS).exists() and (written / RECORDS).exists()
    [found] = best_records(s, DENSE, FC, TARGET, limit=5)
    assert found.mean_seconds == 3e-6 and found.provenance["source"] == str(written)
    s.close()


def test_run_model_builds_the_metaschedule_record_and_says_so(store: Store) -> None:
    rows = {row["layer"]: row for row in run_layers(store, tiny_cnn(1), TARGET, repeats=1)}
    [best] = best_records(store, DENSE, FC, TARGET)
    assert rows["fc"]["schedule"] == "metaschedule" and rows["fc"]["tuned"]
    assert rows["fc"]["source"] == best.describe()
    assert rows["conv1"]["schedule"] == "default" and rows["conv1"]["source"] == "default"  # nothing tuned


def test_fleet_best_shows_the_metaschedule_record_of_a_tvm_problem(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet.cli import main

    for name in [k for k in os.environ if k.startswith("FLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / ".fleet"))
    monkeypatch.setenv("FLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'fleet.db'}")
    [best] = best_records(store, DENSE, FC, TARGET)
    args = ["best", "--kind", DENSE, "--param", "m=1", "--param", "k=128", "--param", "n=10", "--target", TARGET]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["source"] == "metaschedule" and row["record"] == best.record_id and row["config"] is None
    assert row["gflops"] == pytest.approx(2 * 1 * 128 * 10 / 2e-6 / 1e9) and row["samples"] == [2e-6]
    assert main([*args, "-n", "5", "--json"]) == 0
    assert [r["metrics"]["time_s"] for r in json.loads(capsys.readouterr().out)] == [2e-6, 4e-6]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"gflops 1.28  metaschedule record {best.record_id} (")
    assert main([*args[:-1], "cpu-elsewhere", "--json"]) == 0  # the other target's own record
    assert json.loads(capsys.readouterr().out)["samples"] == [1e-7]
    assert main([*args[:4], "m=3", *args[5:]]) == 1  # no record, no measurement: one line says so
    assert "no valid measurement of tvm.dense on cpu-x86_64" in capsys.readouterr().err
