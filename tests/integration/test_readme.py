"""The README's Python example, run as written, in a fresh directory with the examples beside it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("gcc") is None, reason="the example builds with gcc")
def test_the_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "matmul-c", tmp_path / "examples" / "matmul-c")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_HOME"] = str(tmp_path / ".fleet")
    done = subprocess.run(
        [sys.executable, "-c", _python_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    problem_id, rest = lines[0].split(" ", 1)
    assert int(problem_id) >= 1 and "tile_i" in rest
    counts = json.loads(lines[1].replace("'", '"'))
    assert counts == {"evaluated": 49}
    trials = lines[2:5]
    assert all("tile_i" in line and "[" in line for line in trials)  # config, objective, samples
    assert "tile_i" in lines[5]
