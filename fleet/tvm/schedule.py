"""Apply a configuration's knob values to an operator with ``tvm.s_tir`` schedule primitives.

The loop structures are described in :mod:`fleet.tvm.spaces`. A configuration of None is the untuned
default: the plain definition, one naive loop nest per stage, what a tuned schedule is compared against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from fleet.tvm.available import require_tvm
from fleet.tvm.operators import BATCH_MATMUL, CONV2D, DENSE, define
from fleet.tvm.spaces import is_cpu


def scheduled(kind: str, p: Mapping[str, Any], config: Mapping[str, Any] | None, target: str) -> Any:
    """The IRModule of ``kind`` with ``config`` applied for ``target`` (a Fleet target).

    Parameters
    ----------
    kind, p:
        The problem (canonical parameters, see :func:`fleet.tvm.operators.check_problem`).
    config:
        Knob values from :func:`fleet.tvm.spaces.space_for`, or None for the untuned default schedule.
    target:
        ``cpu-*`` for LLVM loop nests; a GPU target binds loops to blocks and threads.
    """
    tvm = require_tvm()
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": define(kind, p, config)}))
    if config is None:
        if not is_cpu(target):
            _gpu_default(sch, kind)
        return sch.mod
    if not is_cpu(target):
        _gpu(sch, kind, p, config)
    elif kind in (DENSE, BATCH_MATMUL):
        _cpu_matmul(sch, kind, config)
    else:
        _cpu_conv2d(sch, p, config)
    return sch.mod


def _helper_stage(sch: Any, name: str, parallel: bool, vectorize: bool) -> None:
    """A packing or padding stage: its outer loop in parallel, its inner loop vectorised."""
    try:
        block = sch.get_sblock(name)
    except Exception:  # the stage is not in this definition (no packing, no padding)
        return
    loops = sch.get_loops(block)
    if vectorize and len(loops) > 1:
        sch.vectorize(loops[-1])
    if parallel:
        sch.parallel(loops[0])


def _cpu_matmul(sch: Any, kind: str, c: Mapping[str, Any]) -> None:
    block = sch.get_sblock("C")
    loops = sch.get_loops(block)
    batch = [loops[0]] if kind == BATCH_MATMUL else []
    i, j, k = loops[-3:]
    i0, i1, i2 = sch.split(i, [None, c["tile_i"] // c["reg_i"], c["reg_i"]])
    j0, j1, j2 = sch.split(j, [None, c["tile_j"] // c["vec_j"], c["vec_j"]])
    k0, k1 = sch.split(k, [None, c["unroll_k"]])
    micro = (i1, j1) if c["order"] == "ij" else (j1, i1)
    sch.reorder(*batch, i0, j0, *micro, k0, k1, i2, j2)
    # The micro-tile's accumulators: a local buffer of reg_i x vec_j that LLVM keeps in registers (every index
    # constant once i2 is unrolled and j2 vectorised), initialised before k0, written back to C once after it.
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, micro[1])
    # The write-back's own loops, below [b] i0 j0 i1 j1.
    _register_tile(sch, sch.get_loops(local)[len(batch) + 4 :], c["vec_j"] > 1)
    _micro_kernel(sch, i2, j2, c["vec_j"] > 1)
    if c["unroll_k"] > 1:
        sch.unroll(k1)
    if c["parallel"] != "none":
        outer = [*batch, i0] if c["parallel"] == "i0" else [*batch, i0, j0]
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    _helper_stage(sch, "packedB", c["parallel"] != "none", c["vec_j"] > 1)
    # Last: the initialisation moves out of the reduction, before its outermost loop.
    sch.decompose_reduction(block, k0)
    _register_tile(sch, sch.get_loops(sch.get_sblock("C_init"))[-2:], c["vec_j"] > 1)


def _micro_kernel(sch: Any, row: Any, column: Any, vectorize: bool) -> None:
    """A register tile's two innermost loops: the outer unrolled, the inner vectorised (or left alone)."""
    sch.unroll(row)
    if vectorize:
        sch.vectorize(column)


