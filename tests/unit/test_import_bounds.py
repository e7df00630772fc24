"""Every importer reads as a stream that stops at FLEET_IMPORT_BYTES (issue 44, item 6): a file of any size, or a
bzip2 or gzip of a few hundred kilobytes that expands to far more, is refused in one line, with exit 1, without
its size in memory or on disk, and nothing imported."""

from __future__ import annotations

import bz2
import gzip
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet import files
from fleet.errors import NotFound, SpecError

LIMIT = 4 << 20
EXPANDS_TO = 96 << 20
# Python, Fleet and the command's imports (55 to 73 MiB measured): read whole, a bomb would add its 96 MiB.
PEAK_KIB = 100 << 10


def bomb(path: Path, head: bytes = b"") -> Path:
    """A compressed file (bzip2 or gzip, by ``path``'s suffix) of 96 MiB of blanks after ``head``."""
    opener = bz2.open if path.suffix == ".bz2" else gzip.open
    with opener(path, "wb") as out:
        out.write(head)
        chunk = b" " * (1 << 20)
        for _ in range(EXPANDS_TO >> 20):
            out.write(chunk)
    assert path.stat().st_size < 1 << 20
    return path


def big(path: Path, line: bytes) -> Path:
    """A plain file of ``line`` repeated past the limit."""
    path.write_bytes(line * (LIMIT // len(line) + 2))
    return path


def fleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fleet ARGS`` under /usr/bin/time (its peak memory, the last line of stderr), limit 4 MiB, its own TMPDIR."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {
        "FLEET_HOME": str(tmp_path / "home"),
        "PATH": "/usr/bin:/bin",
        "FLEET_IMPORT_BYTES": str(LIMIT),
        "TMPDIR": str(scratch),
    }
    timed = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "fleet.cli", *args]
    return subprocess.run(timed, capture_output=True, text=True, timeout=180, env=env)


def said_and_peak(done: subprocess.CompletedProcess[str]) -> tuple[list[str], int]:
    lines = done.stderr.strip().splitlines()
    return [line for line in lines[:-1] if not line.startswith("Command exited")], int(lines[-1])


FIND_LINE = (
    b"1-161-161-8-1-1-1-1-1-0-0-0-NCHW-FP32-F="
    b"miopenConvolutionFwdAlgoDirect:ConvOclDirectFwd1x1,0.02,0,miopenConvolutionFwdAlgoDirect,<unused>\n"
)
DRIVER_LINE = b"./bin/MIOpenDriver conv -n 16 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -F 1\n"
RECORD_LINE = b'{"input": ["llvm", "conv2d_nchw", [], {}], "config": {}, "result": [[0.1], 0, 1.0, 0]}\n'

