"""Cut the test samples of tests/data/tuning-spaces and tests/data/miopen from the development set (../shared).

`make test` never reads ../shared: the tests read these samples. Run this (from the repository root, with the
development set beside the repository) only to make them again; it writes the same files each time.

    .venv/bin/python tests/data/make_samples.py

A recorded space is cut to a sub-space: fewer values of some knobs, and every record of the configurations that
remain, unchanged. A MIOpen find-db is cut to some of its lines, in their order; a perf-db to some of its config
rows and every perf_db row of those, ids unchanged, in MIOpen's schema.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
import sqlite3
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent
ROOT = DATA.parents[1]
SHARED = ROOT.parent / "shared"

# The values kept of each knob (the others whole), per recorded space. Each keeps the space's optimum except
# where said; the tests need the configurations named beside them.
CONVOLUTION_MILO = {
    # test_replay draws 500 distinct configurations of the A100's: it keeps more than 500.
    "block_size_x": [32, 64, 128, 256],
    "block_size_y": [1, 2, 4],
    "tile_size_x": [1, 2, 4],
    "tile_size_y": [1, 2, 3, 4],
}
CONVOLUTION_MILO_SMALL = {
    # tests/integration/test_history.py's KNOBS: block_size_x 128, 256; block_size_y 1, 2; tile_size_x 1, 2, 4;
    # tile_size_y 2, 4.
    "block_size_x": [64, 128, 256],
    "block_size_y": [1, 2],
    "tile_size_x": [1, 2, 4],
    "tile_size_y": [2, 4],
}
SPACES = {
    "convolution_kt__RTX_2080_Ti": {
        # block_size_x = block_size_y = 1 stays in the product, left out by the restrictions.
        "block_size_x": [1, 16, 32, 64, 128],
        "block_size_y": [1, 2, 4, 8],
        "tile_size_x": [1, 2, 4],
        "tile_size_y": [1, 2, 4, 7],
    },
    "convolution_milo__A100": CONVOLUTION_MILO,
    "convolution_milo__A4000": CONVOLUTION_MILO_SMALL,
    "convolution_milo__A6000": CONVOLUTION_MILO_SMALL,
    "convolution_milo__MI250X": CONVOLUTION_MILO_SMALL,
    "convolution_milo__MI50": CONVOLUTION_MILO_SMALL,
    **{
        f"dedispersion_milo__{gpu}": {"block_size_x": [1, 32], "block_size_y": [32, 128, 256], "tile_size_y": [1, 4, 8]}
        for gpu in ("A100", "A4000", "A6000", "W6600")
    },
    **{
        f"gemm_clblast__{gpu}": {
            "MWG": [64, 128],
            "NWG": [64, 128],
            "MDIMC": [8, 16],
            "NDIMC": [8, 16],
            "MDIMA": [16, 32],
            "NDIMB": [16, 32],
            "VWM": [4, 8],
            "VWN": [2, 4],
        }
        for gpu in ("RTX_2080_Ti", "RTX_3060_laptop")
    },
    # RuntimeFailedConfig records stay (tile_size 1 and 20 of some methods).
    "pnpoly__RTX_2080_Ti": {"block_size_x": [32, 64, 128, 256, 512, 992], "tile_size": [1, 2, 4, 8, 16, 20]},
}


def cut_space(name: str, keep: dict[str, list]) -> dict:
    with gzip.open(SHARED / "tuning-spaces" / f"{name}.json.gz") as handle:
        data = json.load(handle)
    params = {k: [v for v in values if v in keep.get(k, values)] for k, values in data["tune_params"].items()}
    cache = {
        key: record for key, record in data["cache"].items() if all(record[k] in values for k, values in params.items())
    }
    return {**data, "tune_params": params, "cache": cache}


def figures(data: dict) -> tuple[int, int, float, float]:
    """Configurations, valid ones, optimum (ms), median / optimum: from the file's JSON alone."""
    times = sorted(r["time"] for r in data["cache"].values() if isinstance(r["time"], int | float))
    return len(data["cache"]), len(times), times[0], statistics.median(times) / times[0]


SPACES_README = """# Recorded tuning spaces, cut for the tests

Sub-spaces of the recorded spaces of the development set (each a gzip'd Kernel Tuner cache file, see
../README.md for their origin and licence), cut by ../make_samples.py: fewer values of the knobs named, the other
knobs whole, and every record of the configurations that remain, unchanged. The tests read this folder
(`FLEET_TUNING_SPACES`, set by tests/conftest.py); tests/unit/test_replay.py checks each file against its row.

| file | configurations (valid) | optimum ms | median / optimum | kept |
|---|---|---|---|---|
"""


