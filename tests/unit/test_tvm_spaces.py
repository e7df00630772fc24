"""TVM operator problems and their spaces: parameters, constraints, the MIOpen mapping, records parsing.

fleet/tvm/operators.py, fleet/tvm/spaces.py, fleet/tvm/records.py (parsing). NumPy only; nothing is built.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from fleet.errors import SpecError
from fleet.tvm.operators import (
    BATCH_MATMUL,
    CONV2D,
    DENSE,
    check_problem,
    conv2d_from_miopen,
    conv2d_im2col,
    flops,
    output_hw,
    random_inputs,
)
from fleet.tvm.records import RecordError, parse_records
from fleet.tvm.spaces import divisors, space_for, starting_points
from tests.conftest import MIOPEN

ALEXNET = MIOPEN / "alexnet.txt"

CONV = {"n": 2, "c": 4, "h": 10, "w": 11, "f": 6, "kh": 3, "kw": 2, "stride_h": 2, "pad_h": 1, "dilation_w": 2}


def test_problem_parameters_are_checked_and_completed() -> None:
    p = check_problem(CONV2D, CONV)
    assert p["stride_w"] == 1 and p["pad_w"] == 0 and p["groups"] == 1 and p["dtype"] == "float32"
    assert output_hw(p) == ((10 + 2 - 2 - 1) // 2 + 1, (11 - 2 - 1) // 1 + 1)
    assert flops(DENSE, check_problem(DENSE, {"m": 2, "n": 3, "k": 4})) == 48
    with pytest.raises(SpecError, match="needs parameter 'k'"):
        check_problem(DENSE, {"m": 2, "n": 3})
    with pytest.raises(SpecError, match="no parameter 'q'"):
        check_problem(DENSE, {"m": 2, "n": 3, "k": 4, "q": 1})
    with pytest.raises(SpecError, match="groups 3 must divide"):
        check_problem(CONV2D, {**CONV, "groups": 3})
    with pytest.raises(SpecError, match="only float32"):
        check_problem(DENSE, {"m": 2, "n": 3, "k": 4, "dtype": "float16"})
    with pytest.raises(SpecError, match="does not fit"):
        check_problem(CONV2D, {**CONV, "h": 1, "pad_h": 0})
    with pytest.raises(SpecError, match="unknown TVM operator"):
        check_problem("tvm.softmax", {})


def test_divisors_are_exact_and_bounded() -> None:
    assert divisors(12, 6) == [1, 2, 3, 4, 6]
    big = divisors(720720, 512)
    assert len(big) <= 12 and all(720720 % d == 0 and d <= 512 for d in big)
    assert {1, 2, 4, 8, 16} <= set(big)


@pytest.mark.parametrize(
    ("kind", "params"),
    [(DENSE, {"m": 64, "n": 48, "k": 96}), (BATCH_MATMUL, {"b": 3, "m": 8, "n": 32, "k": 12}), (CONV2D, CONV)],
)
def test_every_valid_configuration_splits_exactly(kind: str, params: dict) -> None:
    p = check_problem(kind, params)
    space = space_for(kind, p, "cpu-x86_64")
    rng = random.Random(0)
    valid = [c for c in (space.decode(rng.randrange(space.size)) for _ in range(3000)) if space.is_valid(c)]
    assert len(valid) > 50
    for c in valid:
        if kind == CONV2D:
            oh, ow = output_hw(p)
            assert p["f"] % c["tile_f"] == 0 and c["tile_f"] % c["reg_f"] == 0
            assert oh % c["tile_y"] == 0 and ow % c["tile_x"] == 0 and c["tile_x"] % c["reg_x"] == 0
            assert c["vectorize"] != "f2" or c["reg_f"] > 1
            assert c["pack"] == "none" or c["reg_f"] > 1
            assert c["unroll"] == "none" or c["unroll"] != c["vectorize"]
            assert "pad" in c  # padded problem: the padding stage has its knob
        else:
            assert p["m"] % c["tile_i"] == 0 and c["tile_i"] % c["reg_i"] == 0
            assert p["n"] % c["tile_j"] == 0 and c["tile_j"] % c["vec_j"] == 0
            assert p["k"] % c["unroll_k"] == 0
            assert c["reg_i"] * c["vec_j"] <= 256
            assert not c["pack_b"] or c["vec_j"] > 1


def test_constraints_exclude_invalid_combinations() -> None:
    space = space_for(DENSE, {"m": 64, "n": 64, "k": 64}, "cpu-x86_64")
    good = {
        "tile_i": 32, "reg_i": 4, "tile_j": 64, "vec_j": 16, "unroll_k": 4, "order": "ij", "pack_b": True,
        "parallel": "i0j0",
    }  # fmt: skip
    assert space.is_valid(good)
    assert space.is_valid({**good, "vec_j": 1, "pack_b": False})  # a scalar micro-kernel, for odd widths
    assert not space.is_valid({**good, "vec_j": 1, "pack_b": True})  # panels one column wide
    assert not space.is_valid({**good, "tile_i": 2})  # register tile larger than its cache tile
    assert not space.is_valid({**good, "reg_i": 8, "vec_j": 64})  # more accumulators than registers


@pytest.mark.parametrize(
    ("kind", "params"),
    [(DENSE, {"m": 1024, "n": 1024, "k": 1024}), (DENSE, {"m": 7, "n": 3, "k": 5}), (BATCH_MATMUL, {"b": 2, "m": 8,
     "n": 120, "k": 400}), (CONV2D, CONV), (CONV2D, {"n": 1, "c": 3, "h": 5, "w": 5, "f": 3, "kh": 1, "kw": 1})],
)  # fmt: skip
def test_starting_points_are_configurations_of_the_space(kind: str, params: dict) -> None:
    space = space_for(kind, params, "cpu-x86_64")
    points = starting_points(kind, params, "cpu-x86_64")
    assert 1 <= len(points) <= 2
    for point in points:
        assert set(point) == set(space.names) and space.is_valid(point)
        assert all(point[knob.name] in knob.values for knob in space.knobs)
    assert starting_points(kind, params, "sm_90") == []


def test_the_matmul_starts_from_register_tiles_of_a_fast_kernel() -> None:
    first = starting_points(DENSE, {"m": 1024, "n": 1024, "k": 1024}, "cpu-x86_64")[0]
    assert (first["reg_i"], first["vec_j"], first["pack_b"], first["parallel"]) == (8, 32, True, "i0j0")


def test_gpu_targets_get_a_thread_space() -> None:
    space = space_for(CONV2D, CONV, "sm_90")
    assert set(space.names) == {"threads", "reg", "tile_r", "unroll"}
    assert not space.is_valid({"threads": 64, "reg": 1, "tile_r": 1, "unroll": True})
    assert space_for(DENSE, {"m": 8, "n": 8, "k": 8}, "gfx90a:104").names == space.names


def _direct_conv(p: dict, data: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    oh, ow = output_hw(p)
    padded = np.pad(data, ((0, 0), (0, 0), (p["pad_h"],) * 2, (p["pad_w"],) * 2)).astype("float64")
    f, cg = kernel.shape[:2]
    fg = f // p["groups"]
    out = np.zeros((data.shape[0], f, oh, ow))
    for n, ff, y, x in itertools.product(range(data.shape[0]), range(f), range(oh), range(ow)):
        for rc, ry, rx in itertools.product(range(cg), range(kernel.shape[2]), range(kernel.shape[3])):
            iy, ix = y * p["stride_h"] + ry * p["dilation_h"], x * p["stride_w"] + rx * p["dilation_w"]
            out[n, ff, y, x] += padded[n, ff // fg * cg + rc, iy, ix] * kernel[ff, rc, ry, rx]
    return out


@pytest.mark.parametrize("groups", [1, 2])
def test_im2col_reference_is_a_convolution(groups: int) -> None:
    p = check_problem(CONV2D, {**CONV, "groups": groups, "dilation_h": 2})
    data, kernel = random_inputs(CONV2D, p)
    np.testing.assert_allclose(conv2d_im2col(p, data, kernel), _direct_conv(p, data, kernel), rtol=1e-4, atol=1e-5)


MIOPEN_CONV = {
    "spatial_dim": 2, "precision": "FP32", "batchsize": 8, "in_channels": 64, "out_channels": 128, "in_h": 28,
    "in_w": 30, "fil_h": 3, "fil_w": 5, "pad_h": 1, "pad_w": 2, "conv_stride_h": 2, "conv_stride_w": 1,
    "dilation_h": 1, "dilation_w": 2, "group_count": 4, "in_layout": "NCHW", "direction": "F",
}  # fmt: skip


def test_a_miopen_forward_conv_maps_to_a_tvm_conv2d() -> None:
    kind, p = conv2d_from_miopen(MIOPEN_CONV)
    assert kind == CONV2D
    assert p == check_problem(
        CONV2D,
        {"n": 8, "c": 64, "h": 28, "w": 30, "f": 128, "kh": 3, "kw": 5, "stride_h": 2, "stride_w": 1, "pad_h": 1,
         "pad_w": 2, "dilation_h": 1, "dilation_w": 2, "groups": 4},
    )  # fmt: skip
    for field, value, message in [
        ("direction", "B", "only forward"),
        ("in_layout", "NHWC", "only NCHW"),
        ("precision", "FP16", "only FP32"),
    ]:
        with pytest.raises(SpecError, match=message):
            conv2d_from_miopen({**MIOPEN_CONV, field: value})


def test_miopen_driver_lines_drive_tvm_problems() -> None:
    from fleet.miopen.driver import parse_line, problems

    lines = [line for line in ALEXNET.read_text().splitlines() if " conv " in line]
    mapped = []
    for line in lines:
        for problem in problems(parse_line(line)):
            if problem.get("direction") == "F":
                mapped.append(conv2d_from_miopen(problem))
    assert mapped, "alexnet.txt has forward convolutions"
    first = parse_line(lines[0])
    kind, p = conv2d_from_miopen(next(q for q in problems(first) if q["direction"] == "F"))
    assert (p["n"], p["c"], p["h"], p["f"], p["kh"], p["pad_h"]) == (512, 192, 13, 384, 3, 1)
    assert kind == CONV2D


def _record(**changes: object) -> str:
    record = {
        "problem": {"kind": DENSE, "params": {"m": 8, "n": 8, "k": 8}},
        "target": "cpu-x86_64",
        "knobs": {
            "tile_i": 8, "reg_i": 2, "tile_j": 8, "vec_j": 8, "unroll_k": 8, "order": "ij", "pack_b": False,
            "parallel": "none",
        },
        "time_s": 1e-6, "gflops": 1.0, "valid": True, "samples": [1.0],
        "provenance": {"toolchain": "tvm", "node": "n1"},
    }  # fmt: skip
    record.update(changes)
    return json.dumps(record)


def test_record_lines_are_checked_before_anything_is_written() -> None:
    parsed = parse_records([_record(), "", _record(valid=False)])
    assert len(parsed) == 2 and parsed[0]["problem"]["params"]["dtype"] == "float32"
    with pytest.raises(RecordError, match=r"line 2: Expecting"):
        parse_records([_record(), "{not json"])
    with pytest.raises(RecordError, match=r"line 1: .*lacks knob"):
        parse_records([_record(knobs={"tile_i": 8})])
    with pytest.raises(RecordError, match=r"line 1: .*unknown target"):
        parse_records([_record(target="pdp-11")])
    with pytest.raises(RecordError, match="break the constraints"):
        parse_records([_record(knobs={**json.loads(_record())["knobs"], "reg_i": 4, "tile_i": 2})])


def test_from_miopen_adds_the_forward_convs_as_conv2d_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from fleet.cli import main
    from fleet.store import Store

    for name in [k for k in os.environ if k.startswith("FLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / ".fleet"))  # embedded SQLite
    assert main(["tvm", "from-miopen", str(ALEXNET), "--tag", "alexnet"]) == 0
    first = capsys.readouterr().out.splitlines()
    assert main(["tvm", "from-miopen", str(ALEXNET), "--tag", "alexnet"]) == 0
    assert capsys.readouterr().out.splitlines() == first  # the same problems, not added twice
    count = int(first[-1].split()[0])
    assert count >= 3 and first[-1].endswith(f"conv2d problems from {ALEXNET}")
    store = Store(f"sqlite:///{tmp_path / '.fleet' / 'fleet.db'}")
    try:
        problems = store.find_problems(kind=CONV2D, tag="alexnet")
    finally:
        store.close()
    assert len(problems) == count
    assert any((p.params["c"], p.params["f"], p.params["n"]) == (192, 384, 512) for p in problems)
