"""The operator problems: their parameters, TE definitions, FLOP counts and NumPy references.

A problem is a kind and its parameters, as the store keeps it:

- ``tvm.dense``: ``C[m, n] = A[m, k] @ B[k, n]``; parameters ``m n k``;
- ``tvm.batch_matmul``: ``C[b, m, n] = A[b, m, k] @ B[b, k, n]``; parameters ``b m n k``;
- ``tvm.conv2d``: NCHW convolution ``out[n, f, y, x]`` of ``data[n, c, h, w]`` with ``kernel[f, c / groups, kh,
  kw]``; parameters ``n c h w f kh kw stride_h stride_w pad_h pad_w dilation_h dilation_w groups``.

Every problem is float32 (``dtype``). The TE definitions import TVM; the rest is NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError

DENSE, BATCH_MATMUL, CONV2D = "tvm.dense", "tvm.batch_matmul", "tvm.conv2d"
KINDS = (DENSE, BATCH_MATMUL, CONV2D)
OPS = {DENSE: "dense", BATCH_MATMUL: "batch_matmul", CONV2D: "conv2d"}
KIND_OF_OP = {op: kind for kind, op in OPS.items()}

_PARAMS = {
    DENSE: ("m", "n", "k"),
    BATCH_MATMUL: ("b", "m", "n", "k"),
    CONV2D: ("n", "c", "h", "w", "f", "kh", "kw"),
}
_CONV_DEFAULTS = {"stride_h": 1, "stride_w": 1, "pad_h": 0, "pad_w": 0, "dilation_h": 1, "dilation_w": 1, "groups": 1}


def check_problem(kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical parameters of a problem (defaults filled in), or :class:`SpecError` saying what is wrong."""
    if kind not in KINDS:
        raise SpecError(f"unknown TVM operator {kind!r} (known: {', '.join(KINDS)})")
    known = set(_PARAMS[kind]) | {"dtype"} | (set(_CONV_DEFAULTS) if kind == CONV2D else set())
    extra = sorted(set(params) - known)
    if extra:
        raise SpecError(f"{kind} has no parameter {extra[0]!r} (it takes {', '.join(sorted(known))})")
    out: dict[str, Any] = dict(_CONV_DEFAULTS) if kind == CONV2D else {}
    for name in _PARAMS[kind]:
        if name not in params:
            raise SpecError(f"{kind} needs parameter {name!r}")
    out.update({k: v for k, v in params.items() if k != "dtype"})
    for name, value in out.items():
        low = 0 if name.startswith("pad") else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise SpecError(f"{kind} parameter {name!r} must be an integer >= {low}, not {value!r}")
    dtype = params.get("dtype", "float32")
    if dtype != "float32":
        raise SpecError(f"{kind}: only float32 is supported, not {dtype!r}")
    out["dtype"] = "float32"
    if kind == CONV2D:
        if out["c"] % out["groups"] or out["f"] % out["groups"]:
            raise SpecError(f"conv2d: groups {out['groups']} must divide c {out['c']} and f {out['f']}")
        oh, ow = output_hw(out)
        if oh < 1 or ow < 1:
            raise SpecError("conv2d: the kernel does not fit in the padded input")
    return out


def output_hw(p: Mapping[str, Any]) -> tuple[int, int]:
    """The output height and width of a conv2d problem."""
    oh = (p["h"] + 2 * p["pad_h"] - p["dilation_h"] * (p["kh"] - 1) - 1) // p["stride_h"] + 1
    ow = (p["w"] + 2 * p["pad_w"] - p["dilation_w"] * (p["kw"] - 1) - 1) // p["stride_w"] + 1
    return oh, ow


def output_shape(kind: str, p: Mapping[str, Any]) -> tuple[int, ...]:
    if kind == DENSE:
        return (p["m"], p["n"])
    if kind == BATCH_MATMUL:
        return (p["b"], p["m"], p["n"])
    return (p["n"], p["f"], *output_hw(p))