def write_spaces() -> None:
    folder = DATA / "tuning-spaces"
    folder.mkdir(exist_ok=True)
    rows = []
    for name, keep in SPACES.items():
        data = cut_space(name, keep)
        text = json.dumps(data).encode()
        (folder / f"{name}.json.gz").write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        size, valid, optimum, ratio = figures(data)
        kept = "; ".join(f"`{k}` in {', '.join(map(str, v))}" for k, v in keep.items())
        rows.append(f"| {name}.json.gz | {size} ({valid}) | {optimum:.4g} | {ratio:.2f} | {kept} |\n")
    (folder / "README.md").write_text(SPACES_README + "".join(rows))


def conv_keys(lines: list[str]) -> set[str]:
    from fleet.miopen.driver import DriverLine, parse_lines, problems
    from fleet.miopen.keys import db_key

    parsed = [line for _, line in parse_lines(lines) if isinstance(line, DriverLine) and line.kind == "conv"]
    return {db_key(p) for line in parsed for p in problems(line)}


def shape(key: str) -> str:
    """A key with each number other than 0 and 1 written N: keys of one shape are spelt alike."""
    return re.sub(r"\d+", lambda m: m[0] if m[0] in ("0", "1") else "N", key)


def cut_find_db(name: str, wanted: set[str], every: int) -> list[str]:
    """The first 500 lines, the lines of ``wanted`` keys, those of INT8 problems, three of each key shape, and
    every ``every``-th line; in the file's order."""
    lines = bz2.decompress((SHARED / "miopen" / f"{name}.HIP.fdb.txt.bz2").read_bytes()).decode().splitlines()
    seen: dict[str, int] = {}
    kept = []
    for number, line in enumerate(lines):
        key = line.partition("=")[0]
        seen[shape(key)] = seen.get(shape(key), 0) + 1
        if number < 500 or key in wanted or "-INT8-" in key or seen[shape(key)] <= 3 or number % every == 0:
            kept.append(line)
    (DATA / "miopen" / f"{name}.HIP.fdb.txt.bz2").write_bytes(bz2.compress("".join(f"{x}\n" for x in kept).encode()))
    return lines


def cut_perf_db(name: str, first: int, also: tuple[int, ...] = ()) -> None:
    """The first ``first`` config rows, the rows ``also``, and every perf_db row of them; vacuumed."""
    plain = DATA / "miopen" / f"{name}.db"
    plain.write_bytes(bz2.decompress((SHARED / "miopen" / f"{name}.db.bz2").read_bytes()))
    with sqlite3.connect(plain) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM config ORDER BY id LIMIT ?", (first,))]
        kept = ",".join(str(i) for i in {*ids, *also})
        db.execute(f"DELETE FROM config WHERE id NOT IN ({kept})")
        db.execute(f"DELETE FROM perf_db WHERE config NOT IN ({kept})")
    with sqlite3.connect(plain) as db:
        db.execute("VACUUM")
    (DATA / "miopen" / f"{name}.db.bz2").write_bytes(bz2.compress(plain.read_bytes()))
    plain.unlink()


def unmapped_configs(name: str) -> tuple[int, ...]:
    """The config rows of a perf-db that map to no driver problem."""
    from fleet.errors import MIOpenDbError
    from fleet.miopen.perfdb import CONFIG_COLUMNS, params_from_config

    plain = DATA / "miopen" / f"{name}.db"
    plain.write_bytes(bz2.decompress((SHARED / "miopen" / f"{name}.db.bz2").read_bytes()))
    with sqlite3.connect(plain) as db:
        rows = db.execute(f"SELECT id, {', '.join(CONFIG_COLUMNS)} FROM config").fetchall()
    plain.unlink()
    bad = []
    for row in rows:
        try:
            params_from_config(dict(zip(CONFIG_COLUMNS, row[1:], strict=True)))
        except MIOpenDbError:
            bad.append(row[0])
    return tuple(bad)


def write_miopen() -> None:
    folder = DATA / "miopen"
    folder.mkdir(exist_ok=True)
    for text in ("alexnet.txt", "google_net.txt", "conv_configs_NHWC.txt", "batch_norm.txt"):
        (folder / text).write_bytes((SHARED / "miopen" / text).read_bytes())
    networks = [folder / "alexnet.txt", folder / "google_net.txt"]
    wanted = conv_keys([line for path in networks for line in path.read_text().splitlines()])
    whole = cut_find_db("gfx803_36", wanted, every=40)
    keys = "".join(line.partition("=")[0] + "\n" for line in whole)
    (folder / "gfx803_36.HIP.fdb.keys.xz").write_bytes(lzma.compress(keys.encode(), preset=9))
    cut_find_db("gfx90a68", set(), every=250)
    cut_perf_db("gfx900_56", 2000)
    cut_perf_db("gfx1030_36", 1000, unmapped_configs("gfx1030_36"))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write_spaces()
    write_miopen()
