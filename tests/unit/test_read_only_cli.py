"""Commands that only read never create a database: they name the one they looked for, in one line, and exit 1.

Also ``fleet validate``, which opens no database at all, and the one CLI shape (``fleet best`` of a campaign).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fleet(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


READ_ONLY = [
    ["status"],
    ["best", "matmul-c"],
    ["report", "matmul-c"],
    ["trials", "matmul-c"],
    ["trials", "matmul-c", "--csv"],
    ["trial", "1"],
    ["resume", "matmul-c"],
    ["cancel", "matmul-c"],
    ["pause", "matmul-c"],
]


def test_a_read_only_command_in_a_folder_without_fleet_creates_nothing(tmp_path: Path) -> None:
    # One process runs them all (a process start costs seconds here), each as `fleet ARGS` would, its stderr apart.
    code = (
        "import contextlib, io, json, sys\n"
        "from fleet.cli import main\n"
        "out = []\n"
        f"for args in {READ_ONLY!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        out.append((main(args), err.getvalue()))\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    expected = (
        f"fleet: error: no Fleet database at {tmp_path / '.fleet' / 'fleet.db'}: no campaign ran here: run from the "
        "folder holding .fleet/, or set FLEET_HOME\n"
    )
    for args, (status, stderr) in zip(READ_ONLY, json.loads(done.stdout.splitlines()[-1]), strict=True):
        assert (status, stderr) == (1, expected), args
    assert list(tmp_path.iterdir()) == []


def test_validate_prints_what_it_would_run_and_writes_nothing(tmp_path: Path) -> None:
    done = _fleet(tmp_path, "validate", str(ROOT / "examples" / "matmul-c" / "spec.json"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("spec.json: valid")
    assert "  problem   matmul-c n=512" in lines
    assert "  space     320 configurations, 300 of them valid under the constraints" in lines
    assert "  strategy  random, 48 trials per problem" in lines
    assert "  trials    48 in all (+ 1 baseline)" in lines
    assert list(tmp_path.iterdir()) == []


def test_validate_of_a_bad_spec_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "spec.json").write_text('{"name": "x"}')
    done = _fleet(tmp_path, "validate", "spec.json")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("fleet: error: ")


def test_best_takes_a_campaign_or_a_problem_kind(tmp_path: Path) -> None:
    done = _fleet(tmp_path, "best")
    assert done.returncode == 2 and "give a CAMPAIGN, or a problem with --kind KIND or --problem ID" in done.stderr
    done = _fleet(tmp_path, "best", "matmul-c", "--param", "n=512")
    assert done.returncode == 2 and "--param, --target, --from and -n go with --kind or --problem" in done.stderr
