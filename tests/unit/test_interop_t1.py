"""T1 input files as specs, and spaces written back as T1, checked with the real kernel_tuner and jsonschema."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from fleet.bundle import unpack_files
from fleet.errors import SpecError
from fleet.interop.t1 import parameter_values, t1_document
from fleet.spec import load_spec
from fleet.spec.workloads.command import fill

DATA = Path(__file__).resolve().parents[1] / "data" / "t1"


def t1_copy(tmp_path: Path, name: str, change: dict | None = None) -> Path:
    """A T1 file of tests/data/t1 and its kernels in ``tmp_path``, with top-level ``KernelSpecification`` fields
    changed."""
    for kernel in ("vector_add.c", "vector_add.cu"):
        shutil.copy(DATA / kernel, tmp_path / kernel)
    data = json.loads((DATA / name).read_text())
    data["KernelSpecification"].update(change or {})
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("text", "kind", "values"),
    [
        ("[16, 32, 48]", "int", [16, 32, 48]),
        ("range(1, 5)", "int", [1, 2, 3, 4]),
        ("list(range(0, 10, 4))", "uint", [0, 4, 8]),
        ("[2**i for i in range(4, 7)]", "int", [16, 32, 64]),
        ("[i * 2 for i in range(6) if i % 2 == 1]", "int", [2, 6, 10]),
        ("[0.5, 1, 2.5]", "float", [0.5, 1, 2.5]),
        ("['a', 'b']", "string", ["a", "b"]),
        ("[True, False]", "bool", [True, False]),
    ],
)
def test_parameter_values_are_read_as_kernel_tuner_evaluates_them(text: str, kind: str, values: list) -> None:
    assert parameter_values({"Name": "p", "Type": kind, "Values": text}) == values


@pytest.mark.parametrize(
    ("text", "kind", "said"),
    [
        ("__import__('os').system('true')", "int", "cannot read its Values"),
        ("[1, 2.5]", "int", "of type int has the value 2.5"),
        ("[-1, 2]", "uint", "of type uint has the value -1"),
        ("[]", "int", "has no values"),
    ],
)
def test_bad_parameter_values_are_one_clear_error(text: str, kind: str, said: str) -> None:
    with pytest.raises(SpecError, match=said):
        parameter_values({"Name": "p", "Type": kind, "Values": text})


def test_a_c_t1_file_is_a_spec_of_a_command_workload(tmp_path: Path) -> None:
    spec = load_spec(t1_copy(tmp_path, "vector_add_c.json"))
    assert spec.name == "vector_add_c" and spec.target.startswith("cpu-")
    (problem,) = spec.problems
    assert problem.kind == "kernel" and problem.params == {"kernel_name": "vector_add", "problem_size": "1000000"}
    assert spec.space.names == ["block_size_x", "unroll"] and spec.space.size == 20
    assert sum(1 for _ in spec.space if spec.space.is_valid(_)) == 15
    assert [c.text for c in spec.space.constraints] == ["block_size_x % unroll == 0"]
    workload = spec.workload
    argv = fill(workload["build"], {"block_size_x": 32, "unroll": 4})
    assert argv[0] == "cc" and "-Dblock_size_x=32" in argv and "-Dunroll=4" in argv
    files = unpack_files(spec.files[workload["bundle"]])
    assert files["vector_add.c"] == (DATA / "vector_add.c").read_bytes()
    assert '#include "vector_add.c"' in files["fleet_t1_main.c"].decode()
    assert spec.options["interop"]["t1"]["KernelSpecification"]["KernelName"] == "vector_add"


def test_the_c_host_program_builds_and_prints_one_json_line(tmp_path: Path) -> None:
    """What a build worker runs, run here: the generated program with the kernel, for one configuration."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    spec = load_spec(t1_copy(tmp_path, "vector_add_c.json"))
    build = tmp_path / "build"
    build.mkdir()
    for name, data in unpack_files(spec.files[spec.workload["bundle"]]).items():
        (build / name).write_bytes(data)
    argv = fill(spec.workload["build"], {"block_size_x": 64, "unroll": 2})
    subprocess.run(argv, cwd=build, check=True, capture_output=True, timeout=120)
    done = subprocess.run(spec.workload["run"], cwd=build, capture_output=True, text=True, timeout=60, check=True)
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["time_ms"] > 0 and len(record["times"]) == 7


