"""The knob space of an operator problem, derived from its shape.

Tile sizes are divisors of the loop they split, so every split is exact; combinations that TVM would refuse
or that make no sense (a register tile that does not divide its cache tile, unrolling a loop that is not
there, vectorising a loop of one) are excluded by the space's constraints, never by failed builds.

CPU (``cpu-*`` targets), dense and batch_matmul: the loop nest of fast CPU matmuls (BLIS, OpenBLAS), loops
``[b] i0 j0 <i1 j1 in 'order'> k0 k1 i2 j2`` where ``tile_i`` = i1*i2, ``reg_i`` = i2, ``tile_j`` = j1*j2,
``vec_j`` = j2, ``unroll_k`` = k1. Each ``reg_i`` x ``vec_j`` micro-tile of C is accumulated in registers (a
local cache-write buffer, initialised before k0 and written back once after it) over the whole reduction: its
``i2`` loop unrolled, ``j2`` vectorised, ``k1`` unrolled. ``pack_b`` packs B into ``vec_j``-wide panels, so the
micro-kernel reads B contiguously; ``tile_i`` rows of A share each panel while it is in cache; ``parallel`` spreads
the outer blocks over the cores.

CPU, conv2d: the same micro-kernel, output channels and pixels for the matmul's columns and rows, loops
``n f0 y0 x0 <f1 y1 x1 in 'order'> rc ry rx f2 x2`` (``x2 f2`` when ``vectorize`` is ``f2``) with
``tile_f``/``reg_f``, ``tile_y`` and ``tile_x``/``reg_x`` likewise: each ``reg_f`` x ``reg_x`` micro-tile of one
output row accumulates in registers over the whole reduction (``unroll`` ``rx`` unrolls its innermost loop).
``pack`` packs the kernel by ``reg_f`` output channels, so vectorising over channels reads it contiguously;
``pad`` inlines the padding into the convolution or computes it first.

GPU targets: the spatial loops are fused and spread over blocks of ``threads`` threads, each thread computing
``reg`` neighbouring outputs; the first reduction loop is split by ``tile_r`` and its inner part unrolled or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.expr import Expression
from fleet.space import Knob, Space
from fleet.tvm.operators import BATCH_MATMUL, CONV2D, DENSE, check_problem, output_hw


def divisors(extent: int, limit: int) -> list[int]:
    """The divisors of ``extent`` up to ``limit``; at most a dozen, favouring powers of two."""
    found = [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]
    if len(found) <= 12:
        return found
    powers = [d for d in found if d & (d - 1) == 0]
    rest = [d for d in found if d not in powers]
    return sorted(set(powers + rest[-(12 - len(powers)) :] if len(powers) < 12 else powers))


def is_cpu(target: str) -> bool:
    return target.startswith("cpu-")


def space_for(kind: str, params: Mapping[str, Any], target: str) -> Space:
    """The space of ``kind`` with ``params`` on ``target``.

    Parameters
    ----------
    kind:
        ``tvm.dense``, ``tvm.batch_matmul`` or ``tvm.conv2d``.
    params:
        The problem's parameters (its shape).
    target:
        A Fleet target: ``cpu-*`` gets loop-nest schedules for LLVM, the others thread-bound GPU schedules.
    """
    p = check_problem(kind, params)
    if not is_cpu(target):
        return _gpu_space(kind, p)
    if kind in (DENSE, BATCH_MATMUL):
        return _matmul_space(p)
    return _conv2d_space(p)


def starting_points(kind: str, params: Mapping[str, Any], target: str) -> list[dict[str, Any]]:
    """Configurations to measure first: the register tiles of a fast CPU kernel (16 of AVX-512's 32 vector
    registers as accumulators), B or the kernel packed, the outer loops in parallel; the search refines them.

    Derived from the shape, as BLAS libraries pick their kernel; those the space rules out are left out, and a GPU
    target has none.
    """
    p = check_problem(kind, params)
    if not is_cpu(target):
        return []
    space = space_for(kind, p, target)
    if kind == CONV2D:
        candidates = [_conv2d_start(p, lanes) for lanes in (16, 32, 8, 4, 1)]
    else:
        candidates = [_matmul_start(p, *tile) for tile in ((8, 32), (4, 64), (8, 16), (4, 16), (4, 8), (2, 4), (1, 1))]
    found: list[dict[str, Any]] = []
    for config in candidates:
        if config is None or config in found or not space.is_valid(config):
            continue
        if all(config[knob.name] in knob.values for knob in space.knobs):
            found.append(config)
    return found[:2]


def _largest(extent: int, limit: int, multiple: int = 1) -> int:
    return max(d for d in divisors(extent, max(limit, multiple)) if d % multiple == 0)


def _matmul_start(p: Mapping[str, Any], rows: int, lanes: int) -> dict[str, Any] | None:
    if p["m"] % rows or p["n"] % lanes:
        return None
    return {
        "tile_i": _largest(p["m"], 128, rows), "reg_i": rows, "tile_j": lanes, "vec_j": lanes, "unroll_k": 1,
        "order": "ij", "pack_b": lanes > 1, "parallel": "i0j0",
    }  # fmt: skip


def _conv2d_start(p: Mapping[str, Any], lanes: int) -> dict[str, Any] | None:
    # The matmul's rows are output pixels here (as many of a row as fit), its vectorised columns output channels.
    if p["f"] % lanes:
        return None
    reg_x = _largest(output_hw(p)[1], min(16, 256 // lanes))
    config = {
        "tile_f": _largest(p["f"], 64, lanes), "reg_f": lanes, "tile_y": 1, "tile_x": reg_x, "reg_x": reg_x,
        "order": "fyx", "pack": "kernel" if lanes > 1 else "none", "vectorize": "f2" if lanes > 1 else "none",
        "parallel": "nf0y0", "unroll": "rx" if p["kw"] > 1 else "none",
    }  # fmt: skip
    if p["pad_h"] or p["pad_w"]:
        config["pad"] = "root"
    return config


def _space(knobs: list[Knob], constraints: list[str]) -> Space:
    return Space(tuple(knobs), tuple(Expression(c) for c in constraints))


def _matmul_space(p: Mapping[str, Any]) -> Space:
    m, n, k = p["m"], p["n"], p["k"]
    knobs = [
        Knob("tile_i", tuple(divisors(m, 256))),
        Knob("reg_i", tuple(v for v in (1, 2, 4, 6, 8, 12, 16) if m % v == 0)),
        Knob("tile_j", tuple(divisors(n, 512))),
        Knob("vec_j", tuple(v for v in (1, 4, 8, 16, 32, 64) if n % v == 0)),
        Knob("unroll_k", tuple(v for v in (1, 2, 4, 8) if k % v == 0)),
        Knob("order", ("ij", "ji")),
        Knob("pack_b", (False, True)),
        Knob("parallel", ("none", "i0", "i0j0")),
    ]
    constraints = [
        "tile_i % reg_i == 0",
        "tile_j % vec_j == 0",
        # The accumulators stay in registers: AVX-512 has 32 of 16 floats, and the B vectors and A broadcasts
        # need some of them (on AVX2, half as many: the search finds the smaller tiles faster there).
        "reg_i * vec_j <= 256",
        "not pack_b or vec_j > 1",
    ]
    return _space(knobs, constraints)


def _conv2d_space(p: Mapping[str, Any]) -> Space:
    oh, ow = output_hw(p)
    knobs = [
        Knob("tile_f", tuple(divisors(p["f"], 64))),
        Knob("reg_f", tuple(v for v in (1, 2, 4, 8, 16, 32) if p["f"] % v == 0)),
        Knob("tile_y", tuple(divisors(oh, 16))),
        Knob("tile_x", tuple(divisors(ow, 64))),
        Knob("reg_x", tuple(divisors(ow, 16))),
        Knob("order", ("fyx", "yxf")),
        Knob("pack", ("none", "kernel")),
        Knob("vectorize", ("none", "x2", "f2")),
        Knob("parallel", ("none", "n", "nf0", "nf0y0")),
        Knob("unroll", ("none", "rx")),
    ]
    if p["pad_h"] or p["pad_w"]:
        knobs.append(Knob("pad", ("inline", "root")))
    constraints = [
        "tile_f % reg_f == 0",
        "tile_x % reg_x == 0",
        "reg_f * reg_x <= 256",  # the accumulators stay in registers (see the matmul's)
        "vectorize != 'x2' or reg_x > 1",
        "vectorize != 'f2' or reg_f > 1",
        "pack == 'none' or reg_f > 1",
        "unroll != 'rx' or " + str(p["kw"]) + " > 1",
    ]
    return _space(knobs, constraints)


def _gpu_space(kind: str, p: Mapping[str, Any]) -> Space:
    if kind == CONV2D:
        last, reduction = output_hw(p)[1], p["c"] // p["groups"]
    else:
        last, reduction = p["n"], p["k"]
    knobs = [
        Knob("threads", (32, 64, 128, 256, 512)),
        Knob("reg", tuple(v for v in (1, 2, 4) if last % v == 0)),
        Knob("tile_r", tuple(divisors(reduction, 64))),
        Knob("unroll", (False, True)),
    ]
    return _space(knobs, ["not unroll or tile_r > 1"])
