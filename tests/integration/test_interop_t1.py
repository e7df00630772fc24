"""T1 input files on a real fleet (PostgreSQL, Redis, a worker): a C kernel tuned as it is, exported back to T1 and
tuned again to the same space; a CUDA kernel built by nvcc on the worker, its run a clear error without a GPU; a
space T1 cannot express is said, and no T1 file written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from fleet.store import Trial
from tests.conftest import Fleet

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "t1"


def copy_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vector_add.c", "vector_add.cu", "vector_add_c.json", "vector_add_cuda.json"):
        shutil.copy(DATA / name, folder / name)
    return folder


def trials_of(fleet: Fleet, name: str) -> list:
    campaign = fleet.store.campaign(name)
    with fleet.store.transaction() as connection:
        query = select(Trial.config, Trial.state, Trial.reason).where(Trial.campaign_id == campaign.id)
        return connection.execute(query.order_by(Trial.id)).all()


def test_a_c_kernel_is_tuned_from_t1_exported_to_t1_and_tuned_again_to_the_same_space(
    fleet: Fleet, tmp_path: Path
) -> None:
    folder = copy_data(tmp_path / "in")
    fleet.start_worker()
    done = fleet.cli("tune", str(folder / "vector_add_c.json"), "--target", fleet.target, "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    first = trials_of(fleet, "vector_add_c")
    assert len(first) == 15 and {t.state for t in first} == {"evaluated"}
    (problem,) = fleet.store.campaign_problems(fleet.store.campaign("vector_add_c").id)
    (best, config), *_ = fleet.store.best(problem.id, fleet.target)
    assert best.objective > 0 and best.objective_name == "time_ms" and set(config) == {"block_size_x", "unroll"}

    out = tmp_path / "out"
    done = fleet.cli("export", "kt", "vector_add_c", "-o", str(out), check=True)
    (t1,) = out.glob("*/vector_add_T1.json")
    assert f"T1 input file -> {t1}" in done.stdout and "no T1 file" not in done.stderr
    assert (t1.parent / "vector_add.c").read_bytes() == (DATA / "vector_add.c").read_bytes()
    done = fleet.cli("tune", str(t1), "--name", "again", "--target", fleet.target, "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    again = trials_of(fleet, "again")
    assert sorted(json.dumps(t.config, sort_keys=True) for t in again) == sorted(
        json.dumps(t.config, sort_keys=True) for t in first
    )


def test_a_cuda_kernel_builds_with_nvcc_on_the_worker_and_its_run_says_there_is_no_gpu(
    fleet: Fleet, tmp_path: Path
) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on this machine")
    folder = copy_data(tmp_path / "in")
    fleet.start_worker()
    done = fleet.cli(
        "tune", str(folder / "vector_add_cuda.json"), "--target", fleet.target, "--budget", "2", "--json", timeout=600
    )
    trials = trials_of(fleet, "vector_add_cuda")
    assert len(trials) == 2, done.stderr
    for trial in trials:
        # Built (a failed build would say "the build"), then run: without a GPU the program says so.
        assert trial.state == "errored" and "the run" in trial.reason, trial.reason
    with fleet.store.transaction() as connection:
        tails = connection.scalars(select(Trial.stderr_tail)).all()
    assert all("no CUDA device to run vector_add on" in (tail or "") for tail in tails), tails


def test_a_space_t1_cannot_express_writes_no_t1_file_and_says_why(fleet: Fleet, tmp_path: Path) -> None:
    cache = {
        "device_name": "NVIDIA A100-PCIE-40GB",
        "kernel_name": "mixed",
        "problem_size": [64],
        "tune_params_keys": ["x"],
        "tune_params": {"x": [1, "two"]},
        "objective": "time",
        "cache": {"1": {"x": 1, "time": 1.0}, "two": {"x": "two", "time": 2.0}},
    }
    path = tmp_path / "A100.json"
    path.write_text(json.dumps(cache))
    done = fleet.cli("import", "kt", str(path), "--json", check=True)
    campaign = json.loads(done.stdout)[0]["campaign"]
    done = fleet.cli("export", "kt", campaign, "-o", str(tmp_path / "out"), check=True)
    assert "fleet: no T1 file (problem 1): 1 knob 'x': values of several types" in done.stderr
    assert not list((tmp_path / "out").glob("*/*_T1.json")) and list((tmp_path / "out").glob("*/*_T4.json"))
