"""MIOpen's find-db, perf-db and kernel-db files: read, written deterministically, round-tripped."""

from __future__ import annotations

import bz2
import hashlib
import io
import sqlite3
from pathlib import Path

import pytest

from fleet.errors import MIOpenDbError
from fleet.miopen.driver import parse_line, problems
from fleet.miopen.finddb import FindEntry, FindRecord, parse_record, read_find_db, write_find_db
from fleet.miopen.kerneldb import Kernel, kernel_from_code_object, read_kernel_db, verify, write_kernel_db
from fleet.miopen.keys import db_key, parse_key
from fleet.miopen.perfdb import (
    CONFIG_COLUMNS,
    PerfRecord,
    params_from_config,
    perf_config,
    read_perf_db,
    write_perf_db,
)
from tests.conftest import MIOPEN

# Samples of the files MIOpen ships (tests/data/README.md): some of the find-db's lines, in the file's order, and
# some of the perf-db's config rows with every perf_db row of those.
FIND_DB = MIOPEN / "gfx803_36.HIP.fdb.txt.bz2"
PERF_DB = MIOPEN / "gfx900_56.db.bz2"


@pytest.fixture(scope="module")
def find_records() -> list[FindRecord]:
    return list(read_find_db(FIND_DB))


@pytest.fixture(scope="module")
def perf_records() -> list[PerfRecord]:
    return list(read_perf_db(PERF_DB))


@pytest.fixture(scope="module")
def shipped_perf_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("perfdb") / "gfx900_56.db"
    with bz2.open(PERF_DB, "rb") as source:
        path.write_bytes(source.read())
    return path


# --- find-db ---------------------------------------------------------------------------------------------


def test_reading_then_writing_the_shipped_find_db_gives_the_same_bytes(find_records: list[FindRecord]) -> None:
    assert len(find_records) == 2833
    out = io.StringIO()
    assert write_find_db(find_records, out) == 2833
    with bz2.open(FIND_DB, "rt", newline="") as original:
        assert out.getvalue() == original.read()


def test_find_entries_keep_every_field() -> None:
    record = parse_record(
        "1-1-1-4x4-512-4-4-128-0x0-1x1-1x1-0-NCHW-FP32-B=miopenConvolutionBwdDataAlgoGEMM:GemmBwdRest,4.0393,32768,"
        "rocBlas,<unused>;miopenConvolutionBwdDataAlgoWinograd:ConvBinWinogradRxSf2x3g1,0.06365,0,"
        "miopenConvolutionBwdDataAlgoWinograd,<unused>"
    )
    assert record.entries[0] == FindEntry(
        "miopenConvolutionBwdDataAlgoGEMM", "GemmBwdRest", 4.0393, 32768, "<unused>", "rocBlas"
    )
    written = io.StringIO()
    write_find_db([record], written)
    # Fastest first.
    assert written.getvalue().split("=", 1)[1].startswith("miopenConvolutionBwdDataAlgoWinograd:")


def test_written_records_are_sorted_and_deterministic(find_records: list[FindRecord]) -> None:
    sample = find_records[:500]
    shuffled = [FindRecord(r.key, tuple(reversed(r.entries))) for r in reversed(sample)]
    one, two = io.StringIO(), io.StringIO()
    write_find_db(sample, one)
    write_find_db(shuffled, two)
    assert one.getvalue() == two.getvalue()


def test_the_current_style_round_trips(tmp_path: Path, find_records: list[FindRecord]) -> None:
    sample = find_records[:200]
    path = tmp_path / "gfx90a68.HIP.fdb.txt"
    with open(path, "w") as out:
        write_find_db(sample, out, style="current")
    line = path.read_text().splitlines()[0]
    assert line.startswith("1-1-1-4x4-512-4-4-128-0x0-1x1-1x1-0-NCHW-FP32-B=ConvBinWinogradRxSf2x3g1:0.06365,0,")
    again = list(read_find_db(path))
    assert [(r.key, [(e.algorithm, e.solver, e.time_ms, e.workspace) for e in r.entries]) for r in again] == [
        (r.key, [(e.algorithm, e.solver, e.time_ms, e.workspace) for e in r.entries]) for r in sample
    ]


