"""MIOpen's databases through Fleet, on SQLite and PostgreSQL: the shipped find-db and perf-db survive an import
and an export whole; exports are deterministic; invalid results and empty selections export nothing."""

from __future__ import annotations

import bz2
import json
import sqlite3
from pathlib import Path

import pytest

from fleet.api import best
from fleet.errors import FleetError, NotFound, SpecError
from fleet.store import Store
from fleet.trust import Trusted
from fleet.tuna.databases import Selection, export_find_db, export_kernel_db, export_perf_db, import_db
from fleet.tuna.jobs import add_jobs, invalidate, list_jobs, reason_of
from fleet.tuna.problems import import_lines, problems_by_key
from tests.conftest import MIOPEN

FIND_DB = MIOPEN / "gfx803_36.HIP.fdb.txt.bz2"
PERF_DB = MIOPEN / "gfx900_56.db.bz2"


def perf_rows(path: Path) -> set[tuple]:
    """Every (config row without its id, solver, params) of a perf-db: what MIOpen looks up."""
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(config)")][1:]
        selected = ", ".join("c." + c for c in columns)
        query = f"SELECT {selected}, p.solver, p.params FROM perf_db p JOIN config c ON c.id = p.config"
        return set(db.execute(query).fetchall())


def test_the_shipped_find_db_survives_import_and_export(store: Store, tmp_path: Path) -> None:
    done = import_db(store, FIND_DB, "gfx803:36")
    original = bz2.decompress(FIND_DB.read_bytes()).decode().splitlines()
    assert done.format == "find-db" and done.records == len(original) == done.problems
    out = tmp_path / "gfx803_36.HIP.fdb.txt"
    assert export_find_db(store, Selection("gfx803:36"), out).records == len(original)
    assert sorted(out.read_text().splitlines()) == sorted(original)  # the same keys, the same entries
    provenance = (tmp_path / "gfx803_36.HIP.fdb.txt.provenance.json").read_text()
    assert done.sha256 in provenance and done.campaign in provenance
    again = tmp_path / "again.txt"
    export_find_db(store, Selection("gfx803:36", campaign=done.campaign), again)
    assert again.read_bytes() == out.read_bytes()  # the same data gives the same bytes
    key = original[1234].partition("=")[0]
    assert [p.params["direction"] for p in problems_by_key(store, key)] == [key[-1]]
    # The same file again: found, nothing added.
    assert import_db(store, FIND_DB, "gfx803:36").created == 0


def test_the_shipped_perf_db_survives_import_and_export(store: Store, tmp_path: Path) -> None:
    plain = tmp_path / "gfx900_56.db"
    plain.write_bytes(bz2.decompress(PERF_DB.read_bytes()))
    done = import_db(store, PERF_DB, "gfx900:56")
    assert done.format == "perf-db"
    out = tmp_path / "out.db"
    written = export_perf_db(store, Selection("gfx900:56"), out)
    assert perf_rows(out) == perf_rows(plain)
    with sqlite3.connect(plain) as db:
        configs = db.execute("SELECT count(*) FROM config").fetchone()[0]
    assert written.records == done.records - configs == len(perf_rows(plain))
    with sqlite3.connect(out) as db, sqlite3.connect(plain) as ref:
        schema = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
        assert db.execute(schema).fetchall() == ref.execute(schema).fetchall()  # MIOpen's schema, exactly
    second = tmp_path / "second.db"
    export_perf_db(store, Selection("gfx900:56"), second)
    assert second.read_bytes() == out.read_bytes()


