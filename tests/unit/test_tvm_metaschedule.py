"""FleetRunner's worker side without a fleet: a candidate built by InProcessBuilder, packed as the trial's artifact,
measured by the command workload's sandboxed child with MetaSchedule's evaluator config; and the honest NumPy of
fleet bench tvm (the OpenBLAS overrides unset in its child, the kernel named, the peak said how it is derived).

fleet/tvm/metaschedule.py, fleet/bench/tvm.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tvm")

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import te

from fleet.bundle import pack
from fleet.tvm.metaschedule import InProcessBuilder, pack_candidate, run_secs, tvm_target, workload_definition
from fleet.workers.workloads import Job, load_workload


def built_candidate(n: int = 32) -> tuple[str, list]:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    [result] = InProcessBuilder().build([ms.builder.BuilderInput(mod, tvm_target("cpu-x86_64", 2))])
    assert result.error_msg is None
    return str(result.artifact_path), [i.as_json() for i in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]


def measure(data: bytes, scratch: Path, repeat: int = 3) -> object:
    workload = load_workload(workload_definition(1, repeat, 1, 0, False, 60, sys.executable))
    job = Job(config={"candidate": "x"}, problem={"runner": "test"}, scratch=scratch, fetch=lambda _: b"")
    return workload.evaluate(job, data)


def test_a_candidate_is_measured_in_a_child_with_the_evaluator_config(tmp_path: Path) -> None:
    path, args = built_candidate()
    assert tvm_target("cpu-x86_64", 2).export()["num-cores"] == 2  # MetaSchedule needs it on a CPU
    data = pack_candidate(path, "cpu", args)
    shutil.rmtree(Path(path).parent)  # the builder's temporary folder: MetaSchedule's callback removes it in a tune
    measured = measure(data, tmp_path)
    assert measured.state == "evaluated", measured.stderr_tail
    secs = run_secs(measured.metrics, measured.objective)
    assert len(secs) == 3 and all(0 < s < 1 for s in secs)  # one per repeat, as LocalRunner's run_secs
    assert measured.objective == pytest.approx(sum(secs) / 3)


def test_one_child_measures_candidate_after_candidate_each_its_own_module(tmp_path: Path) -> None:
    from fleet.workers.workloads import command

    small, large = (pack_candidate(path, "cpu", args) for path, args in (built_candidate(16), built_candidate(128)))
    try:
        seconds = [measure(data, tmp_path, repeat=1).objective for data in (small, large, small)]
        resident = command._RESIDENT
        assert resident is not None and resident.starts == 1  # TVM imported once for the three
    finally:
        if command._RESIDENT is not None:
            command._RESIDENT.close()
            command._RESIDENT = None
    # The naive 128^3 matmul does 512 times the work of the 16^3 one: each measurement timed its own module (the
    # same path for each would have given the first module loaded, still in memory, every time).
    assert seconds[1] > 20 * seconds[0] and seconds[1] > 20 * seconds[2], seconds


def test_a_candidate_that_crashes_errors_its_trial_not_the_worker(tmp_path: Path) -> None:
    broken = pack({"mod.tar": b"not a tar", "candidate.json": b'{"device_type": "cpu", "args_info": []}'})
    measured = measure(broken, tmp_path)
    assert measured.state == "errored" and measured.reason.startswith("the run exited with status")


def test_the_numpy_child_runs_without_the_openblas_overrides_and_names_its_kernel(monkeypatch) -> None:
    from fleet.bench import tvm as bench

    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    seen: list[dict] = []
    real = subprocess.run

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(dict(kwargs["env"]))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(bench.subprocess, "run", spy)
    out = bench.numpy_run("tvm.dense", {"m": 64, "n": 64, "k": 64, "dtype": "float32"}, 1)
    assert out["gflops"] > 0 and out["blas"]["kernel"]
    assert not {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} & set(seen[0]) and seen[0]["OPENBLAS_NUM_THREADS"] == "1"
    nominal = bench.peak_gflops(2, measure=False)
    assert nominal["gflops"] > 0 and nominal["how"].startswith("2 cores x ") and "nominal" in nominal["how"]


def test_the_peak_is_measured_by_an_fma_loop_on_every_core_and_says_the_clock_it_implies() -> None:
    from fleet.bench import tvm as bench

    peak = bench.peak_gflops(2)
    assert peak["measured"], "this machine has a C compiler: the peak is measured, not read off cpu MHz"
    assert peak["how"].startswith("measured: independent ") and "FLOPs/cycle" in peak["how"]
    ghz = float(peak["how"].split(" GHz")[0].rsplit(" ", 1)[1])
    # The FMA loop runs at the FMA pipes' rate: the clock it implies is a CPU's (not half of one, as unfused
    # multiplies and adds would give, nor a multiple, as a loop the compiler folded away would).
    assert 1.0 < ghz < 6.5
    per_cycle = int(peak["how"].split(" FP32 FLOPs/cycle")[0].rsplit(" ", 1)[1])
    assert peak["gflops"] == pytest.approx(2 * ghz * per_cycle, rel=0.01)


INTRINSICS = """
import sys
from fleet.tvm.intrinsics import load_intrinsics
name = "tvm.s_tir.tensor_intrin"
load_intrinsics({"kind": "llvm"})
print(getattr(sys.modules[name], "fleet_partial", False), f"{name}.x86" in sys.modules, f"{name}.cuda" in sys.modules)
load_intrinsics({"kind": "opencl"})  # a kind Fleet does not know: every kind's, from TVM's own package
print(getattr(sys.modules[name], "fleet_partial", False), f"{name}.x86" in sys.modules, f"{name}.cuda" in sys.modules)
"""


def test_a_tuning_defines_its_targets_intrinsics_only_and_a_kind_not_known_gets_every_kind() -> None:
    """A CPU tuning skips CUDA's 18 s of intrinsics; a later tuning for an unknown kind must not be left with the
    stand-in package (it once was: the stand-in was taken for TVM's whole package)."""
    done = subprocess.run([sys.executable, "-c", INTRINSICS], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["True True False", "False True True"]


def test_the_measuring_child_with_no_candidate_ends_before_it_imports_tvm() -> None:
    # A child cut loose from its killed worker as it started finds its input ended: it leaves at once, not after
    # TVM's import (seconds on a loaded node), so nothing of the worker outlives it for long.
    from fleet.tvm.metaschedule import CHILD

    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CHILD, "1", "1", "1", "0", "0"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "json" in imported and "tvm" not in imported
