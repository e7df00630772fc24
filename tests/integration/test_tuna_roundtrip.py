"""Samples of the four MIOpen files of the development set (tests/data/miopen) through Fleet and back, on SQLite and
PostgreSQL: every line and every row unchanged, byte for byte where the source is sorted; records that map to no
driver problem kept."""

from __future__ import annotations

import bz2
import sqlite3
from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.miopen.perfdb import CONFIG_COLUMNS
from fleet.store import Store
from fleet.tuna import RAW
from fleet.tuna.databases import Selection, export_find_db, export_perf_db, import_db
from fleet.tuna.problems import describe, problems_by_key
from tests.conftest import MIOPEN


def rows(path: Path) -> tuple[list[tuple], list[tuple]]:
    """Every config row and every perf_db row of a perf-db, ids included, in id order."""
    with sqlite3.connect(path) as db:
        configs = db.execute(f"SELECT id, {', '.join(CONFIG_COLUMNS)} FROM config ORDER BY id").fetchall()
        perf = db.execute("SELECT id, solver, config, params FROM perf_db ORDER BY id").fetchall()
    return configs, perf


@pytest.mark.parametrize(
    ("name", "target", "line_format"), [("gfx803_36", "gfx803:36", "older"), ("gfx90a68", "gfx90a:104", "newer")]
)
def test_find_dbs_come_back_byte_for_byte(
    store: Store, tmp_path: Path, name: str, target: str, line_format: str
) -> None:
    source = MIOPEN / f"{name}.HIP.fdb.txt.bz2"
    original = bz2.decompress(source.read_bytes())
    assert original.decode().splitlines() == sorted(original.decode().splitlines())  # sorted: bytes must match
    done = import_db(store, source, target)
    assert done.line_format == line_format and done.unmapped == []
    out = tmp_path / "out.fdb.txt"
    written = export_find_db(store, Selection(target), out)
    assert (written.records, written.line_format, written.came_in) == (
        done.records,
        line_format,
        {line_format: done.records},
    )
    assert out.read_bytes() == original
    if line_format == "newer":
        # INT8 records are problems like the others, and the other format is there on request.
        int8 = [line for line in original.decode().splitlines() if "-INT8-" in line]
        assert len(int8) == 48
        assert problems_by_key(store, int8[0].partition("=")[0])[0].params["precision"] == "INT8"
        older = tmp_path / "older.txt"
        assert export_find_db(store, Selection(target), older, "older").line_format == "older"
        first = older.read_text().splitlines()[0]
        assert first.partition("=")[2].split(";")[0].count(",") == 4 and first.endswith("<unused>")


@pytest.mark.parametrize(
    ("name", "target", "unmapped"), [("gfx900_56", "gfx900:56", 0), ("gfx1030_36", "gfx1030:36", 3)]
)
def test_perf_dbs_come_back_row_for_row(store: Store, tmp_path: Path, name: str, target: str, unmapped: int) -> None:
    source = MIOPEN / f"{name}.db.bz2"
    plain = tmp_path / f"{name}.db"
    plain.write_bytes(bz2.decompress(source.read_bytes()))
    done = import_db(store, source, target)
    assert len(done.unmapped) == unmapped
    configs, perf = rows(plain)
    assert done.records == len(configs) + len(perf)
    out = tmp_path / "out.db"
    assert export_perf_db(store, Selection(target), out).records == len(perf)
    assert rows(out) == (configs, perf)  # every row, id and all, configs without perf rows too
    if unmapped:
        assert all("no input size gives dy h -5" in why for why in done.unmapped)
        raw = [p for p in store_problems(store) if p.kind == RAW]
        assert len(raw) == unmapped
        key = raw[0].params["key"]
        shown = describe(store, key)
        assert shown["source"] == "db" and [p["kind"] for p in shown["problems"]] == [RAW]
        assert shown["problems"][0]["id"] == raw[0].id and "never tuned" in shown["problems"][0]["note"]


def store_problems(store: Store) -> list:
    from sqlalchemy import select

    from fleet.store import Problem

    with store.session() as session:
        return list(session.scalars(select(Problem).order_by(Problem.id)))


def test_strict_imports_nothing_when_a_record_maps_to_no_problem(store: Store) -> None:
    # The sample's 1001 config rows, the three that map to no problem among them (tests/data/README.md).
    with pytest.raises(SpecError, match="3 of 1001 records map to no driver problem"):
        import_db(store, MIOPEN / "gfx1030_36.db.bz2", "gfx1030:36", strict=True)
    assert store.campaigns() == [] and store_problems(store) == []