def _register_tile(sch: Any, loops: list[Any], vectorize: bool) -> None:
    """The loops of a register tile's initialisation or write-back: all unrolled, as the micro-kernel's update,
    the innermost vectorised where that reads and writes contiguous memory."""
    if not loops:
        return
    *outer, last = loops
    for loop in outer:
        sch.unroll(loop)
    if vectorize:
        sch.vectorize(last)
    else:
        sch.unroll(last)


def _cpu_conv2d(sch: Any, p: Mapping[str, Any], c: Mapping[str, Any]) -> None:
    if c.get("pad") == "inline":
        sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("C")
    n, f, y, x, rc, ry, rx = sch.get_loops(block)
    f0, f1, f2 = sch.split(f, [None, c["tile_f"] // c["reg_f"], c["reg_f"]])
    y0, y1 = sch.split(y, [None, c["tile_y"]])
    x0, x1, x2 = sch.split(x, [None, c["tile_x"] // c["reg_x"], c["reg_x"]])
    micro = (f1, y1, x1) if c["order"] == "fyx" else (y1, x1, f1)
    # The vectorised loop goes innermost; the other one is unrolled, as the matmul's rows.
    rows, lanes = (x2, f2) if c["vectorize"] == "f2" else (f2, x2)
    sch.reorder(n, f0, y0, x0, *micro, rc, ry, rx, rows, lanes)
    local = sch.cache_write(block, 0, "local")
    if c["vectorize"] == "f2":
        # The accumulators, vectorised over output channels, need the channel innermost in the local buffer,
        # or every update is a strided gather and scatter.
        sch.transform_layout(block, ("write", 0), lambda q, ff, yy, xx: (q, yy, xx, ff))
    sch.reverse_compute_at(local, micro[-1])
    if c["unroll"] == "rx":
        sch.unroll(rx)
    # The write-back runs along x, contiguous in C: vectorised when the local buffer is laid out so too.
    # The write-back's own loops, below n f0 y0 x0 and the micro-tile's three.
    _register_tile(sch, sch.get_loops(local)[7:], c["vectorize"] == "x2")
    _micro_kernel(sch, rows, lanes, c["vectorize"] != "none")
    if c["parallel"] != "none":
        outer = {"n": [n], "nf0": [n, f0], "nf0y0": [n, f0, y0]}[c["parallel"]]
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    parallel = c["parallel"] != "none"
    _helper_stage(sch, "packed_kernel", parallel, c["vectorize"] != "none")
    if c.get("pad") == "root":
        _helper_stage(sch, "pad", parallel, False)
    sch.decompose_reduction(block, rc)
    _register_tile(sch, sch.get_loops(sch.get_sblock("C_init"))[-2:], c["vectorize"] != "none")


def _spatial_count(kind: str) -> int:
    return {DENSE: 2, BATCH_MATMUL: 3, CONV2D: 4}[kind]


def _gpu(sch: Any, kind: str, p: Mapping[str, Any], c: Mapping[str, Any]) -> None:
    for name in ("pad", "packedB", "packed_kernel"):
        with contextlib.suppress(Exception):  # a stage that is not in this definition
            sch.compute_inline(sch.get_sblock(name))
    block = sch.get_sblock("C")
    loops = sch.get_loops(block)
    count = _spatial_count(kind)
    spatial, reduction = loops[:count], loops[count:]
    last_o, last_r = sch.split(spatial[-1], [None, c["reg"]])
    fused = sch.fuse(*spatial[:-1], last_o)
    bx, tx = sch.split(fused, [None, c["threads"]])
    r0, r1 = sch.split(reduction[0], [None, c["tile_r"]])
    sch.reorder(bx, tx, r0, r1, *reduction[1:], last_r)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tx)
    if c["unroll"]:
        sch.unroll(r1)
    sch.decompose_reduction(block, r0)


def _gpu_default(sch: Any, kind: str) -> None:
    """The untuned GPU schedule: one thread per output element, 64 threads a block (a GPU needs some binding)."""
    for name in ("pad",):
        with contextlib.suppress(Exception):
            sch.compute_inline(sch.get_sblock(name))
    block = sch.get_sblock("C")
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops[: _spatial_count(kind)])
    bx, tx = sch.split(fused, [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
