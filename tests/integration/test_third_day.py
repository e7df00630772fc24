"""A user's third day (issue 42): each guide's path as a user walks it, in real `fleet` processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SPACES = Path(__file__).resolve().parents[2].parent / "shared" / "tuning-spaces"


def fleet_cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# -- fleet bench search --history --trace ------------------------------------------------------------------------


def test_bench_search_with_history_writes_its_trace(tmp_path: Path) -> None:
    history = tmp_path / "spaces"
    history.mkdir()
    for name in ("gemm_clblast__RTX_2080_Ti", "gemm_clblast__RTX_3060_laptop"):
        (history / f"{name}.json.gz").symlink_to(SPACES / f"{name}.json.gz")
    trace = tmp_path / "trace.jsonl"
    space = str(history / "gemm_clblast__RTX_2080_Ti.json.gz")
    args = ["--history", str(history), "--space", space, "--repeats", "1", "--jobs", "1", "--horizon", "0.2"]

    done = fleet_cli(tmp_path, "bench", "search", *args, "--trace", str(trace))

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    # Each of the three strategies compared wrote its evaluations.
    assert {line["strategy"] for line in lines} == {"auto history", "auto", "random"}, lines[:3]