def test_a_cuda_t1_file_builds_with_nvcc_for_its_target(tmp_path: Path) -> None:
    """The CUDA host program compiles with nvcc for the target the device name gives; run without a GPU, it says
    so in one line and exits 1 (with one, it prints its time)."""
    spec = load_spec(t1_copy(tmp_path, "vector_add_cuda.json"))
    assert spec.target == "sm_90"
    argv = fill(spec.workload["build"], {"block_size_x": 128, "tile_size_x": 2})
    assert argv[:2] == ["nvcc", "-arch=sm_90"] and "-std=c++17" in argv and "-Dtile_size_x=2" in argv
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    build = tmp_path / "build"
    build.mkdir()
    for name, data in unpack_files(spec.files[spec.workload["bundle"]]).items():
        (build / name).write_bytes(data)
    made = subprocess.run(argv, cwd=build, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    done = subprocess.run(spec.workload["run"], cwd=build, capture_output=True, text=True, timeout=120)
    if done.returncode == 0:
        assert json.loads(done.stdout.strip().splitlines()[-1])["time_ms"] > 0
    else:
        assert done.returncode == 1 and done.stderr.startswith("no CUDA device to run vector_add on: ")
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"KernelName": 7}, "not a T1 input file: 7 is not of type 'string' (at KernelSpecification/KernelName)"),
        ({"Language": "OpenCL"}, "Fleet builds T1 kernels in CUDA, HIP, C, not OpenCL"),
        ({"KernelFile": "missing.c"}, "KernelFile 'missing.c' is not beside the T1 file"),
        (
            {"Arguments": [{"Type": "float", "MemoryType": "Vector", "Size": "unroll * 4", "FillType": "Random"}]},
            "changes with 'unroll'",
        ),
        (
            {"Arguments": [{"Type": "float", "MemoryType": "Vector", "Size": 4, "FillType": "BinaryRaw"}]},
            "FillType BinaryRaw is not supported",
        ),
    ],
)
def test_a_bad_t1_file_is_one_line_and_exit_1(tmp_path: Path, change: dict, said: str) -> None:
    path = t1_copy(tmp_path, "vector_add_c.json", change)
    with pytest.raises(SpecError, match="^" + str(path).replace(".", r"\.")):
        load_spec(path)
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FLEET_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_space_is_written_as_t1_that_reads_back_the_same(tmp_path: Path) -> None:
    spec = load_spec(t1_copy(tmp_path, "vector_add_cuda.json"))
    problem = SimpleNamespace(kind="kernel", params=spec.problems[0].params)
    document, unwritable, notes = t1_document(
        spec.space.to_dict(), spec.options, {"name": "grid"}, problem, spec.target
    )
    assert document is not None and not unwritable and not notes
    # The real schema, not Fleet's widened copy: a CUDA kernel's file is plain T1.
    from kernel_tuner.file_utils import input_file_schema

    jsonschema.validate(document, input_file_schema()[1])
    assert document["Search"] == {"Name": "brute_force"}
    assert document["KernelSpecification"]["ProblemSize"] == [10000000]
    (tmp_path / "out").mkdir()
    shutil.copy(DATA / "vector_add.cu", tmp_path / "out" / "vector_add.cu")
    (tmp_path / "out" / "again.json").write_text(json.dumps(document))
    again = load_spec(tmp_path / "out" / "again.json")
    assert again.space.to_dict() == spec.space.to_dict() and again.problems == spec.problems
    assert again.workload["build"] == spec.workload["build"]


def test_a_space_t1_cannot_express_is_refused_with_reasons() -> None:
    problem = SimpleNamespace(kind="kernel", params={"kernel_name": "k", "problem_size": "64"})
    space = {"knobs": {"x": {"values": [1, "a"], "build": True}, "y": [1, 2]}, "constraints": ["y < 2"]}
    document, unwritable, _ = t1_document(space, {"space_file": {"path": "s.py"}}, {}, problem, "sm_80")
    assert document is None
    assert unwritable == {
        "knob 'x': values of several types": 1,
        "constraints that are a space file's Python predicate": 1,
    }
    # Expressible, but with no kernel file: what was made up is said.
    document, _, notes = t1_document({"knobs": {"y": [1, 2]}}, {}, {}, problem, "sm_80")
    assert document is not None and document["KernelSpecification"]["KernelFile"] == "k.cu"
    assert any("which Fleet does not have" in n for n in notes)


def test_an_argument_size_is_computed_as_kernel_tuner_does_and_a_huge_power_is_refused_before_it_runs() -> None:
    from fleet.interop.t1 import argument_size

    assert argument_size("ProblemSize[0] * ProblemSize[1]", [64, 32], {}) == 2048
    assert argument_size("2**10 + max(tile)", [64], {"tile": [1, 4, 16]}) == 1040
    with pytest.raises(SpecError, match="too large for a size"):
        argument_size("9**9**9", [64], {})  # computed as written, it would never end
    with pytest.raises(SpecError, match="changes with 'tile'"):
        argument_size("ProblemSize[0] * tile", [64], {"tile": [1, 4]})
