"""MetaSchedule's database in Fleet's store (SQLite here): the PyDatabase, and its JSON files in and out.

fleet/tvm/msdb.py, fleet/store/_metaschedule.py and migration 0010. No tuning: records are made from the
unscheduled module's trace, with made-up run times.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

pytest.importorskip("tvm")

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import te

from fleet.store import MsRecord, Store
from fleet.tvm.msdb import RECORDS, WORKLOADS, MsFileError, database, export_dir, import_dir

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def matmul(n: int) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def commit(db: object, mod: tvm.IRModule, times: list[float]) -> None:
    """A record per run time of ``mod``'s trace (10 s and more: a failed candidate, as MetaSchedule writes it)."""
    workload = db.commit_workload(mod)  # type: ignore[attr-defined]
    trace = tvm.s_tir.Schedule(mod).trace
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    for seconds in times:
        db.commit_tuning_record(ms.database.TuningRecord(trace, workload, [seconds], TARGET, args))  # type: ignore[attr-defined]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    s.upgrade()
    yield s
    s.close()


def test_the_fleet_database_answers_and_exports_what_metaschedule_writes(store: Store, tmp_path: Path) -> None:
    times = {16: [3e-4, 1e10, 1.25e-4], 8: [2.5e-5]}
    fleet_db = database(store, "cpu-x86_64")
    written = tmp_path / "json"
    written.mkdir()
    json_db = ms.database.JSONDatabase(work_dir=str(written))
    for n, seconds in times.items():
        commit(fleet_db, matmul(n), seconds)
        commit(json_db, matmul(n), seconds)

    assert len(fleet_db) == 4 and fleet_db.has_workload(matmul(16)) and not fleet_db.has_workload(matmul(4))
    top = fleet_db.get_top_k(fleet_db.commit_workload(matmul(16)), 5)
    assert [float(r.run_secs[0]) for r in top] == [1.25e-4, 3e-4]  # best first; the failure is never a best
    assert fleet_db.query_schedule(matmul(8), TARGET, workload_name="main") is not None
    assert len(fleet_db.get_all_tuning_records()) == 4

    # Exported, the files are MetaSchedule's own, line for line.
    exported = tmp_path / "exported"
    assert export_dir(store, exported) == (2, 4)
    for name in (WORKLOADS, RECORDS):
        assert (exported / name).read_text() == (written / name).read_text()


def test_import_then_export_gives_the_files_back_and_twice_adds_nothing(store: Store, tmp_path: Path) -> None:
    written = tmp_path / "json"
    written.mkdir()
    json_db = ms.database.JSONDatabase(work_dir=str(written))
    commit(json_db, matmul(8), [4e-5, 1e10])
    commit(json_db, matmul(12), [7.123456789e-5])

    assert import_dir(store, written) == (2, 3, 0)
    assert import_dir(store, written) == (0, 0, 3)
    back = tmp_path / "back"
    export_dir(store, back)
    for name in (WORKLOADS, RECORDS):
        assert (back / name).read_text() == (written / name).read_text()


def test_a_bad_line_is_named_and_nothing_is_written(store: Store, tmp_path: Path) -> None:
    written = tmp_path / "json"
    written.mkdir()
    json_db = ms.database.JSONDatabase(work_dir=str(written))
    commit(json_db, matmul(8), [4e-5])
    with (written / RECORDS).open("a") as out:
        out.write("[7,[[],[1.0],{},[]]]\n")
    with pytest.raises(MsFileError, match=f"{RECORDS} line 2: workload index 7"):
        import_dir(store, written)
    assert export_dir(store, tmp_path / "empty") == (0, 0)
    with pytest.raises(MsFileError, match="No such file"):
        import_dir(store, tmp_path / "nowhere")


def test_a_teams_database_commits_its_teams_records_and_answers_with_them_only(store: Store, tmp_path: Path) -> None:
    operators, red = database(store, "cpu-x86_64"), database(store, "cpu-x86_64", team="red")
    commit(operators, matmul(16), [1e-5])
    commit(red, matmul(16), [3e-4, 2e-4])
    with store.session() as session:
        assert sorted(session.scalars(select(MsRecord.team))) == ["", "red", "red"]
    # Red's tuning draws on red's records, not on a faster one of anyone else's; the operators' on every record.
    assert len(red) == 2 and len(red.get_all_tuning_records()) == 2
    assert [float(r.run_secs[0]) for r in red.get_top_k(red.commit_workload(matmul(16)), 5)] == [2e-4, 3e-4]
    assert len(operators) == 3
    assert float(operators.get_top_k(operators.commit_workload(matmul(16)), 1)[0].run_secs[0]) == 1e-5

    # The same files imported for another team are its own rows, not "already there".
    written = tmp_path / "json"
    written.mkdir()
    commit(ms.database.JSONDatabase(work_dir=str(written)), matmul(8), [4e-5])
    assert import_dir(store, written) == (1, 1, 0)
    assert import_dir(store, written, team="blue") == (0, 1, 0)
    assert import_dir(store, written, team="blue") == (0, 0, 1)
