"""MIOpen's database key of a conv problem, character for character, and its inverse.

MIOpen finds a problem's records in the find-db and perf-db by ``ProblemDescription::Serialize``::

    C-H-W-YxX-K-Ho-Wo-N-PhxPw-ShxSw-DhxDw-bias-LAYOUT-PRECISION-DIR[_g<groups>]

e.g. ``1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F``. MIOpen describes the backward directions from
the other side (its ``in`` tensor is dy): for ``B`` and ``W`` the input and output channels, spatial sizes and
layouts swap places. In 3-D the spatial parts carry depth first (``C-D-H-W-ZxYxX-K-Do-Ho-Wo-...``). The layout
is written once when all three tensors use the default layout, else as ``in-weights-out``. A group count other
than 1 adds ``_g<count>`` after the direction.

Two styles differ in 3-D only:

``legacy`` (the default)
    The keys of the find-dbs and perf-dbs MIOpen shipped with 2.x (e.g. ``gfx803_36.HIP.fdb.txt``): the
    default 3-D layout is written ``NCHW`` and an all-zero 3-D padding ``0x0``.
``current``
    MIOpen 3.x: ``NCDHW`` and ``0x0x0``.

:func:`parse_key` reads both. Fleet keeps problem parameters in the driver's frame (see
:mod:`fleet.miopen.driver`); :func:`key_frame` gives the key's side of a problem, as the perf-db ``config`` table
also stores it. Batch-norm problems have no key here: MIOpen keeps no find-db or perf-db records for them that
Fleet could match with certainty, so :func:`db_key` refuses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import DriverLineError, MIOpenDbError, SpecError
from fleet.miopen.driver import DEFAULT_LAYOUT, LAYOUTS, PRECISIONS, _conv_checked, output_sizes, problem_kind

STYLES = ("legacy", "current")
# Every data type name MIOpen writes in a key (GetDataTypeName); a key whose tensors differ in type writes the
# three names one after the other. Fleet makes problems of those MIOpenDriver can run (PRECISIONS); the
# databases' records of the others are kept as they are (see fleet.tuna.databases).
DATA_TYPES = ("FP32", "FP16", "BF16", "INT8", "INT8x4", "INT32", "FP64", "FP8", "BFP8")
DIRECTIONS = ("F", "B", "W")


def key_frame(params: Mapping[str, Any]) -> dict[str, Any]:
    """The problem as MIOpen's ``ProblemDescription`` sees it for its direction (sides swapped for B and W).

    Parameters
    ----------
    params:
        Canonical conv parameters with ``direction``.

    Returns
    -------
    dict
        ``spatial_dim``, ``in_channels``, ``in_d/h/w``, ``fil_d/h/w``, ``out_channels``, ``out_d/h/w``,
        ``batchsize``, ``pad_*``, ``conv_stride_*``, ``dilation_*``, ``bias``, ``group_count``, ``in_layout``,
        ``fil_layout``, ``out_layout``, ``precision``, ``direction``; 2-D problems keep the neutral depths.
    """
    p = _checked(params)
    depth, height, width = output_sizes(p)
    x = (p["in_channels"], p["in_d"], p["in_h"], p["in_w"], p["in_layout"])
    y = (p["out_channels"], depth if p["spatial_dim"] == 3 else 1, height, width, p["out_layout"])
    if p["direction"] != "F":
        x, y = y, x
    frame = {name: p[name] for name in p if name not in ("in_channels", "out_channels", "in_layout", "out_layout")}
    for prefix, side in (("in_", x), ("out_", y)):
        frame[prefix + "channels"], frame[prefix + "d"], frame[prefix + "h"], frame[prefix + "w"] = side[:4]
        frame[prefix + "layout"] = side[4]
    return frame


def db_key(params: Mapping[str, Any], *, style: str = "legacy") -> str:
    """MIOpen's find-db / perf-db key of a conv problem in one direction.

    Parameters
    ----------
    params:
        Canonical conv parameters with ``direction`` (``F``, ``B`` or ``W``).
    style:
        ``legacy`` (default: the shipped 2.x databases) or ``current`` (MIOpen 3.x); they differ in 3-D only.

    Raises
    ------
    SpecError
        For a batch-norm or pooling problem, or parameters that are not a valid conv problem.
    """
    if style not in STYLES:
        raise SpecError(f"key style must be one of {', '.join(STYLES)}, not {style!r}")
    try:
        kind = problem_kind(params)
    except DriverLineError:
        kind = "conv"
    if kind == "bnorm":
        raise SpecError("batch-norm problems have no MIOpen find-db/perf-db key; only conv problems do")
    if kind == "pool":
        raise SpecError("pooling problems have no MIOpen find-db/perf-db key: MIOpen keeps no tuning database for them")
    f = key_frame(params)
    three = f["spatial_dim"] == 3

    def dhw(prefix: str, sep: str) -> str:
        parts = [f[prefix + "d"]] if three else []
        return sep.join(str(v) for v in [*parts, f[prefix + "h"], f[prefix + "w"]])

    pads = dhw("pad_", "x")
    if three and style == "legacy" and (f["pad_d"], f["pad_h"], f["pad_w"]) == (0, 0, 0):
        pads = "0x0"
    parts = [
        str(f["in_channels"]),
        dhw("in_", "-"),
        dhw("fil_", "x"),
        str(f["out_channels"]),
        dhw("out_", "-"),
        str(f["batchsize"]),
        pads,
        dhw("conv_stride_", "x"),
        dhw("dilation_", "x"),
        str(f["bias"]),
        _layout_part(f, style),
        f["precision"],
        f["direction"] + (f"_g{f['group_count']}" if f["group_count"] != 1 else ""),
    ]
    return "-".join(parts)


def db_keys(params: Mapping[str, Any]) -> tuple[str, ...]:
    """Every spelling of a conv problem's key, legacy first; one for 2-D problems, two for 3-D ones.

    Use it to find a problem in a database some MIOpen wrote, e.g. a user find-db of MIOpen 3.x, whose 3-D
    keys are spelled the current way. ``parse_key(k) == params`` for every ``k`` it gives.

    Parameters
    ----------
    params:
        Canonical conv parameters with ``direction``.
    """
    return tuple(dict.fromkeys(db_key(params, style=style) for style in STYLES))


def perf_layout(params: Mapping[str, Any], *, style: str = "legacy") -> str:
    """The ``layout`` column of the perf-db ``config`` row: the key side's input layout.

    Parameters
    ----------
    params:
        Canonical conv parameters with ``direction``.
    style:
        As for :func:`db_key`: ``legacy`` writes the default 3-D layout ``NCHW``.
    """
    f = key_frame(params)
    if style == "legacy" and f["spatial_dim"] == 3 and f["in_layout"] == DEFAULT_LAYOUT[3]:
        return "NCHW"
    return f["in_layout"]


def _layout_part(f: Mapping[str, Any], style: str) -> str:
    layouts = (f["in_layout"], f["fil_layout"], f["out_layout"])
    default = DEFAULT_LAYOUT[f["spatial_dim"]]
    if layouts == (default,) * 3:
        return "NCHW" if style == "legacy" else default
    return "-".join(layouts)


def parse_key(key: str) -> dict[str, Any]:
    """The canonical conv problem (with ``direction``) of a MIOpen find-db / perf-db key, either style.

    Parameters
    ----------
    key:
        e.g. ``1024-14-14-1x1-2048-7-7-128-0x0-2x2-1x1-0-NCHW-FP32-F``.

    Raises
    ------
    MIOpenDbError
        When the key is malformed, uses a feature Fleet does not model (cast types, other precisions,
        vectorised layouts), or its output sizes do not follow from its input, filter, padding and strides.
    """
    parts = key.strip().split("-")
    if len(parts) < 15:
        raise MIOpenDbError(f"key {key!r} has {len(parts)} parts; a conv key has 15 to 19")
    three = len(parts) > 4 and parts[3].count("x") == 0 and parts[4].count("x") == 2
    try:
        problem = _parse_parts(parts, three)
    except (ValueError, IndexError):
        raise MIOpenDbError(f"key {key!r} is not a MIOpen conv key") from None
    except DriverLineError as error:
        raise MIOpenDbError(f"key {key!r} is not a valid conv problem: {error}") from None
    if isinstance(problem, str):
        raise MIOpenDbError(f"key {key!r}: {problem}")
    return problem


def is_legacy_spelling(key: str) -> bool:
    """Whether ``db_key(parse_key(key)) == key``, for a key that :func:`parse_key` reads, told from its text.

    An import of a find-db keeps each record's key as its problem's key when this holds, instead of deriving
    the key again (which took a fifth of the import's time). A key is spelt otherwise when a number has a
    leading zero (or a digit that is not ASCII), a 3-D key is spelt the current way (``NCDHW``, ``0x0x0``),
    three default layouts are written out, or it has surrounding blanks.

    Parameters
    ----------
    key:
        A key that :func:`parse_key` accepts; for any other the answer means nothing.
    """
    if key != key.strip():
        return False
    parts = key.split("-")
    three = len(parts) > 4 and parts[3].count("x") == 0 and parts[4].count("x") == 2
    count = 14 if three else 12  # C, input sizes, filter, K, output sizes, N, pads, strides, dilations, bias
    for part in parts[:count]:
        for text in part.split("x"):
            if not text.isascii() or (text[:1] == "0" and text != "0"):
                return False
    if three and parts[10] == "0x0x0":
        return False
    *layouts, _, tail = parts[count:]
    if layouts != ["NCHW"] and layouts == [DEFAULT_LAYOUT[3 if three else 2]] * len(layouts):
        return False
    groups = tail.partition("_")[2]
    return not groups or (groups[1:2] != "0" and groups.isascii())


def _ints(text: str, count: int) -> list[int]:
    texts = text.split("x")
    if len(texts) != count or not all(t.isdigit() for t in texts):
        raise ValueError(text)
    return [int(t) for t in texts]


def _number(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def _parse_parts(parts: list[str], three: bool) -> dict[str, Any] | str:
    # By position: C, n input sizes, filter, K, n output sizes, N, pads, strides, dilations, bias, then the rest.
    # parse_key has checked that there are at least 15 parts, which covers every position below.
    n = 3 if three else 2
    c = _number(parts[0])
    in_dims = [_number(t) for t in parts[1 : 1 + n]]
    fil = _ints(parts[1 + n], n)
    k = _number(parts[2 + n])
    out_dims = [_number(t) for t in parts[3 + n : 3 + 2 * n]]
    batch = _number(parts[3 + 2 * n])
    pad_text = parts[4 + 2 * n]
    # "0x0" is the legacy spelling of an all-zero 3-D padding.
    pads = [0, 0, 0] if three and pad_text == "0x0" else _ints(pad_text, n)
    strides = _ints(parts[5 + 2 * n], n)
    dilations = _ints(parts[6 + 2 * n], n)
    bias = _number(parts[7 + 2 * n])
    rest = parts[8 + 2 * n :]
    if len(rest) not in (3, 5):
        return f"expected one or three layouts before the precision, found {len(rest) - 2} parts"
    *layouts, precision, tail = rest
    direction, _, options = tail.partition("_")
    if direction not in DIRECTIONS:
        return f"direction {direction!r} is not F, B or W"
    groups = 1
    if options:
        if not options.startswith("g") or not options[1:].isdigit() or int(options[1:]) < 2:
            return f"optional part _{options} is not supported (only _g<groups>)"
        groups = int(options[1:])
    if precision not in PRECISIONS:
        known = "a data type MIOpenDriver has no conv command for" if precision in DATA_TYPES else "not a data type"
        return f"precision {precision!r} is {known} ({', '.join(PRECISIONS)} are)"
    spatial_dim = 3 if three else 2
    if len(layouts) == 1:
        if layouts[0] not in ("NCHW", DEFAULT_LAYOUT[spatial_dim]):
            return f"a single layout must be the default one, not {layouts[0]!r}"
        layouts = [DEFAULT_LAYOUT[spatial_dim]] * 3
    for layout in layouts:
        if layout not in LAYOUTS[spatial_dim]:
            return f"layout {layout!r} is not supported for {spatial_dim}-D problems"
    key_in, key_out = (c, in_dims, layouts[0]), (k, out_dims, layouts[2])
    x, y = (key_in, key_out) if direction == "F" else (key_out, key_in)
    dims = dict(zip(("d", "h", "w")[3 - n :], range(n), strict=True))
    params: dict[str, Any] = {
        "spatial_dim": spatial_dim,
        "precision": precision,
        "batchsize": batch,
        "in_channels": x[0],
        "out_channels": y[0],
        "in_d": 1,
        "fil_d": 1,
        "pad_d": 0,
        "conv_stride_d": 0,
        "dilation_d": 0,
    }
    for axis, index in dims.items():
        params[f"in_{axis}"] = x[1][index]
        params[f"fil_{axis}"] = fil[index]
        params[f"pad_{axis}"] = pads[index]
        params[f"conv_stride_{axis}"] = strides[index]
        params[f"dilation_{axis}"] = dilations[index]
    params.update(
        group_count=groups, bias=bias, in_layout=x[2], fil_layout=layouts[1], out_layout=y[2], direction=direction
    )
    params = _conv_checked(params)
    computed = output_sizes(params)[3 - n :]
    if list(computed) != list(y[1]):
        return (
            f"output size {'x'.join(map(str, y[1]))} does not follow from the input, filter, padding, stride "
            f"and dilation (which give {'x'.join(map(str, computed))})"
        )
    return params


def _checked(params: Mapping[str, Any]) -> dict[str, Any]:
    if params.get("direction") not in DIRECTIONS:
        raise SpecError(f"conv problem direction must be F, B or W, not {params.get('direction')!r}")
    try:
        return _conv_checked(params)
    except DriverLineError as error:
        raise SpecError(str(error)) from None