def test_find_db_keys_become_problems(find_records: list[FindRecord]) -> None:
    problem = parse_key(find_records[0].key)
    assert problem["direction"] == "B" and problem["in_channels"] == 512 and problem["out_channels"] == 1


def test_a_bad_find_db_line_names_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.fdb.txt"
    good = "1-1-1-4x4-512-4-4-128-0x0-1x1-1x1-0-NCHW-FP32-B=a:b,0.5,0,a,<unused>"
    path.write_text(f"{good}\n\n{good.replace('0.5', 'fast')}\n")
    with pytest.raises(MIOpenDbError, match=r"bad\.fdb\.txt:3: .*not a number"):
        list(read_find_db(path))
    path.write_text("no equals sign\n")
    with pytest.raises(MIOpenDbError, match=r":1: .*no '='"):
        list(read_find_db(path))
    path.write_text(good.replace(",<unused>", "") + "\n")
    with pytest.raises(MIOpenDbError, match="3 or 5 values"):
        list(read_find_db(path))


def test_bad_records_write_nothing() -> None:
    entry = FindEntry("algo", "solver", 1.0, 0)
    out = io.StringIO()
    with pytest.raises(MIOpenDbError, match="two find-db records"):
        write_find_db([FindRecord("k", (entry,)), FindRecord("k", (entry,))], out)
    with pytest.raises(MIOpenDbError, match="holds one of"):
        write_find_db([FindRecord("k", (entry,)), FindRecord("z", (FindEntry("a,b", "s", 1.0, 0),))], out)
    assert out.getvalue() == ""


# --- perf-db ---------------------------------------------------------------------------------------------


def test_perf_db_schema_is_miopens(tmp_path: Path, shipped_perf_db: Path) -> None:
    path = tmp_path / "out.db"
    record = PerfRecord(problems(parse_line("MIOpenDriver conv -F 1"))[0], "ConvOclDirectFwd", "16,16,32,32,2,2,2,4,2")
    write_perf_db(path, [record])
    query = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
    with sqlite3.connect(shipped_perf_db) as shipped, sqlite3.connect(path) as ours:
        assert ours.execute(query).fetchall() == shipped.execute(query).fetchall()


def test_perf_db_round_trip(tmp_path: Path, shipped_perf_db: Path, perf_records: list[PerfRecord]) -> None:
    assert len(perf_records) == 4366
    path = tmp_path / "gfx900_56.db"
    assert write_perf_db(path, perf_records) == (1999, 4366)  # one config row of the sample has no perf_db row
    columns = ", ".join(f"c.{name}" for name in CONFIG_COLUMNS)
    query = f"SELECT {columns}, p.solver, p.params FROM perf_db p JOIN config c ON c.id = p.config"
    with sqlite3.connect(shipped_perf_db) as shipped, sqlite3.connect(path) as ours:
        assert set(ours.execute(query).fetchall()) == set(shipped.execute(query).fetchall())
    assert set(read_perf_db(path)) == set(perf_records)


def test_perf_db_bytes_are_deterministic(tmp_path: Path, perf_records: list[PerfRecord]) -> None:
    sample = perf_records[:3000]
    write_perf_db(tmp_path / "one.db", sample)
    write_perf_db(tmp_path / "two.db", list(reversed(sample)) + sample[:10])  # order and repeats do not matter
    assert (tmp_path / "one.db").read_bytes() == (tmp_path / "two.db").read_bytes()


def test_perf_db_rows_are_the_key_side_of_the_problem() -> None:
    line = parse_line("MIOpenDriver convfp16 -n 2 -c 64 -H 55 -W 55 -k 16 -y 3 -x 3 -p 1 -q 1 -F 2")
    row = perf_config(problems(line)[0])
    assert (row["direction"], row["in_channels"], row["out_channels"], row["data_type"]) == ("B", 16, 64, "FP16")
    assert (row["in_d"], row["fil_d"], row["pad_d"], row["conv_stride_d"], row["dilation_d"]) == (1, 1, 0, 0, 0)
    assert params_from_config(row) == problems(line)[0]
    three = problems(parse_line("MIOpenDriver conv --spatial_dim 3 -n 4 -c 8 -! 4 -H 8 -W 8 -k 8 -@ 1 -F 1"))[0]
    assert perf_config(three)["layout"] == "NCHW" and perf_config(three, style="current")["layout"] == "NCDHW"


