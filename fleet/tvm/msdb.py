"""MetaSchedule's database in Fleet's store, and its JSON files in and out.

:func:`database` gives a MetaSchedule ``PyDatabase`` on the store's ``ms_workloads`` and ``ms_records`` tables, so
every campaign's records are shared (on PostgreSQL, among its team's logins: migration 0015), and
``query_schedule`` / ``query_ir_module`` answer from them. Each record keeps its provenance: the TVM version, the
Fleet target, and, for a candidate a :class:`~fleet.tvm.metaschedule.FleetRunner` measured, the worker, node,
device and trial.

:func:`import_dir` and :func:`export_dir` read and write MetaSchedule's ``JSONDatabase`` files
(``database_workload.json``: ``[structural hash, base64 IRModule]`` a line; ``database_tuning_record.json``:
``[workload index, [trace, run_secs, target, args_info]]`` a line). Lines are stored as they are (a workload line
depends on the TVM version that wrote it), so a directory imported into an empty database exports line for line.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from fleet.errors import NotFound, SpecError
from fleet.tvm.available import require_tvm

MEASURED: dict[tuple[float, ...], dict[str, Any]] = {}
"""Where each candidate this process's runners (:class:`~fleet.tvm.metaschedule.FleetRunner`) measured ran, by its
run_secs: the provenance the database records with it."""
_MEASURED_LOCK = threading.Lock()


WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
FAILED = 1e9
"""A run_secs at or above this is MetaSchedule's failed candidate (it writes 1e10)."""


class MsFileError(SpecError):
    """A MetaSchedule database file that cannot be read."""


def dumps(value: Any) -> str:
    """JSON text as MetaSchedule's C++ writer makes it: compact, object keys sorted, floats with 20 significant
    digits, booleans as 1 and 0, so a record committed here exports as MetaSchedule's own file holds it."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.20g}"
    if isinstance(value, str):
        return json.dumps(str(value))
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda item: str(item[0]))
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in items) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON")


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _mean(secs: Any) -> float | None:
    values = [float(s) for s in secs or []]
    if not values or any(not math.isfinite(v) or v >= FAILED for v in values):
        return None
    return sum(values) / len(values)


def add_workload(store: Any, line: str, tvm: str = "") -> int:
    """The id of the workload whose line is ``line``, added if new."""
    from fleet.store import MsWorkload

    key = _key(line)
    with store.session() as session:
        found = session.scalar(select(MsWorkload.id).where(MsWorkload.line_key == key))
        if found is not None:
            return int(found)
        shash = str(json.loads(line)[0])
        row = MsWorkload(shash=shash, line=line, line_key=key, tvm=tvm)
        session.add(row)
        session.flush()
        return int(row.id)


def add_record(store: Any, workload_id: int, text: str, provenance: dict[str, Any], team: str | None = None) -> bool:
    """Add a record (``[trace, run_secs, target, args_info]`` as text) of a workload, ``team``'s (None: the
    operators'); False if that team has it already."""
    from fleet.store import MsRecord

    key = _key(text)
    parsed = json.loads(text)
    target = parsed[2] if len(parsed) > 2 and isinstance(parsed[2], dict) else {}
    with store.session() as session:
        there = session.scalar(
            select(MsRecord.id).where(
                MsRecord.workload_id == workload_id, MsRecord.record_key == key, MsRecord.team == (team or "")
            )
        )
        if there is not None:
            return False
        session.add(
            MsRecord(
                workload_id=workload_id,
                record=text,
                record_key=key,
                mean_seconds=_mean(parsed[1]),
                target=str(target.get("kind", ""))[:64],
                provenance=provenance,
                team=team or "",
            )
        )
    return True