def input_shapes(kind: str, p: Mapping[str, Any]) -> list[tuple[int, ...]]:
    if kind == DENSE:
        return [(p["m"], p["k"]), (p["k"], p["n"])]
    if kind == BATCH_MATMUL:
        return [(p["b"], p["m"], p["k"]), (p["b"], p["k"], p["n"])]
    return [(p["n"], p["c"], p["h"], p["w"]), (p["f"], p["c"] // p["groups"], p["kh"], p["kw"])]


def flops(kind: str, p: Mapping[str, Any]) -> int:
    """Floating-point operations of one run (a multiply-add counts two)."""
    if kind == DENSE:
        return 2 * p["m"] * p["n"] * p["k"]
    if kind == BATCH_MATMUL:
        return 2 * p["b"] * p["m"] * p["n"] * p["k"]
    return 2 * math.prod(output_shape(kind, p)) * (p["c"] // p["groups"]) * p["kh"] * p["kw"]


def describe(kind: str, p: Mapping[str, Any]) -> str:
    """A short human name of a problem, for tables."""
    if kind == DENSE:
        return f"dense {p['m']}x{p['k']}x{p['n']}"
    if kind == BATCH_MATMUL:
        return f"batch_matmul {p['b']}x{p['m']}x{p['k']}x{p['n']}"
    text = f"conv2d n{p['n']} c{p['c']} {p['h']}x{p['w']} f{p['f']} k{p['kh']}x{p['kw']}"
    if (p["stride_h"], p["stride_w"]) != (1, 1):
        text += f" s{p['stride_h']}x{p['stride_w']}"
    if (p["pad_h"], p["pad_w"]) != (0, 0):
        text += f" p{p['pad_h']}x{p['pad_w']}"
    if (p["dilation_h"], p["dilation_w"]) != (1, 1):
        text += f" d{p['dilation_h']}x{p['dilation_w']}"
    if p["groups"] != 1:
        text += f" g{p['groups']}"
    return text


# -- NumPy -------------------------------------------------------------------------------------------------


def random_inputs(kind: str, p: Mapping[str, Any], seed: int = 0) -> list[Any]:
    """Inputs in [-1, 1), the same for every configuration of a problem."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype("float32") for shape in input_shapes(kind, p)]


def reference(kind: str, p: Mapping[str, Any], inputs: list[Any]) -> Any:
    """The expected output, computed with NumPy (conv2d as im2col and one matrix product per group)."""
    import numpy as np

    a, b = inputs
    if kind in (DENSE, BATCH_MATMUL):
        return np.matmul(a, b)
    return conv2d_im2col(p, a, b)


def conv2d_im2col(p: Mapping[str, Any], data: Any, kernel: Any) -> Any:
    """NCHW conv2d as im2col and NumPy matrix products: the baseline a tuned conv2d is compared against."""
    import numpy as np

    n, c, _, _ = data.shape
    f, cg, kh, kw = kernel.shape
    groups = p["groups"]
    oh, ow = output_hw(p)
    padded = np.pad(data, ((0, 0), (0, 0), (p["pad_h"], p["pad_h"]), (p["pad_w"], p["pad_w"])))
    dh, dw, sh, sw = p["dilation_h"], p["dilation_w"], p["stride_h"], p["stride_w"]
    # columns[n, c, ry, rx, y, x] = padded[n, c, y*sh + ry*dh, x*sw + rx*dw]
    columns = np.empty((n, c, kh, kw, oh, ow), dtype=data.dtype)
    for ry in range(kh):
        for rx in range(kw):
            y0, x0 = ry * dh, rx * dw
            columns[:, :, ry, rx] = padded[:, :, y0 : y0 + sh * (oh - 1) + 1 : sh, x0 : x0 + sw * (ow - 1) + 1 : sw]
    fg = f // groups
    out = np.empty((n, f, oh, ow), dtype=data.dtype)
    for g in range(groups):
        cols = columns[:, g * cg : (g + 1) * cg].reshape(n, cg * kh * kw, oh * ow)
        weights = kernel[g * fg : (g + 1) * fg].reshape(fg, cg * kh * kw)
        out[:, g * fg : (g + 1) * fg] = np.matmul(weights, cols).reshape(n, fg, oh, ow)
    return out


# -- TE ----------------------------------------------------------------------------------------------------


def define(kind: str, p: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> Any:
    """The operator as a TIR function (``te.create_prim_func``): inputs, then the output.

    The data-packing knobs change the definition itself: ``pack_b`` (dense, batch_matmul) packs B into
    ``[n / vec_j, k, vec_j]`` blocks, ``pack`` (conv2d) packs the kernel into ``[f / reg_f, c, kh, kw, reg_f]``, so
    the vectorised loop reads contiguous memory. ``config`` None is the plain definition.
    """
    from fleet.tvm.available import require_tvm

    require_tvm()
    from tvm import te

    config = config or {}
    dtype = p["dtype"]
    if kind in (DENSE, BATCH_MATMUL):
        batched = kind == BATCH_MATMUL
        m, n, k = p["m"], p["n"], p["k"]
        lead = (p["b"],) if batched else ()
        a = te.placeholder((*lead, m, k), dtype, name="A")
        b = te.placeholder((*lead, k, n), dtype, name="B")
        r = te.reduce_axis((0, k), name="k")
        if config.get("pack_b"):
            v = int(config["vec_j"])
            if batched:
                packed = te.compute((p["b"], n // v, k, v), lambda q, x, y, z: b[q, y, x * v + z], name="packedB")
                c = te.compute(
                    (p["b"], m, n),
                    lambda q, i, j: te.sum(a[q, i, r] * packed[q, j // v, r, j % v], axis=r),
                    name="C",
                )
            else:
                packed = te.compute((n // v, k, v), lambda x, y, z: b[y, x * v + z], name="packedB")
                c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * packed[j // v, r, j % v], axis=r), name="C")
        elif batched:
            c = te.compute((p["b"], m, n), lambda q, i, j: te.sum(a[q, i, r] * b[q, r, j], axis=r), name="C")
        else:
            c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        return te.create_prim_func([a, b, c])
    return _conv2d(p, config)


def _conv2d(p: Mapping[str, Any], config: Mapping[str, Any]) -> Any:
    from tvm import te, tirx

    dtype = p["dtype"]
    n, c, h, w, f, kh, kw = (p[x] for x in ("n", "c", "h", "w", "f", "kh", "kw"))
    groups, cg = p["groups"], p["c"] // p["groups"]
    fg = f // groups
    ph, pw, sh, sw, dh, dw = (p[x] for x in ("pad_h", "pad_w", "stride_h", "stride_w", "dilation_h", "dilation_w"))
    oh, ow = output_hw(p)
    data = te.placeholder((n, c, h, w), dtype, name="data")
    kernel = te.placeholder((f, cg, kh, kw), dtype, name="kernel")
    if ph or pw:
        padded = te.compute(
            (n, c, h + 2 * ph, w + 2 * pw),
            lambda q, ch, y, x: tirx.if_then_else(
                tirx.all(y >= ph, y < h + ph, x >= pw, x < w + pw), data[q, ch, y - ph, x - pw], tirx.const(0, dtype)
            ),
            name="pad",
        )
    else:
        padded = data
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    if config.get("pack") == "kernel":
        v = int(config["reg_f"])
        packed = te.compute(
            (f // v, cg, kh, kw, v), lambda fo, ch, y, x, fi: kernel[fo * v + fi, ch, y, x], name="packed_kernel"
        )

        def weight(ff: Any) -> Any:
            return packed[ff // v, rc, ry, rx, ff % v]
    else:

        def weight(ff: Any) -> Any:
            return kernel[ff, rc, ry, rx]

    def channel(ff: Any) -> Any:
        # Without groups the input channel does not depend on the output channel: written so, a loop over output
        # channels can be vectorised with the input value broadcast, not gathered lane by lane.
        return rc if groups == 1 else ff // fg * cg + rc

    out = te.compute(
        (n, f, oh, ow),
        lambda q, ff, y, x: te.sum(
            padded[q, channel(ff), y * sh + ry * dh, x * sw + rx * dw] * weight(ff), axis=[rc, ry, rx]
        ),
        name="C",
    )
    return te.create_prim_func([data, kernel, out])


def conv2d_from_miopen(params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The TVM conv2d problem of a MIOpen conv problem (``fleet.miopen.driver.problems``), as (kind, params).

    Only a forward (``direction`` F), 2-D, NCHW, FP32 convolution has one; anything else is a :class:`SpecError`.
    """
    direction = str(params.get("direction", "F")).upper()
    if direction not in ("F", "1"):
        raise SpecError(f"only forward convolutions map to TVM conv2d, not direction {params.get('direction')!r}")
    if int(params.get("spatial_dim", 2)) != 2:
        raise SpecError("only 2-D convolutions map to TVM conv2d")
    layout = str(params.get("in_layout", "NCHW")).upper()
    if layout != "NCHW":
        raise SpecError(f"only NCHW convolutions map to TVM conv2d, not {layout}")
    precision = str(params.get("precision", "FP32")).upper()
    if precision != "FP32":
        raise SpecError(f"only FP32 convolutions map to TVM conv2d, not {precision}")
    names = {
        "n": "batchsize", "c": "in_channels", "h": "in_h", "w": "in_w", "f": "out_channels", "kh": "fil_h",
        "kw": "fil_w", "stride_h": "conv_stride_h", "stride_w": "conv_stride_w", "pad_h": "pad_h", "pad_w": "pad_w",
        "dilation_h": "dilation_h", "dilation_w": "dilation_w", "groups": "group_count",
    }  # fmt: skip
    missing = [theirs for theirs in names.values() if theirs not in params]
    if missing:
        raise SpecError(f"the MIOpen conv problem lacks {missing[0]!r}")
    return CONV2D, check_problem(CONV2D, {ours: int(params[theirs]) for ours, theirs in names.items()})