def test_perf_db_refuses_conflicts_and_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.db"
    problem = problems(parse_line("MIOpenDriver conv -F 1"))[0]
    write_perf_db(path, [PerfRecord(problem, "S", "1,2")])
    before = path.read_bytes()
    with pytest.raises(MIOpenDbError, match="two perf-db values for solver S"):
        write_perf_db(path, [PerfRecord(problem, "S", "1,2"), PerfRecord(problem, "S", "3,4")])
    with pytest.raises(MIOpenDbError, match="is not a directory"):
        write_perf_db(tmp_path / "missing" / "out.db", [PerfRecord(problem, "S", "1,2")])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.db"]  # no temporary file left behind


def test_a_file_that_is_not_a_perf_db(tmp_path: Path) -> None:
    path = tmp_path / "not.db"
    sqlite3.connect(path).close()
    with pytest.raises(MIOpenDbError, match="is not a MIOpen perf-db"):
        list(read_perf_db(path))
    with pytest.raises(MIOpenDbError, match="does not exist"):
        list(read_perf_db(tmp_path / "nothing.db"))


# --- kernel-db -------------------------------------------------------------------------------------------


def kernels() -> list[Kernel]:
    return [
        kernel_from_code_object("MIOpenConvDirUni.cl.o", "-DMLO_HW_WAVE_SZ=64 -mcpu=gfx900", b"\x7fELF one"),
        kernel_from_code_object("MIOpenConvDirUni.cl.o", "-DMLO_HW_WAVE_SZ=32 -mcpu=gfx900", b"\x7fELF two"),
        Kernel("conv1x1u.s.o", "-mcpu=gfx900", b"compressed bytes", hashlib.md5(b"original").hexdigest(), 8),
    ]


def test_kernel_db_write_read_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "gfx900.kdb"
    assert write_kernel_db(path, kernels()) == 3
    back = read_kernel_db(path)
    assert sorted(back, key=lambda k: (k.name, k.args)) == sorted(kernels(), key=lambda k: (k.name, k.args))
    assert all(verify(kernel) for kernel in back)
    assert not verify(Kernel("k.o", "", b"changed", back[0].hash, 0))
    with sqlite3.connect(path) as connection:
        sql = dict(connection.execute("SELECT name, sql FROM sqlite_master").fetchall())
    assert sql["kern_db"].startswith("CREATE TABLE `kern_db` (`id` INTEGER PRIMARY KEY ASC,`kernel_name` TEXT NOT NULL")
    assert sql["idx_kern_db"] == "CREATE UNIQUE INDEX `idx_kern_db` ON kern_db(kernel_name, kernel_args)"


def test_kernel_db_bytes_are_deterministic(tmp_path: Path) -> None:
    write_kernel_db(tmp_path / "one.kdb", kernels())
    write_kernel_db(tmp_path / "two.kdb", list(reversed(kernels())) + kernels()[:1])
    assert (tmp_path / "one.kdb").read_bytes() == (tmp_path / "two.kdb").read_bytes()


def test_kernel_db_refuses_two_different_kernels_under_one_name(tmp_path: Path) -> None:
    first = kernels()[0]
    other = kernel_from_code_object(first.name, first.args, b"other code")
    with pytest.raises(MIOpenDbError, match="two different kernels"):
        write_kernel_db(tmp_path / "k.kdb", [first, other])
    assert not (tmp_path / "k.kdb").exists()


def test_find_db_and_key_agree_for_a_written_problem() -> None:
    problem = problems(parse_line("MIOpenDriver conv -n 4 -c 8 -H 9 -W 9 -k 8 -F 1"))[0]
    record = FindRecord(
        db_key(problem), (FindEntry("miopenConvolutionFwdAlgoDirect", "ConvDirectNaiveConvFwd", 1.5, 0),)
    )
    out = io.StringIO()
    write_find_db([record], out)
    assert out.getvalue() == (
        "8-9-9-3x3-8-7-7-4-0x0-1x1-1x1-0-NCHW-FP32-F=miopenConvolutionFwdAlgoDirect:ConvDirectNaiveConvFwd,1.5,0,"
        "miopenConvolutionFwdAlgoDirect,<unused>\n"
    )
    assert parse_key(parse_record(out.getvalue().strip()).key) == problem