def import_dir(store: Any, directory: Path, source: str | None = None, team: str | None = None) -> tuple[int, int, int]:
    """Import a MetaSchedule JSON database directory as ``team``'s records (None: the operators'); return (workloads
    added, records added, records present).

    Every line is checked before anything is written.
    """
    from fleet.files import read_text

    workloads_path, records_path = directory / WORKLOADS, directory / RECORDS
    try:
        workload_lines = [line for line in read_text(workloads_path).splitlines() if line.strip()]
        record_lines = [line for line in read_text(records_path).splitlines() if line.strip()]
    except NotFound as error:
        raise MsFileError(str(error)) from None
    for number, line in enumerate(workload_lines, 1):
        try:
            parsed = json.loads(line)
            if not (isinstance(parsed, list) and len(parsed) == 2 and all(isinstance(p, str) for p in parsed)):
                raise ValueError("a workload line is [structural hash, base64 IRModule]")
        except ValueError as error:
            raise MsFileError(f"{workloads_path} line {number}: {error}") from None
    records = []
    for number, line in enumerate(record_lines, 1):
        try:
            parsed = json.loads(line)
            if not (isinstance(parsed, list) and len(parsed) == 2 and isinstance(parsed[0], int)):
                raise ValueError("a record line is [workload index, [trace, run_secs, target, args_info]]")
            if not 0 <= parsed[0] < len(workload_lines):
                raise ValueError(f"workload index {parsed[0]} is not a line of {WORKLOADS}")
            if not (isinstance(parsed[1], list) and len(parsed[1]) == 4):
                raise ValueError("a record is [trace, run_secs, target, args_info]")
        except ValueError as error:
            raise MsFileError(f"{records_path} line {number}: {error}") from None
        # The record's own text, as it is in the file: what follows "[index," up to the closing bracket.
        records.append((parsed[0], line[line.index(",") + 1 : line.rindex("]")]))
    before = workload_count(store)
    ids = [add_workload(store, line) for line in workload_lines]
    provenance = {"source": source or str(directory), "host": socket.gethostname()}
    added = sum(add_record(store, ids[index], text, provenance, team) for index, text in records)
    return workload_count(store) - before, added, len(records) - added


def workload_count(store: Any) -> int:
    from fleet.store import MsWorkload

    with store.session() as session:
        return int(session.scalar(select(func.count()).select_from(MsWorkload)) or 0)


def export_dir(store: Any, directory: Path) -> tuple[int, int]:
    """Write every workload and record as MetaSchedule's JSON database files in ``directory``; return the counts.

    Workloads and records are written in the order they were added; each file is written whole, then renamed.
    """
    from fleet.store import MsRecord, MsWorkload

    with store.session() as session:
        workloads = session.execute(select(MsWorkload.id, MsWorkload.line).order_by(MsWorkload.id)).all()
        records = session.execute(select(MsRecord.workload_id, MsRecord.record).order_by(MsRecord.id)).all()
    index = {row.id: position for position, row in enumerate(workloads)}
    directory.mkdir(parents=True, exist_ok=True)  # MetaSchedule's JSONDatabase does not create it
    for name, lines in (
        (WORKLOADS, [row.line for row in workloads]),
        (RECORDS, [f"[{index[row.workload_id]},{row.record}]" for row in records]),
    ):
        partial = directory / (name + ".partial")
        partial.write_text("".join(line + "\n" for line in lines))
        partial.replace(directory / name)
    return len(workloads), len(records)


@dataclass
class Best:
    """A MetaSchedule record of a TVM operator on a Fleet target: what ``fleet tvm run-model`` builds and
    ``fleet best`` shows.

    ``schedule`` is the record's trace applied to its workload (a ``tvm.s_tir.Schedule``), ``run_secs`` the
    seconds of each repeat as its runner measured them, ``provenance`` where (worker, node, trial, TVM version).
    """

    record_id: int
    workload_id: int
    mean_seconds: float
    run_secs: list[float]
    target: dict[str, Any]
    provenance: dict[str, Any]
    created_at: Any
    schedule: Any

    def describe(self) -> str:
        """One line: which record, and where it was measured."""
        where = self.provenance.get("worker") or self.provenance.get("source") or self.provenance.get("node") or "?"
        trial = self.provenance.get("trial")
        return f"metaschedule record {self.record_id} ({where}" + (f", trial {trial})" if trial else ")")

    def build(self, target: str) -> Any:
        """The schedule compiled for the Fleet ``target``, as a runtime module whose function is ``main``."""
        from fleet.tvm.measure import tvm_target

        tvm = require_tvm()
        return tvm.compile(self.schedule.mod, target=tvm_target(target)).jit()