# Each importer with a file too large for it: a compressed bomb where it reads compressed files, else a plain one.
CASES: dict[str, Callable[[Path], list[str]]] = {
    "miopen import-db (find-db.bz2)": lambda d: [
        "miopen", "import-db", str(bomb(d / "gfx90a68.HIP.fdb.txt.bz2", FIND_LINE)), "--target", "gfx90a:68",
    ],
    "miopen import-db (find-db text)": lambda d: [
        "miopen", "import-db", str(big(d / "gfx90a68.HIP.fdb.txt", FIND_LINE)), "--target", "gfx90a:68",
    ],
    "miopen import (driver lines.gz)": lambda d: ["miopen", "import", str(bomb(d / "drivers.txt.gz", DRIVER_LINE))],
    "miopen import (driver lines)": lambda d: ["miopen", "import", str(big(d / "drivers.txt", DRIVER_LINE))],
    "tvm import-records (.gz)": lambda d: ["tvm", "import-records", str(bomb(d / "records.json.gz", RECORD_LINE))],
    "tvm import-records": lambda d: ["tvm", "import-records", str(big(d / "records.json", RECORD_LINE))],
    "tvm from-miopen": lambda d: ["tvm", "from-miopen", str(big(d / "drivers.txt", DRIVER_LINE))],
    "kt (.gz)": lambda d: ["import", "kt", str(bomb(d / "cache.json.gz", b'{"cache": {'))],
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_import_past_the_bound_is_one_line_exit_1_and_takes_neither_its_memory_nor_its_disk(
    tmp_path: Path, case: str
) -> None:
    args = CASES[case](tmp_path)
    done = fleet(tmp_path, *args)
    said, peak = said_and_peak(done)
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(said) == 1 and said[0].startswith("fleet: error: "), said
    assert said[0].endswith("holds more than 4 MiB (FLEET_IMPORT_BYTES)"), said
    assert peak < PEAK_KIB, peak
    assert list((tmp_path / "tmp").iterdir()) == []  # no decompressed copy left behind
    assert imported(tmp_path / "home" / "fleet.db") == 0


def imported(database: Path) -> int:
    """Problems, campaigns and trials in the installation's database (none where there is no database)."""
    if not database.exists():
        return 0
    with sqlite3.connect(database) as db:
        return sum(
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("problems", "campaigns", "trials")
        )


def test_a_metaschedule_database_past_the_bound_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ms"
    folder.mkdir()
    (folder / "database_workload.json").write_text("")
    big(folder / "database_tuning_record.json", b'[0, [[], [], [], {}], [0.1], [], ""]\n')
    done = fleet(tmp_path, "tvm", "import-ms", str(folder))
    said, _ = said_and_peak(done)
    assert done.returncode == 1 and said == [
        f"fleet: error: {folder / 'database_tuning_record.json'}: holds more than 4 MiB (FLEET_IMPORT_BYTES)"
    ], said


def test_a_perf_db_past_the_bound_is_refused_before_sqlite_opens_it(tmp_path: Path) -> None:
    path = tmp_path / "gfx90a68.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE filler (x BLOB)")
        db.execute("INSERT INTO filler VALUES (zeroblob(?))", (LIMIT + 1,))
    done = fleet(tmp_path, "miopen", "import-db", str(path), "--target", "gfx90a:68")
    said, _ = said_and_peak(done)
    assert done.returncode == 1 and said == [f"fleet: error: {path}: holds more than 4 MiB (FLEET_IMPORT_BYTES)"]


# In-process: the reader itself, on what it is handed.


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_IMPORT_BYTES", "1024")


@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2"])
def test_a_file_of_exactly_the_limit_is_read_and_one_byte_more_is_not(
    tmp_path: Path, small_limit: None, suffix: str
) -> None:
    def write(path: Path, data: bytes) -> Path:
        opener = {"": open, ".gz": gzip.open, ".bz2": bz2.open}[suffix]
        with opener(path, "wb") as out:
            out.write(data)
        return path

    assert files.read_bytes(write(tmp_path / f"exact{suffix}", b"x" * 1024)) == b"x" * 1024
    with pytest.raises(files.TooLarge, match=r"holds more than 1 KiB"):
        files.read_bytes(write(tmp_path / f"over{suffix}", b"x" * 1025))
    with files.plain_copy(tmp_path / f"exact{suffix}") as plain:
        assert plain.read_bytes() == b"x" * 1024
    with pytest.raises(files.TooLarge), files.plain_copy(tmp_path / f"over{suffix}"):
        pass


def test_lines_stream_a_compressed_file_and_stop_at_the_limit(tmp_path: Path, small_limit: None) -> None:
    path = tmp_path / "lines.bz2"
    with bz2.open(path, "wb") as out:
        out.write(b"a\n" * 600)
    with pytest.raises(files.TooLarge), files.open_lines(path) as lines:
        assert sum(1 for _ in lines) == 600  # never reached: 1,200 bytes is over 1,024


def test_what_cannot_be_read_is_said(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.bz2"
    corrupt.write_bytes(b"BZh9" + b"\x00" * 64)
    with pytest.raises(SpecError, match="not a readable compressed file"):
        files.read_bytes(corrupt)
    with pytest.raises(NotFound, match="No such file"):
        files.read_bytes(tmp_path / "absent")
    with pytest.raises(NotFound, match="Is a directory"):
        files.read_bytes(tmp_path)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8 text"):
        files.read_text(tmp_path / "latin1.txt")
    assert json.loads(files.read_text(_gz(tmp_path / "ok.json.gz", b'{"a": 1}'))) == {"a": 1}


def _gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as out:
        out.write(data)
    return path
