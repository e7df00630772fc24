"""examples/matmul-cuda without a GPU: the spec loads, its constraints keep every configuration the kernel refuses
out of the space, the kernel computes the right product when emulated on the CPU, nvcc (where installed) compiles
it, and ``fleet tune`` without nvcc stops with one line."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.driving.campaign import load_spec
from fleet.space import Space

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "matmul-cuda"
SPEC = EXAMPLE / "spec.json"
DEFINES = {
    name: name.upper()
    for name in (
        "bm", "bn", "bk", "wm", "wn", "wn_iter", "tm", "tn", "double_buffer", "async_copy", "swizzle", "min_blocks"
    )
}  # fmt: skip
GXX = shutil.which("g++")
CPP = shutil.which("cpp")
NVCC = shutil.which("nvcc")


def _space() -> Space:
    return load_spec(SPEC).space


def _defines(config: dict) -> list[str]:
    return [f"-D{DEFINES[name]}={int(value) if isinstance(value, bool) else value}" for name, value in config.items()]


def test_spec_routes_to_sm_90_with_the_default_strategy() -> None:
    spec = load_spec(SPEC)
    assert spec.target == "sm_90"
    assert spec.strategy["name"] == "auto"
    assert [p.params for p in spec.problems] == [{"n": 4096}]
    assert spec.workload["run"] == ["./matmul", "{n}"]
    assert spec.workload["objective"] == {"name": "gflops", "json": "gflops", "goal": "max"}
    # Every knob reaches the build as the define the kernel reads, and the build is for the spec's target.
    build = spec.workload["build"]
    assert {f"-D{define}={{{knob}}}" for knob, define in DEFINES.items()} <= set(build)
    assert "-arch=sm_90" in build
    assert [k.name for k in spec.space.knobs] == list(DEFINES)


@pytest.mark.skipif(CPP is None, reason="no C preprocessor")
def test_every_configuration_of_the_space_passes_the_kernels_rules(tmp_path: Path) -> None:
    """One preprocessor run over the whole space: kernel.cuh's #error rules fire for none of its configurations.

    Its rules come before its code (the first ``__device__`` line), and only they are included once a configuration:
    the preprocessor's passes over the code's lines took two thirds of the test's 18 s, and proved nothing more."""
    space = _space()
    valid = list(space)
    assert 10_000 < len(valid) < math.prod(len(k.values) for k in space.knobs)  # some ruled out, not all
    kernel = (EXAMPLE / "kernel.cuh").read_text()
    cut = kernel.index("\n__device__")
    assert "#error" in kernel[:cut] and "#error" not in kernel[cut:]
    rules = tmp_path / "rules.cuh"
    rules.write_text(kernel[:cut] + "\n")
    lines = []
    for index, config in enumerate(valid):
        lines.append(f'#line 1 "config-{index}"')
        for name, value in config.items():
            lines += [f"#undef {DEFINES[name]}", f"#define {DEFINES[name]} {int(value)}"]
        lines.append(f'#include "{rules}"')
    source = tmp_path / "all.c"
    source.write_text("\n".join(lines) + "\n")
    done = subprocess.run([CPP, "-P", str(source), "-o", os.devnull], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[:2000]
    assert "#error" not in done.stderr


DEFAULTS = {
    "bm": 128,
    "bn": 128,
    "bk": 16,
    "wm": 64,
    "wn": 32,
    "wn_iter": 2,
    "tm": 4,
    "tn": 4,
    "double_buffer": True,
    "async_copy": True,
    "swizzle": 8,
    "min_blocks": 1,
}


def test_the_kernels_defaults_are_in_the_space() -> None:
    assert _space().is_valid(DEFAULTS)


@pytest.mark.skipif(CPP is None, reason="no C preprocessor")
@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"tm": 2}, "multiples of 4"),
        ({"wm": 48}, "whole warp tiles"),
        ({"bm": 256, "bn": 256, "wm": 32, "wn": 32}, "at most 1024 threads"),
        ({"wn_iter": 3}, "TN-wide lanes"),
        ({"wm": 32, "wn": 32, "tm": 8, "tn": 8, "wn_iter": 1}, "whole sub-tiles of 32 lanes"),
        ({"bk": 8, "bm": 64, "bn": 128, "wm": 32, "wn": 32}, "whole float4s for every thread"),
        ({"bk": 32, "bm": 256, "wm": 128}, "48 KiB"),
        ({"min_blocks": 16}, "2048 threads"),
    ],
)
def test_configurations_the_kernel_refuses_are_outside_the_space(change: dict, rule: str, tmp_path: Path) -> None:
    space = _space()
    config = DEFAULTS | change
    assert not (all(config[k.name] in k.values for k in space.knobs) and space.is_valid(config))
    done = subprocess.run(
        [CPP, "-P", *_defines(config), str(EXAMPLE / "kernel.cuh"), "-o", os.devnull],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and rule in done.stderr


EMULATED = [
    {},  # the kernel's defaults: 128 x 128 tiles of 8 warps, double-buffered, cp.async, swizzled by 8
    {"DOUBLE_BUFFER": 0, "ASYNC_COPY": 0, "SWIZZLE": 1},
    {"BM": 64, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "WN_ITER": 2, "TM": 8, "TN": 4, "SWIZZLE": 3},
    {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "WN_ITER": 1, "TM": 4, "TN": 8, "DOUBLE_BUFFER": 0},
    {"BM": 32, "BN": 64, "BK": 8, "WM": 32, "WN": 32, "WN_ITER": 1, "TM": 4, "TN": 4, "SWIZZLE": 2},
]


@pytest.mark.skipif(GXX is None, reason="no g++")
@pytest.mark.parametrize("defines", EMULATED, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "defaults")
def test_kernel_emulated_on_the_cpu_computes_the_product(defines: dict, tmp_path: Path) -> None:
    """An order that is no multiple of the tiles, so the padding, the last tiles and the barriers all count."""
    binary = tmp_path / "emulate"
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    build = subprocess.run(
        [GXX, "-std=c++20", "-O1", "-pthread", *flags, str(EXAMPLE / "emulate.cpp"), "-o", str(binary)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    # 150 leaves several tiles each way at the smaller tiles, so that the swizzled order walks a partial group.
    for n in (37, 150):
        done = subprocess.run([str(binary), str(n)], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)
        assert result["check"] == "ok" and result["n"] == n and result["ld"] >= n


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("defines", EMULATED[:3], ids=["defaults", "single-buffer", "8x4-tiles"])
def test_nvcc_compiles_the_kernel_for_sm_90(defines: dict, tmp_path: Path) -> None:
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    out = tmp_path / "matmul.ptx"
    done = subprocess.run(
        [NVCC, "-ptx", "-arch=sm_90", *flags, str(EXAMPLE / "matmul.cu"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert ".entry _Z11tuned_sgemmPKfS0_Pfi" in out.read_text()


def test_a_sample_of_the_space_builds_with_distinct_arguments() -> None:
    """The build template fills every knob, so two configurations never share an artifact by accident."""
    from fleet.workers.workloads.command import fill

    spec = load_spec(SPEC)
    sample = random.Random(5).sample(list(spec.space), 20)
    argvs = {tuple(fill(spec.workload["build"], {**spec.problems[0].params, **c})) for c in sample}
    assert len(argvs) == 20
    flags = [arg for argv in argvs for arg in argv if "DOUBLE_BUFFER" in arg or "ASYNC_COPY" in arg]
    assert len(flags) == 40 and all(arg[-2:] in ("=0", "=1") for arg in flags)


def test_tune_without_nvcc_or_gpu_stops_with_one_line(tmp_path: Path) -> None:
    """nvcc is the build workers' business (issue 13): here, the missing GPU is what stops the local workers."""
    fleet = Path(sys.executable).with_name("fleet")
    path = os.pathsep.join(d for d in ("/usr/bin", "/bin") if not (Path(d) / "nvcc").exists())
    env = {"PATH": path, "HOME": str(tmp_path), "FLEET_HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}
    done = subprocess.run(
        [str(fleet), "tune", str(SPEC)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "fleet: error: no GPU of target sm_90 found on this node; name them with --gpus 0,1,..."
    ]
    # Nothing it started stays behind: the private Redis it started for the run is gone too.
    left = [
        entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit() and str(tmp_path) in _cmdline(entry)
    ]
    assert left == []


def _cmdline(process: Path) -> str:
    try:
        return (process / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


GPU_CHECK = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"


def test_gpu_check_dry_run_lists_its_offline_steps(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "run", "--dry-run", "--wheelhouse", str(tmp_path / "wheels")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    steps = [line.removeprefix("+ ").split() for line in done.stderr.splitlines()]
    assert steps[0][1:4] == ["-m", "venv", "--without-pip"]  # a Python without ensurepip can make it
    # The venv is filled by the wheelhouse's own pip, run from its wheel: nothing from the network.
    assert steps[1][1].startswith(str(tmp_path / "wheels" / "pip-")) and steps[1][1].endswith(".whl/pip")
    assert steps[1][2:] == ["install", "--no-index", "--find-links", str(tmp_path / "wheels"), "fleet-tune[gpu]"]
    assert steps[2][1:] == ["tune", str(SPEC), "--json"]
    assert steps[3][0] == "nvcc" and "-DMATMUL_CUBLAS" in steps[3] and steps[3][-2:] == ["-lcublas", "-ldl"]
    assert steps[4][1:] == ["4096", "--cublas"]
    # The time-and-energy campaign over the clock, on a copy of energy.json beside the sources it names.
    assert steps[5][1:3] == ["tune", steps[5][2]] and steps[5][2].endswith("/energy/energy.json")
    assert done.stdout == ""


def test_gpu_check_summarizes_a_finished_embedded_campaign(tmp_path: Path) -> None:
    """The whole script on this machine's CPU, with the C example in place of the CUDA one and no cuBLAS."""
    out = tmp_path / "summary.json"
    spec = EXAMPLE.parent / "matmul-c" / "spec.json"
    run = [sys.executable, str(GPU_CHECK), "run", "--spec", str(spec), "--budget", "2"]
    done = subprocess.run(
        [*run, "--no-cublas", "--no-energy", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert json.loads(done.stdout) == summary
    assert summary["campaign"] == "matmul-c" and summary["spec"] == "examples/matmul-c/spec.json"
    assert summary["every_check_passed"] is True and summary["trials"]["evaluated"] >= 2
    assert summary["gflops"] > 0 and set(summary["best_config"]) == {"tile_i", "tile_j", "tile_k", "unroll"}
    assert summary["cublas_gflops"] is None and summary["ratio"] is None
    assert summary["observer"] == {}  # a CPU worker observes no GPU
    assert summary["date"].startswith("20") and len(summary["commit"]) == 40
    # What the database says of the run: the workers of the target, every trial evaluated, nothing observed.
    fleet = summary["fleet"]
    assert {w["role"]: w["queues"] for w in fleet["workers"]} == {
        "build": ["build.cpu-x86_64"],
        "eval": ["eval.cpu-x86_64"],
    }
    assert fleet["states"] == {"evaluated": summary["trials"]["evaluated"]} and fleet["reasons"] == {}
    assert fleet["measurements"] == fleet["states"]["evaluated"] and fleet["read_in_every_measurement"] == []
    assert summary["checks"] == {} and summary["energy"] is None