def matches(record_target: Mapping[str, Any], provenance: Mapping[str, Any], target: str) -> bool:
    """Whether a record tuned for the TVM target ``record_target`` serves the Fleet ``target``: the Fleet target it
    was measured on, where its provenance says; else the same TVM target kind and CPU or GPU architecture (a
    record imported from MetaSchedule's files)."""
    from fleet.tvm.measure import tvm_target

    if provenance.get("target"):
        return provenance["target"] == target
    wanted = dict(tvm_target(target).export())
    return all(str(record_target.get(k)) == str(wanted[k]) for k in ("kind", "mcpu", "arch") if k in wanted)


def best_records(store: Any, kind: str, params: Mapping[str, Any], target: str, limit: int = 1) -> list[Best]:
    """The fastest MetaSchedule records of the TVM operator ``kind`` with ``params`` (its workload as
    :func:`fleet.tvm.operators.define` writes it, found by structure) on the Fleet ``target``, fastest first.

    Parameters
    ----------
    limit:
        How many at most.
    """
    from fleet.store import MsRecord
    from fleet.tvm.operators import check_problem, define

    tvm = require_tvm()
    from tvm.s_tir.meta_schedule.database import TuningRecord

    mod = tvm.IRModule({"main": define(kind, check_problem(kind, params))})
    workload_id, workload = database(store, target).known.find(mod)
    if workload_id is None:
        return []
    with store.session() as session:
        rows = session.execute(
            select(MsRecord)
            .where(MsRecord.workload_id == workload_id, MsRecord.mean_seconds.is_not(None))
            .order_by(MsRecord.mean_seconds, MsRecord.id)
        ).scalars()
        found = [(r.id, r.record, r.mean_seconds, dict(r.provenance or {}), r.created_at) for r in rows]
    if found:
        from fleet.tvm.intrinsics import load_intrinsics
        from fleet.tvm.measure import tvm_target

        load_intrinsics(tvm_target(target))  # a trace that tensorizes names its intrinsic
    out = []
    for record_id, text, mean_seconds, provenance, created_at in found:
        parsed = json.loads(text)
        record_target = parsed[2] if isinstance(parsed[2], dict) else {}
        if not matches(record_target, provenance, target):
            continue
        record = TuningRecord.from_json(parsed, workload)
        schedule = tvm.s_tir.Schedule(workload.mod)
        record.trace.apply_to_schedule(schedule, remove_postproc=False)
        secs = [float(s) for s in parsed[1]]
        out.append(Best(record_id, workload_id, mean_seconds, secs, record_target, provenance, created_at, schedule))
        if len(out) == limit:
            break
    return out


def database(store: Any, target: str = "", tvm_version: str | None = None, team: str | None = None) -> Any:
    """A MetaSchedule database on Fleet's store; ``target`` (the Fleet target) goes into each record's provenance,
    and the records it commits are ``team``'s (None: the operators')."""
    return _database_class()(store, target, tvm_version, team)


_CLASS: type | None = None


def _of_team(query: Any, team: str | None) -> Any:
    """``query`` of the records a database answers with: a team's tuning draws on its own team's only (the service's
    login reads every team's); the operators' (``team`` None) on every record."""
    from fleet.store import MsRecord

    return query if team is None else query.where(MsRecord.team == team)


