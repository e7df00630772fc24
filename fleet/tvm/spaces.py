"""The knob space of an operator problem, derived from its shape.

Tile sizes are divisors of the loop they split, so every split is exact; combinations that TVM would refuse
or that make no sense (a register tile that does not divide its cache tile, unrolling a loop that is not
there, vectorising a loop of one) are excluded by the space's constraints, never by failed builds.

CPU (``cpu-*`` targets), dense and batch_matmul: loops ``[b] i0 j0 k0 <i1 j1 k1 in 'order'> i2 j2`` where
``tile_i`` = i1*i2, ``reg_i`` = i2, ``tile_j`` = j1*j2, ``vec_j`` = j2, ``tile_k`` = k1; ``pack_b`` packs B by
``vec_j`` columns; ``accumulate`` keeps each block of C in a local buffer; ``vectorize``, ``parallel`` and
``unroll`` name the loops they apply to.

CPU, conv2d: loops ``n f0 y0 x0 rc0 <f1 y1 x1 rc1 ry rx in 'order'> f2 x2`` with ``tile_f``/``reg_f``,
``tile_y``, ``tile_x``/``reg_x`` and ``tile_rc`` likewise; ``pack`` packs the kernel by ``reg_f`` output
channels; ``pad`` inlines the padding into the convolution or computes it first.

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


def _space(knobs: list[Knob], constraints: list[str]) -> Space:
    return Space(tuple(knobs), tuple(Expression(c) for c in constraints))


def _matmul_space(p: Mapping[str, Any]) -> Space:
    m, n, k = p["m"], p["n"], p["k"]
    knobs = [
        Knob("tile_i", tuple(divisors(m, 256))),
        Knob("reg_i", tuple(v for v in (1, 2, 4, 8, 16) if m % v == 0)),
        Knob("tile_j", tuple(divisors(n, 512))),
        Knob("vec_j", tuple(v for v in (1, 4, 8, 16, 32, 64) if n % v == 0)),
        Knob("tile_k", tuple(divisors(k, 512))),
        Knob("order", ("ijk", "ikj", "kij")),
        Knob("pack_b", (False, True)),
        Knob("accumulate", (False, True)),
        Knob("vectorize", ("none", "j2")),
        Knob("parallel", ("none", "i0", "i0j0")),
        Knob("unroll", ("none", "i2", "k1")),
    ]
    constraints = [
        "tile_i % reg_i == 0",
        "tile_j % vec_j == 0",
        "reg_i * vec_j <= 512",  # the accumulators must fit the register file (AVX-512: 32 x 16 floats)
        "vectorize == 'none' or vec_j > 1",
        "not pack_b or vec_j > 1",
        "unroll != 'i2' or reg_i > 1",
        "unroll != 'k1' or (order == 'ijk' and tile_k <= 16)",
        "not accumulate or tile_i * tile_j <= 16384",
    ]
    return _space(knobs, constraints)


def _conv2d_space(p: Mapping[str, Any]) -> Space:
    oh, ow = output_hw(p)
    cg = p["c"] // p["groups"]
    knobs = [
        Knob("tile_f", tuple(divisors(p["f"], 64))),
        Knob("reg_f", tuple(v for v in (1, 2, 4, 8, 16) if p["f"] % v == 0)),
        Knob("tile_y", tuple(divisors(oh, 16))),
        Knob("tile_x", tuple(divisors(ow, 64))),
        Knob("reg_x", tuple(divisors(ow, 16))),
        Knob("tile_rc", tuple(divisors(cg, 64))),
        Knob("order", ("fyx_r", "r_fyx", "fy_r_x")),
        Knob("pack", ("none", "kernel")),
        Knob("accumulate", (False, True)),
        Knob("vectorize", ("none", "x2", "f2")),
        Knob("parallel", ("none", "n", "nf0", "nf0y0")),
        Knob("unroll", ("none", "f2", "x2", "rx")),
    ]
    if p["pad_h"] or p["pad_w"]:
        knobs.append(Knob("pad", ("inline", "root")))
    constraints = [
        "tile_f % reg_f == 0",
        "tile_x % reg_x == 0",
        "reg_f * reg_x <= 512",  # the accumulators must fit the register file
        "vectorize != 'x2' or reg_x > 1",
        "vectorize != 'f2' or reg_f > 1",
        "pack == 'none' or reg_f > 1",
        "unroll == 'none' or unroll != vectorize",
        "unroll != 'f2' or reg_f > 1",
        "unroll != 'x2' or reg_x > 1",
        "unroll != 'rx' or (order == 'fyx_r' and " + str(p["kw"]) + " > 1)",
        "not accumulate or tile_f * tile_y * tile_x <= 16384",
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
