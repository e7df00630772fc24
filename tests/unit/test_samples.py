"""The samples that ship in examples/ (the docs use them) read as what they are, with their licence beside them."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from fleet.replay import load_recorded

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("name", "recorded", "valid"), [("pnpoly__RTX_2080_Ti", 360, 350), ("convolution_kt__RTX_2080_Ti", 720, 688)]
)
def test_the_recorded_spaces_replay(name: str, recorded: int, valid: int) -> None:
    space = load_recorded(EXAMPLES / "tuning-spaces" / f"{name}.json.gz")
    assert (space.size, space.valid_count) == (recorded, valid)
    with gzip.open(EXAMPLES / "tuning-spaces" / f"{name}.json.gz") as file:
        raw = json.load(file)
    # A sub-space: every configuration of the kept values that the recording has is still there.
    assert all(all(r[k] in raw["tune_params"][k] for k in raw["tune_params"]) for r in raw["cache"].values())


def test_the_miopen_samples_are_real_files_of_each_kind() -> None:
    from fleet.miopen.driver import DriverLineError, parse_lines

    lines = (EXAMPLES / "miopen" / "alexnet.txt").read_text().splitlines()
    assert lines and not any(isinstance(p, DriverLineError) for _, p in parse_lines(lines))
    older = (EXAMPLES / "miopen" / "gfx803_36.HIP.fdb.txt").read_text().splitlines()
    newer = (EXAMPLES / "miopen" / "gfx90a68.HIP.fdb.txt").read_text().splitlines()
    assert len(older) == len(newer) == 40
    assert older[0].split("=", 1)[1].count(",") >= 4 and "<unused>" in older[0]
    assert "<unused>" not in newer[0]
    with sqlite3.connect(EXAMPLES / "miopen" / "gfx900_56.db") as db:
        assert db.execute("select count(*) from config").fetchone() == (40,)
        assert db.execute("select count(*) from perf_db where config not in (select id from config)").fetchone() == (0,)


@pytest.mark.parametrize("folder", ["miopen", "tuning-spaces"])
def test_each_sample_folder_says_where_its_files_come_from_and_their_licence(folder: str) -> None:
    readme = (EXAMPLES / folder / "README.md").read_text()
    assert "## Licence" in readme and "MIT" in readme
    assert (EXAMPLES / "LICENSE-MIT.txt").is_file()
    for path in (EXAMPLES / folder).iterdir():
        if path.name != "README.md":
            assert f"`{path.name}`" in readme, f"{folder}/README.md does not name {path.name}"