class _Workloads:
    """The store's MetaSchedule workloads as one database has loaded or committed them: each by its id, and the
    ids by structural hash."""

    def __init__(self, store: Any, tvm_version: str) -> None:
        self.store = store
        self.tvm = tvm_version
        self.by_id: dict[int, Any] = {}  # id -> Workload
        self.by_shash: dict[str, list[int]] = {}

    def load(self, shash: str) -> list[int]:
        from tvm.s_tir.meta_schedule.database import Workload

        from fleet.store import MsWorkload

        if shash not in self.by_shash:
            with self.store.session() as session:
                rows = session.execute(
                    select(MsWorkload.id, MsWorkload.line).where(MsWorkload.shash == shash).order_by(MsWorkload.id)
                ).all()
            for row in rows:
                self.by_id.setdefault(row.id, Workload.from_json(json.loads(row.line)))
            self.by_shash[shash] = [row.id for row in rows]
        return self.by_shash[shash]

    def find(self, mod: Any) -> tuple[int | None, Any]:
        """The stored workload structurally equal to ``mod``, and a Workload of ``mod``."""
        import tvm
        from tvm.s_tir.meta_schedule.database import Workload

        workload = Workload(mod)
        shash, _ = workload.as_json()
        for workload_id in self.load(str(shash)):
            try:
                tvm.ir.assert_structural_equal(self.by_id[workload_id].mod, mod)
            except ValueError:
                continue
            return workload_id, self.by_id[workload_id]
        return None, workload

    def id_of(self, workload: Any) -> int:
        """``workload``'s id, committing it first where the store holds none structurally equal to it."""
        for workload_id, known in self.by_id.items():
            if known.same_as(workload):
                return workload_id
        found, _ = self.find(workload.mod)
        if found is None:
            found = self.commit(workload)
        return found

    def commit(self, workload: Any) -> int:
        line = dumps(workload.as_json())
        workload_id = add_workload(self.store, line, self.tvm)
        self.by_id[workload_id] = workload
        self.by_shash.setdefault(json.loads(line)[0], []).append(workload_id)
        return workload_id

    def get(self, workload_id: int) -> Any:
        """The workload of this id, read from the store the first time."""
        from tvm.s_tir.meta_schedule.database import Workload

        from fleet.store import MsWorkload

        if workload_id not in self.by_id:
            with self.store.session() as session:
                line = session.scalar(select(MsWorkload.line).where(MsWorkload.id == workload_id))
            self.by_id[workload_id] = Workload.from_json(json.loads(line))
        return self.by_id[workload_id]


def _database_class() -> type:
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    tvm = require_tvm()
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord

    @derived_object
    class FleetDatabase(PyDatabase):
        """MetaSchedule's database in Fleet's store; see :mod:`fleet.tvm.msdb`."""

        def __init__(
            self, store: Any, target: str = "", tvm_version: str | None = None, team: str | None = None
        ) -> None:
            super().__init__()
            self.store = store
            self.target = target
            self.team = team
            self.tvm = tvm_version or tvm.__version__
            self.known = _Workloads(store, self.tvm)

        def has_workload(self, mod: Any) -> bool:
            return self.known.find(mod)[0] is not None

        def commit_workload(self, mod: Any) -> Any:
            workload_id, workload = self.known.find(mod)
            if workload_id is None:
                self.known.commit(workload)
            return workload

        def commit_tuning_record(self, record: Any) -> None:
            workload_id = self.known.id_of(record.workload)
            text = dumps(record.as_json())
            secs = tuple(float(s) for s in record.run_secs or [])
            with _MEASURED_LOCK:
                measured = MEASURED.pop(secs, {})
            provenance = {"tvm": self.tvm, "target": self.target or measured.get("target"), **measured}
            provenance.setdefault("node", socket.gethostname())
            add_record(self.store, workload_id, text, provenance, self.team)

        def get_top_k(self, workload: Any, top_k: int) -> list[Any]:
            from fleet.store import MsRecord

            workload_id = self.known.id_of(workload)
            with self.store.session() as session:
                texts = session.scalars(
                    _of_team(select(MsRecord.record), self.team)
                    .where(MsRecord.workload_id == workload_id, MsRecord.mean_seconds.is_not(None))
                    .order_by(MsRecord.mean_seconds, MsRecord.id)
                    .limit(int(top_k))
                ).all()
            return [TuningRecord.from_json(json.loads(text), workload) for text in texts]

        def get_all_tuning_records(self) -> list[Any]:
            from fleet.store import MsRecord

            with self.store.session() as session:
                rows = session.execute(
                    _of_team(select(MsRecord.workload_id, MsRecord.record), self.team).order_by(MsRecord.id)
                ).all()
            out = []
            for row in rows:
                workload = self.known.get(row.workload_id)
                out.append(TuningRecord.from_json(json.loads(row.record), workload))
            return out

        def __len__(self) -> int:
            from fleet.store import MsRecord

            with self.store.session() as session:
                return int(session.scalar(_of_team(select(func.count()).select_from(MsRecord), self.team)) or 0)

    _CLASS = FleetDatabase
    return _CLASS