def test_an_export_draws_on_the_campaigns_its_asker_names(store: Store, tmp_path: Path) -> None:
    """An attacker's import claims 1e-30 ms (absurdly fast) for a key a victim's import holds: it goes into no
    export, and decides no API lookup, that does not name it (issue 44, item 5)."""
    target = "gfx803:36"
    lines = bz2.decompress(FIND_DB.read_bytes()).decode().splitlines()[:3]
    (tmp_path / "victim.txt").write_text("\n".join(lines) + "\n")
    key, _, entries = lines[0].partition("=")
    solver, _, workspace, *rest = entries.split(";")[0].split(",")
    (tmp_path / "attacker.txt").write_text(f"{key}={solver},1e-30,{workspace},{','.join(rest)}\n")
    victim = import_db(store, tmp_path / "victim.txt", target).campaign
    attacker = import_db(store, tmp_path / "attacker.txt", target).campaign
    out = tmp_path / "out.txt"

    # Named none, two campaigns hold results: refused, naming them, nothing written.
    for export in (export_find_db, export_kernel_db):
        with pytest.raises(FleetError, match=rf"^target {target}( \(find\))? has results from 2 campaigns \("):
            export(store, Selection(target), out)
    with pytest.raises(FleetError, match=f"2 campaigns \\({attacker}, {victim}\\); name those to draw on with --from"):
        export_find_db(store, Selection(target), out)
    assert not out.exists()

    mine = export_find_db(store, Selection(target, trusted=Trusted((victim,))), out)
    assert sorted(out.read_text().splitlines()) == sorted(lines) and mine.campaigns == [victim]
    assert json.loads((tmp_path / "out.txt.provenance.json").read_text())["campaigns"] == [victim]
    theirs = export_find_db(store, Selection(target, trusted=Trusted(None)), out)  # every campaign, on purpose
    assert f"{key}={solver},1e-30," in out.read_text() and theirs.campaigns == [attacker, victim]
    # Named, a campaign that holds none of these results gives none, never another's.
    with pytest.raises(NotFound, match="no find results to export"):
        export_find_db(store, Selection(target, tags=("nothing",), trusted=Trusted((victim,))), out)
    with pytest.raises(NotFound, match="no campaign 'nobody'"):
        export_find_db(store, Selection(target, trusted=Trusted(("nobody",))), out)
    with pytest.raises(SpecError, match="give one of --campaign, --from and --golden"):
        export_find_db(store, Selection(target, campaign=victim, trusted=Trusted(None)), out)

    # fleet.api.best: the same rule, Python's words.
    [problem] = problems_by_key(store, key)
    with pytest.raises(FleetError, match=f"\\({attacker}, {victim}\\); name those to draw on with campaigns="):
        best(problem.id, target, store=store)
    [(measurement, _)] = found = best(problem.id, target, store=store, campaigns=[victim])
    assert measurement.objective > 0 and found[0].campaign == victim
    [everyone] = best(problem.id, target, store=store, campaigns="all")
    assert everyone[0].objective == 1e-30 and everyone.campaign == attacker


def test_invalid_results_are_never_exported(store: Store, tmp_path: Path) -> None:
    text = "\n".join(bz2.decompress(FIND_DB.read_bytes()).decode().splitlines()[:200]) + "\n"
    source = tmp_path / "gfx803_36.HIP.fdb.txt"
    source.write_text(text)
    done = import_db(store, source, "gfx803:36")
    forward = [p for p in problems_by_key(store, text.splitlines()[0].partition("=")[0])]
    assert invalidate(store, reason=reason_of(store.campaign(done.campaign)), problem_ids=[p.id for p in forward]) == 1
    out = tmp_path / "out.txt"
    assert export_find_db(store, Selection("gfx803:36"), out).records == 199
    assert text.splitlines()[0] not in out.read_text()


def test_exports_with_nothing_to_export_write_nothing(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "gfx906_60.HIP.fdb.txt"
    with pytest.raises(NotFound, match="no find results"):
        export_find_db(store, Selection("gfx906:60"), out)
    with pytest.raises(NotFound, match="no perf results"):
        export_perf_db(store, Selection("gfx906:60"), folder / "x.db")
    with pytest.raises(NotFound, match="no golden set"):
        export_find_db(store, Selection("gfx906:60", golden=True), out)
    with pytest.raises(SpecError, match="unknown target"):
        export_find_db(store, Selection("gfx906-60"), out)
    assert list(folder.iterdir()) == []


def test_a_broken_file_imports_nothing(store: Store, tmp_path: Path) -> None:
    import_lines(store, ["MIOpenDriver conv -n 1 -F 1"])
    broken = tmp_path / "gfx803_36.HIP.fdb.txt"
    broken.write_text("1-1-1-4x4-512-4-4-128-0x0-1x1-1x1-0-NCHW-FP32-B=a:b,1,0,a,<unused>\nthis is not a record\n")
    with pytest.raises(FleetError, match=":2:"):
        import_db(store, broken, "gfx803:36")
    assert [c.name for c in store.campaigns()] == []
    assert problems_by_key(store, "1-1-1-4x4-512-4-4-128-0x0-1x1-1x1-0-NCHW-FP32-B") == []
    with pytest.raises(NotFound):
        import_db(store, tmp_path / "missing.txt", "gfx803:36")


def test_invalidating_one_step_leaves_the_other_steps_jobs_alone(store: Store) -> None:
    report = import_lines(store, (MIOPEN / "alexnet.txt").read_text().splitlines(), tags=["alexnet"])
    problem_ids = sorted(set(report.problem_ids))[:3]
    add_jobs(store, "tuning", "gfx906:60", problem_ids, ["perf", "find"])
    assert invalidate(store, reason="tuning", problem_ids=problem_ids[:2], steps=["perf"]) == 2
    [row] = list_jobs(store, reason="tuning")
    assert row["steps"] == {"find": {"new": 3}, "perf": {"invalid": 2, "new": 1}}
    assert invalidate(store, reason="tuning", target="gfx906:60") == 4  # all that were still valid
