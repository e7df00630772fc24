"""TVM schedules built for this CPU on small shapes: every sampled configuration gives NumPy's answer.

fleet/tvm/schedule.py, fleet/tvm/measure.py, fleet/workers/workloads/tvm.py; and the path where TVM is missing,
in subprocesses that hide the module. Each build is small (well under a second).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleet.errors import SpecError
from fleet.search import make_searcher
from fleet.tvm.measure import FAULT_VARIABLE, build, measure, run_module
from fleet.tvm.operators import BATCH_MATMUL, CONV2D, DENSE, check_problem, random_inputs
from fleet.tvm.spaces import space_for
from fleet.workers.workloads import Job, load_workload

ROOT = Path(__file__).resolve().parents[2]
TARGET = "cpu-x86_64"
PROBLEMS = [
    (DENSE, {"m": 16, "n": 32, "k": 24}),
    (BATCH_MATMUL, {"b": 2, "m": 8, "n": 16, "k": 8}),
    (CONV2D, {"n": 1, "c": 4, "h": 9, "w": 9, "f": 8, "kh": 3, "kw": 3, "pad_h": 1, "pad_w": 1}),
    (
        CONV2D,
        {"n": 2, "c": 4, "h": 10, "w": 11, "f": 8, "kh": 3, "kw": 2, "stride_h": 2, "pad_h": 1, "dilation_h": 2,
         "groups": 2},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "params"), PROBLEMS, ids=["dense", "batch_matmul", "conv2d", "conv2d-groups"])
def test_sampled_schedules_match_numpy(kind: str, params: dict) -> None:
    p = check_problem(kind, params)
    default = measure(kind, p, None, TARGET, repeats=1, min_repeat_ms=0)
    assert default.correct and default.gflops > 0
    configs = list(make_searcher("random", space_for(kind, p, TARGET), budget=6, seed=3).generate())
    assert len(configs) == 6
    for config in configs:
        timing = measure(kind, p, config, TARGET, repeats=2, min_repeat_ms=0)
        assert timing.correct, (config, timing.error)
        assert len(timing.samples) == 2 and all(s > 0 for s in timing.samples)
        assert timing.reason is None


def test_a_register_blocked_packed_matmul_is_built_and_correct() -> None:
    p = check_problem(DENSE, {"m": 32, "n": 64, "k": 32})
    config = {
        "tile_i": 16, "reg_i": 4, "tile_j": 64, "vec_j": 16, "unroll_k": 8, "order": "ji", "pack_b": True,
        "parallel": "i0j0",
    }  # fmt: skip
    assert space_for(DENSE, p, TARGET).is_valid(config)
    module = build(DENSE, p, config, TARGET)
    inputs = random_inputs(DENSE, p, seed=5)
    output, _ = run_module(module, DENSE, p, inputs, TARGET)
    np.testing.assert_allclose(output, inputs[0] @ inputs[1], rtol=1e-5, atol=1e-5)


def test_the_micro_tile_accumulates_in_registers() -> None:
    # The lowered loop nest: C's reg_i x vec_j tile lives in a local buffer, zeroed and written back with
    # whole vectors, updated with vectors inside the reduction; B is read from its packed panels.
    from fleet.tvm.schedule import scheduled

    p = check_problem(DENSE, {"m": 32, "n": 64, "k": 32})
    config = {
        "tile_i": 32, "reg_i": 4, "tile_j": 32, "vec_j": 16, "unroll_k": 2, "order": "ij", "pack_b": True,
        "parallel": "i0",
    }  # fmt: skip
    text = scheduled(DENSE, p, config, TARGET).script()
    assert 'C_local = T.sblock_alloc_buffer((32, 64), scope="local")' in text  # compacted to 4 x 16 when lowered
    assert "for i_2 in T.unroll(4):" in text and "for k_1 in T.unroll(2):" in text
    assert text.count("T.vectorized(16)") >= 3  # the initialisation, the update and the write-back
    assert "T.parallel" in text and "packedB" in text


def test_a_channel_vectorised_packed_conv2d_is_built_and_correct() -> None:
    # Accumulators vectorised over output channels: the local buffer is re-laid out with channels innermost.
    p = check_problem(CONV2D, {"n": 1, "c": 8, "h": 7, "w": 7, "f": 32, "kh": 3, "kw": 3, "pad_h": 1, "pad_w": 1})
    config = {
        "tile_f": 32, "reg_f": 16, "tile_y": 1, "tile_x": 7, "reg_x": 7, "order": "fyx", "pack": "kernel",
        "vectorize": "f2", "parallel": "nf0", "unroll": "rx", "pad": "root",
    }  # fmt: skip
    space = space_for(CONV2D, p, TARGET)
    assert space.is_valid(config) and set(config) == set(space.names)
    timing = measure(CONV2D, p, config, TARGET, repeats=1, min_repeat_ms=0)
    assert timing.correct, timing.error


def test_a_wrong_result_is_reported_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    p = check_problem(DENSE, {"m": 8, "n": 8, "k": 8})
    monkeypatch.setenv(FAULT_VARIABLE, "reference")  # the reference is off by one everywhere
    timing = measure(DENSE, p, None, TARGET, repeats=1, min_repeat_ms=0)
    assert not timing.correct and timing.error > 0.1
    assert "wrong result" in (timing.reason or "")


def _job(problem: dict, config: dict, tmp_path: Path) -> Job:
    return Job(config=config, problem=problem, scratch=tmp_path, fetch=lambda _: b"", tick=lambda: True)


def test_the_workload_measures_gflops_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workload = load_workload({"kind": "tvm", "op": "conv2d", "repeats": 2, "min_repeat_ms": 0})
    problem = PROBLEMS[2][1]
    config = next(make_searcher("random", space_for(CONV2D, problem, TARGET), budget=1, seed=1).generate())
    workload.check(list(config), problem)
    assert workload.maximize and workload.objective_name == "gflops"
    assert workload.toolchain().startswith("tvm ")
    built = workload.build(_job(problem, config, tmp_path))
    assert json.loads(built.data or b"") == config  # the build only carries the configuration
    monkeypatch.setenv("FLEET_WORKER_TARGET", TARGET)
    measured = workload.evaluate(_job(problem, config, tmp_path), built.data or b"")
    assert measured.state == "evaluated", measured.reason
    assert measured.metrics["correct"] is True and measured.metrics["time_s"] > 0
    assert measured.objective == pytest.approx(measured.metrics["gflops"])
    assert len(measured.samples) == 2
    monkeypatch.setenv(FAULT_VARIABLE, "reference")
    wrong = workload.evaluate(_job(problem, config, tmp_path), built.data or b"")
    assert wrong.state == "invalid" and wrong.metrics["correct"] is False


def test_the_workload_definition_is_checked() -> None:
    with pytest.raises(SpecError, match="needs 'op'"):
        load_workload({"kind": "tvm", "op": "softmax"})
    with pytest.raises(SpecError, match="unknown field 'run'"):
        load_workload({"kind": "tvm", "op": "dense", "run": []})
    with pytest.raises(SpecError, match="needs parameter 'k'"):
        load_workload({"kind": "tvm", "op": "dense"}).check([], {"m": 1, "n": 1})


# -- TVM missing ---------------------------------------------------------------------------------------------

HIDE_TVM = "import sys; sys.modules['tvm'] = None\n"


def _without_tvm(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_HOME": str(tmp_path / ".fleet"), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", HIDE_TVM + code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_without_tvm_the_cli_says_how_to_install_it_and_writes_nothing(tmp_path: Path) -> None:
    done = _without_tvm(
        "from fleet.cli import main\nsys.exit(main(['tvm', 'tune-model', 'tiny-cnn', '--budget', '1']))", tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "fleet: error: TVM is not installed here: pip install 'fleet-tune[tvm]'"
    ]
    assert not (tmp_path / ".fleet").exists()  # nothing written, no worker started


def test_without_tvm_the_rest_of_fleet_works(tmp_path: Path) -> None:
    code = (
        "from fleet.cli import main\n"
        "assert main(['tvm', 'models']) == 0\n"
        "assert main(['tvm', 'space', 'tvm.dense', '--param', 'm=8', '--param', 'n=8', '--param', 'k=8']) == 0\n"
        "from fleet.workers.workloads import load_workload\n"
        "load_workload({'kind': 'noop'})\n"
        "print('ok')\n"
    )
    done = _without_tvm(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok") and "tiny-cnn" in done.stdout


def test_without_tvm_a_worker_errors_the_trial_with_the_message(tmp_path: Path) -> None:
    code = (
        "from pathlib import Path\n"
        "from fleet.workers.workloads import Job, load_workload\n"
        "w = load_workload({'kind': 'tvm', 'op': 'dense'})\n"
        "job = Job(config={}, problem={'m': 8, 'n': 8, 'k': 8}, scratch=Path('.'), fetch=lambda _: b'')\n"
        "m = w.evaluate(job, b'{}')\n"
        "print(m.state, m.reason)\n"
    )
    done = _without_tvm(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("errored TVM is not installed here: pip install 'fleet-tune[tvm]'")


def test_run_model_prints_a_table_of_default_tuned_and_numpy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleet.cli import main

    for name in [k for k in os.environ if k.startswith("FLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / ".fleet"))  # embedded: SQLite, nothing tuned yet
    assert main(["tvm", "run-model", "tiny-cnn", "--target", TARGET, "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["layer", "operator", "default", "ms", "tuned"]
    assert [line.split()[0] for line in lines[1:5]] == ["conv1", "conv2", "fc", "total"]
    assert lines[-1].startswith("* no best configuration on this target")


@pytest.mark.parametrize(("kind", "params"), PROBLEMS[::2], ids=["dense", "conv2d"])
def test_gpu_schedules_compile_for_cuda(kind: str, params: dict) -> None:
    # Code generation only: whether they run and match NumPy is for a GPU worker's tvm_measure to say.
    import tvm

    from fleet.tvm.measure import tvm_target
    from fleet.tvm.schedule import scheduled

    p = check_problem(kind, params)
    configs = [None, *make_searcher("random", space_for(kind, p, "sm_90"), budget=3, seed=2).generate()]
    for config in configs:
        executable = tvm.compile(scheduled(kind, p, config, "sm_90"), target=tvm_target("sm_90"))
        assert executable is not None
    assert str(tvm_target("sm_90").kind) == "cuda" and str(tvm_target("gfx90a:104").kind) == "rocm"
