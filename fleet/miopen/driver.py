"""MIOpenDriver command lines, as tuning teams feed them in, turned into Fleet problems.

A line such as ``./bin/MIOpenDriver conv -n 128 -c 1024 -H 14 -W 14 -k 256 -y 1 -x 1 -F 1 -t 1`` becomes a
:class:`DriverLine`: the command, the kind of problem (``conv``, ``bnorm`` or ``pool``), its canonical parameters
and the directions it asks for. :func:`problems` gives one Fleet problem per direction; :func:`driver_argv` goes back.

Parsing follows MIOpenDriver's own rules: every flag takes a value (``-n 128``, ``--batchsize 128`` and
``--batchsize=128`` are the same), the last occurrence of a flag wins, a flag the driver does not know is an
error, and flags left out take the driver's defaults. Anything before the ``MIOpenDriver`` token (a logging
preamble, a path) is ignored. Flags that change only how the driver runs (``-t -V -i -s -w -P -o -d -e -a -D
-S -G -C -r``) are accepted and dropped.

Canonical parameters (JSON scalars only) are in the *driver's* frame: ``in_*`` is the convolution's input x,
``out_channels`` its output y, whatever the direction; :mod:`fleet.miopen.keys` swaps sides for the MIOpen key.

conv
    ``spatial_dim`` (2 or 3), ``precision`` (``FP32``, ``FP16``, ``BF16``, ``INT8``), ``batchsize``, ``in_channels``,
    ``out_channels``, ``in_d in_h in_w``, ``fil_d fil_h fil_w``, ``pad_d pad_h pad_w``,
    ``conv_stride_d conv_stride_h conv_stride_w``, ``dilation_d dilation_h dilation_w``, ``group_count``,
    ``in_layout fil_layout out_layout``, ``bias``. A 2-D problem carries the neutral depth values MIOpen's
    perf-db ``config`` table uses for 2-D rows: ``in_d = fil_d = 1``, ``pad_d = conv_stride_d = dilation_d = 0``.
    ``bias`` is 0 for every driver line: MIOpenDriver's ``-b 1`` runs the bias as a separate kernel, so MIOpen
    describes (and keys) the convolution itself with bias 0. Directions are ``F`` (forward), ``B`` (backward
    data) and ``W`` (backward weights), from ``-F`` (0 all, 1 F, 2 B, 4 W, sums for pairs).

bnorm
    ``spatial_dim``, ``precision``, ``batchsize``, ``in_channels``, ``in_d in_h in_w`` (``in_d`` 1 in 2-D),
    ``layout``, ``mode`` (``per_activation`` or ``spatial``), ``save`` and ``run`` (0 or 1: save the mean and
    inverse variance / keep running averages; in backward, ``save`` means use the saved values). A bnorm line
    asks for exactly one direction, as the driver runs exactly one: ``F`` forward training (``--forw 1``, and
    the driver's default when neither ``--forw`` nor ``--back`` is set), ``I`` forward inference
    (``--forw 2``) or ``B`` backward (``--forw 0 --back 1``). Flags that do not matter to that direction are
    dropped (``run`` in backward, ``save`` in inference) so equal problems compare equal.

pool
    ``spatial_dim`` (2), ``precision`` (``FP32`` from ``pool``, ``FP16`` from ``poolfp16``), ``batchsize``,
    ``in_channels``, ``in_h``, ``in_w``, ``win_h``, ``win_w``, ``pool_stride_h``, ``pool_stride_w``, ``pad_h``,
    ``pad_w``, ``mode`` (``max``, ``avg``, ``avg_in``), ``pad_mode`` (``default``, ``same``, ``valid``) and
    ``index_type`` (``miopenIndexUint8`` ...). Directions: ``F`` and ``B`` (``-F 0``, the driver's default) or
    ``F`` alone (``-F 1``). MIOpen keeps no find-db or perf-db for pooling: these problems have no key and are
    never tuned; they are known so that a network's whole driver list is.

Not supported, each with a clear :class:`~fleet.errors.DriverLineError`: other drivers (``lrn``, ``activ``,
...), transposed convolutions (``-m trans``), vectorised tensors (``-Z``/``-L``), cast types (``-U -T -R``),
``-z same`` when it would pad asymmetrically, and layouts other than NCHW/NHWC (2-D) and NCDHW/NDHWC (3-D).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.errors import DriverLineError

CONV_COMMANDS = {"conv": "FP32", "convfp16": "FP16", "convbfp16": "BF16", "convint8": "INT8"}
BNORM_COMMANDS = {"bnorm": "FP32", "bnormfp16": "FP16"}
POOL_COMMANDS = {"pool": "FP32", "poolfp16": "FP16"}
COMMANDS = {
    **{name: "conv" for name in CONV_COMMANDS},
    **{name: "bnorm" for name in BNORM_COMMANDS},
    **{name: "pool" for name in POOL_COMMANDS},
}
# The precisions a conv problem can have: those MIOpenDriver has a conv command for.
PRECISIONS = tuple(CONV_COMMANDS.values())
CONV_DIRECTIONS = ("F", "B", "W")
BNORM_DIRECTIONS = ("F", "I", "B")
LAYOUTS = {2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}
DEFAULT_LAYOUT = {2: "NCHW", 3: "NCDHW"}

# MIOpenDriver conv flags: long name -> (short name, default). From driver/conv_driver.hpp AddCmdLineArgs.
_CONV_FLAGS: dict[str, tuple[str, str]] = {
    "in_layout": ("I", ""),
    "out_layout": ("O", ""),
    "fil_layout": ("f", ""),
    "spatial_dim": ("_", "2"),
    "forw": ("F", "0"),
    "batchsize": ("n", "100"),
    "in_channels": ("c", "3"),
    "in_d": ("!", "32"),
    "in_h": ("H", "32"),
    "in_w": ("W", "32"),
    "out_channels": ("k", "32"),
    "fil_d": ("@", "3"),
    "fil_h": ("y", "3"),
    "fil_w": ("x", "3"),
    "conv_stride_d": ("#", "1"),
    "conv_stride_h": ("u", "1"),
    "conv_stride_w": ("v", "1"),
    "pad_d": ("$", "0"),
    "pad_h": ("p", "0"),
    "pad_w": ("q", "0"),
    "pad_val": ("r", "0"),
    "trans_output_pad_d": ("%", "0"),
    "trans_output_pad_h": ("Y", "0"),
    "trans_output_pad_w": ("X", "0"),
    "iter": ("i", "10"),
    "verify": ("V", "1"),
    "verification_cache": ("C", ""),
    "time": ("t", "0"),
    "wall": ("w", "0"),
    "search": ("s", "0"),
    "printconv": ("P", "1"),
    "dump_output": ("o", "0"),
    "in_data": ("d", ""),
    "weights": ("e", ""),
    "bias": ("b", "0"),
    "mode": ("m", "conv"),
    "pad_mode": ("z", "default"),
    "tensor_vect": ("Z", "0"),
    "vector_length": ("L", "1"),
    "dilation_d": ("^", "1"),
    "dilation_h": ("l", "1"),
    "dilation_w": ("j", "1"),
    "in_bias": ("a", ""),
    "group_count": ("g", "1"),
    "dout_data": ("D", ""),
    "solution": ("S", "-1"),
    "gpualloc": ("G", "0"),
    "in_cast_type": ("U", "-1"),
    "out_cast_type": ("T", "-1"),
    "wei_cast_type": ("R", "-1"),
}
# Older drivers named the strides by position.
_CONV_ALIASES = {"conv_stride_0": "conv_stride_h", "conv_stride_1": "conv_stride_w"}

# MIOpenDriver bnorm flags, from driver/bn_driver.hpp AddCmdLineArgs.
_BNORM_FLAGS: dict[str, tuple[str, str]] = {
    "forw": ("F", "0"),
    "back": ("b", "0"),
    "batchsize": ("n", "32"),
    "in_channels": ("c", "3"),
    "in_h": ("H", "32"),
    "in_w": ("W", "32"),
    "in_d": ("D", "0"),
    "layout": ("L", ""),
    "alpha": ("A", "1.0"),
    "beta": ("B", "0."),
    "iter": ("i", "1"),
    "verify": ("V", "1"),
    "time": ("t", "0"),
    "printconv": ("P", "1"),
    "mode": ("m", "0"),
    "save": ("s", "0"),
    "run": ("r", "0"),
    "wall": ("w", "0"),
}

# MIOpenDriver pool flags, from driver/pool_driver.hpp AddCmdLineArgs (2-D). Note -v is the stride in height.
_POOL_FLAGS: dict[str, tuple[str, str]] = {
    "forw": ("F", "0"),
    "batchsize": ("n", "100"),
    "in_channels": ("c", "3"),
    "in_h": ("H", "32"),
    "in_w": ("W", "32"),
    "win_h": ("y", "3"),
    "win_w": ("x", "3"),
    "pool_stride_1": ("v", "1"),
    "pool_stride_0": ("u", "1"),
    "pad_h": ("p", "0"),
    "pad_w": ("q", "0"),
    "pad_val": ("r", "0"),
    "iter": ("i", "10"),
    "verify": ("V", "1"),
    "time": ("t", "0"),
    "wall": ("w", "0"),
    "print": ("P", "1"),
    "mode": ("m", "max"),
    "pad_mode": ("z", "default"),
    "index_type": ("I", "miopenIndexUint8"),
}
POOL_MODES = ("max", "avg", "avg_in")
INDEX_TYPES = ("miopenIndexUint8", "miopenIndexUint16", "miopenIndexUint32", "miopenIndexUint64")

_DIRECTION_BITS = (("F", 1), ("B", 2), ("W", 4))


@dataclass(frozen=True)
class DriverLine:
    """One MIOpenDriver command line, parsed.

    Parameters
    ----------
    command:
        The driver command: ``conv``, ``convfp16``, ``convbfp16``, ``convint8``, ``bnorm``, ``bnormfp16``,
        ``pool`` or ``poolfp16``.
    kind:
        The Fleet problem kind, ``conv``, ``bnorm`` or ``pool``.
    params:
        Canonical problem parameters without the direction (see the module docstring).
    directions:
        The directions the line asks for: conv a subset of ``F``, ``B``, ``W`` in that order; bnorm one of
        ``F`` (training), ``I`` (inference), ``B`` (backward); pool ``F`` and ``B``, or ``F``.
    """

    command: str
    kind: str
    params: dict
    directions: tuple[str, ...]

    def __hash__(self) -> int:
        return hash((self.command, self.kind, tuple(sorted(self.params.items())), self.directions))


def parse_line(text: str) -> DriverLine:
    """Parse one MIOpenDriver command line.

    Parameters
    ----------
    text:
        The line, with or without a logging preamble or a path before ``MIOpenDriver``; the binary itself may
        be left out when the line starts with the command.

    Raises
    ------
    DriverLineError
        When the line is not a conv or bnorm driver line, names an unknown flag, misses a value, or describes
        an impossible or unsupported problem. The message says which.
    """
    tokens = _tokens(text)
    command, args = _command_and_args(tokens, text)
    kind = COMMANDS[command]
    if kind == "conv":
        values = _flags(args, _CONV_FLAGS, _CONV_ALIASES, command)
        params, directions = _conv(values, CONV_COMMANDS[command])
    elif kind == "pool":
        values = _flags(args, _POOL_FLAGS, _POOL_ALIASES, command)
        params, directions = _pool(values, POOL_COMMANDS[command])
    else:
        values = _flags(args, _BNORM_FLAGS, {}, command)
        params, directions = _bnorm(values, BNORM_COMMANDS[command])
    return DriverLine(command=command, kind=kind, params=params, directions=directions)


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, DriverLine | DriverLineError]]:
    """Parse many lines, reporting bad ones instead of stopping at them.

    Parameters
    ----------
    lines:
        Lines of text, e.g. an open file. Blank lines and lines starting with ``#`` are skipped.

    Yields
    ------
    (line_number, result)
        The 1-based line number and either the :class:`DriverLine` or the :class:`DriverLineError` it raised.
    """
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            yield number, parse_line(stripped)
        except DriverLineError as error:
            yield number, error


def with_batch(line: DriverLine, n: int) -> DriverLine:
    """The same line with another batch size (``-n``).

    Parameters
    ----------
    line:
        A parsed line.
    n:
        The new batch size, at least 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DriverLineError(f"batch size must be a positive integer, not {n!r}")
    return dataclasses.replace(line, params={**line.params, "batchsize": n})


def with_command(line: DriverLine, command: str) -> DriverLine:
    """The same line run by another driver command of the same kind, i.e. another precision.

    Parameters
    ----------
    line:
        A parsed line.
    command:
        A conv command for a conv line, a bnorm command for a bnorm line, a pool command for a pool line.
    """
    table = _TABLES[line.kind]
    if command not in table:
        raise DriverLineError(f"command {command!r} cannot replace {line.command!r}: use one of {', '.join(table)}")
    return dataclasses.replace(line, command=command, params={**line.params, "precision": table[command]})


def problems(line: DriverLine) -> list[dict]:
    """One canonical problem parameter dict per direction of the line.

    Parameters
    ----------
    line:
        A parsed line.

    Returns
    -------
    list of dict
        ``line.params`` plus ``"direction"``, in the order of ``line.directions``.
    """
    return [{**line.params, "direction": direction} for direction in line.directions]


def command_for(kind: str, precision: str) -> str:
    """The driver command that runs a problem of this kind and precision (``conv`` + ``FP16`` -> ``convfp16``).

    Parameters
    ----------
    kind:
        ``conv``, ``bnorm`` or ``pool``.
    precision:
        e.g. ``FP32``, ``FP16``, ``BF16``, ``INT8``.
    """
    table = _TABLES.get(kind)
    if table is None:
        raise DriverLineError(f"problem kind {kind!r} has no MIOpenDriver command; use conv, bnorm or pool")
    for command, value in table.items():
        if value == precision:
            return command
    raise DriverLineError(f"MIOpenDriver has no {kind} command for precision {precision!r}")


def problem_kind(params: Mapping[str, Any]) -> str:
    """``conv``, ``bnorm`` or ``pool``, told apart by the parameters each kind has.

    Parameters
    ----------
    params:
        Canonical problem parameters.
    """
    if "fil_h" in params and "out_channels" in params:
        return "conv"
    if "win_h" in params and "mode" in params:
        return "pool"
    if "layout" in params and "mode" in params:
        return "bnorm"
    raise DriverLineError(
        "parameters are neither a conv problem (fil_h, out_channels), a bnorm one (layout, mode) "
        "nor a pool one (win_h, mode)"
    )


def driver_argv(params: Mapping[str, Any]) -> list[str]:
    """The MIOpenDriver arguments (without the binary) that run one problem in one direction.

    Parameters
    ----------
    params:
        Canonical parameters with ``direction``, as :func:`problems` gives them.

    Returns
    -------
    list of str
        e.g. ``["conv", "-n", "128", "-c", "1024", ..., "-F", "1"]``. Flags that only change how the driver
        runs (``-t 1``, ``-V 0``, ``-i``) are the caller's to add.
    """
    kind = problem_kind(params)
    direction = params.get("direction")
    if kind == "conv":
        bits = dict(_DIRECTION_BITS)
        if direction not in bits:
            raise DriverLineError(f"conv direction must be one of F, B, W, not {direction!r}")
        p = _conv_checked(params)
        if p["bias"]:
            # MIOpenDriver runs -b 1 as a separate bias kernel; it cannot run a convolution keyed with bias 1.
            raise DriverLineError("MIOpenDriver cannot run a conv problem with bias 1 (MIOpen keys driver runs bias 0)")
        argv: list[object] = [command_for("conv", p["precision"])]
        argv += ["-n", p["batchsize"], "-c", p["in_channels"], "-H", p["in_h"], "-W", p["in_w"]]
        argv += ["-k", p["out_channels"], "-y", p["fil_h"], "-x", p["fil_w"], "-p", p["pad_h"], "-q", p["pad_w"]]
        argv += ["-u", p["conv_stride_h"], "-v", p["conv_stride_w"], "-l", p["dilation_h"], "-j", p["dilation_w"]]
        argv += ["-g", p["group_count"], "-m", "conv"]
        if p["spatial_dim"] == 3:
            argv += ["--spatial_dim", 3, "--in_d", p["in_d"], "--fil_d", p["fil_d"], "--pad_d", p["pad_d"]]
            argv += ["--conv_stride_d", p["conv_stride_d"], "--dilation_d", p["dilation_d"]]
        default = DEFAULT_LAYOUT[p["spatial_dim"]]
        if (p["in_layout"], p["fil_layout"], p["out_layout"]) != (default,) * 3:
            argv += ["--in_layout", p["in_layout"], "--fil_layout", p["fil_layout"], "--out_layout", p["out_layout"]]
        argv += ["-F", bits[direction]]
        return [str(item) for item in argv]
    if kind == "pool":
        return _pool_argv(params, direction)
    if direction not in BNORM_DIRECTIONS:
        raise DriverLineError(f"bnorm direction must be one of F, I, B, not {direction!r}")
    argv = [command_for("bnorm", params["precision"])]
    argv += ["-n", params["batchsize"], "-c", params["in_channels"], "-H", params["in_h"], "-W", params["in_w"]]
    if params["spatial_dim"] == 3:
        argv += ["-D", params["in_d"]]
    if params["layout"] != DEFAULT_LAYOUT[params["spatial_dim"]]:
        argv += ["-L", params["layout"]]
    argv += ["-m", 1 if params["mode"] == "spatial" else 0]
    forw, back = {"F": (1, 0), "I": (2, 0), "B": (0, 1)}[direction]
    argv += ["--forw", forw, "-b", back, "-s", params["save"], "-r", params["run"]]
    return [str(item) for item in argv]


def output_sizes(params: Mapping[str, Any]) -> tuple[int, int, int]:
    """The forward output's depth, height and width of a conv problem (depth 1 in 2-D).

    Parameters
    ----------
    params:
        Canonical conv parameters.
    """
    height = _out(params["in_h"], params["fil_h"], params["pad_h"], params["conv_stride_h"], params["dilation_h"])
    width = _out(params["in_w"], params["fil_w"], params["pad_w"], params["conv_stride_w"], params["dilation_w"])
    depth = 1
    if params["spatial_dim"] == 3:
        depth = _out(params["in_d"], params["fil_d"], params["pad_d"], params["conv_stride_d"], params["dilation_d"])
    return depth, height, width


def _out(size: int, fil: int, pad: int, stride: int, dilation: int) -> int:
    # MIOpen's ConvolutionDescriptor::GetForwardOutputTensor for the default padding mode, which never gives
    # less than 1: the shipped find-dbs hold such problems (a 3x3 filter over a 2x2 input, output 1x1).
    return max(1, (size + 2 * pad - dilation * (fil - 1) - 1) // stride + 1)


# --- parsing ---------------------------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        # An unbalanced quote in a log line; MIOpenDriver lines themselves never need quoting.
        return text.split()


def _command_and_args(tokens: list[str], text: str) -> tuple[str, list[str]]:
    start = None
    for index, token in enumerate(tokens):
        if os.path.basename(token) == "MIOpenDriver" or token.endswith("/MIOpenDriver"):
            start = index + 1
            break
    if start is None:
        if tokens and tokens[0] in COMMANDS:
            start = 0
        else:
            raise DriverLineError(f"not an MIOpenDriver command line (no MIOpenDriver in it): {_short(text)}")
    if start >= len(tokens):
        raise DriverLineError(f"MIOpenDriver without a command: {_short(text)}")
    command = tokens[start]
    if command not in COMMANDS:
        raise DriverLineError(f"MIOpenDriver command {command!r} is not supported (supported: {', '.join(COMMANDS)})")
    return command, tokens[start + 1 :]


def _short(text: str, limit: int = 80) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _flags(args: list[str], table: dict[str, tuple[str, str]], aliases: dict[str, str], command: str) -> dict[str, str]:
    by_short = {short: name for name, (short, _) in table.items()}
    values = {name: default for name, (_, default) in table.items()}
    index = 0
    while index < len(args):
        token = args[index]
        inline = None
        if token.startswith("--") and len(token) > 2:
            name = token[2:]
            if "=" in name:
                name, inline = name.split("=", 1)
            name = aliases.get(name, name)
            if name not in table:
                raise DriverLineError(f"MIOpenDriver {command} has no flag {token.split('=', 1)[0]}")
        elif token.startswith("-") and len(token) == 2:
            long_name = by_short.get(token[1])
            if long_name is None:
                raise DriverLineError(f"MIOpenDriver {command} has no flag {token}")
            name = long_name
        else:
            raise DriverLineError(f"unexpected argument {token!r}: MIOpenDriver {command} expects -flag value pairs")
        if inline is None:
            if index + 1 >= len(args):
                raise DriverLineError(f"flag {token} of MIOpenDriver {command} has no value")
            inline = args[index + 1]
            index += 2
        else:
            index += 1
        values[name] = inline
    return values


def _int(values: dict[str, str], name: str, minimum: int, short: str) -> int:
    raw = values[name]
    if not re.fullmatch(r"[+-]?\d+", raw.strip()):
        raise DriverLineError(f"-{short} ({name}) must be an integer, not {raw!r}")
    value = int(raw)
    if value < minimum:
        raise DriverLineError(f"-{short} ({name}) must be at least {minimum}, not {value}")
    return value


def _conv(values: dict[str, str], precision: str) -> tuple[dict, tuple[str, ...]]:
    def get(name: str, minimum: int) -> int:
        return _int(values, name, minimum, _CONV_FLAGS[name][0])

    spatial_dim = get("spatial_dim", 2)
    if spatial_dim not in (2, 3):
        raise DriverLineError(f"--spatial_dim must be 2 or 3, not {spatial_dim}")
    mode = values["mode"].strip()
    if mode == "trans":
        raise DriverLineError("transposed convolutions (-m trans) are not supported")
    if mode != "conv":
        raise DriverLineError(f"-m (mode) must be conv or trans, not {mode!r}")
    if get("tensor_vect", 0) != 0 or get("vector_length", 1) != 1:
        raise DriverLineError("vectorised tensors (-Z / -L) are not supported")
    for name in ("in_cast_type", "out_cast_type", "wei_cast_type"):
        if values[name].strip() not in ("-1", ""):
            raise DriverLineError(f"cast types (--{name}) are not supported")
    forw = get("forw", 0)
    if forw > 7:
        raise DriverLineError(f"-F must be 0 (all), 1 (F), 2 (B), 4 (W) or a sum of two of them, not {forw}")
    directions = tuple(name for name, bit in _DIRECTION_BITS if forw == 0 or forw & bit)

    three = spatial_dim == 3
    params: dict[str, Any] = {
        "spatial_dim": spatial_dim,
        "precision": precision,
        "batchsize": get("batchsize", 1),
        "in_channels": get("in_channels", 1),
        "out_channels": get("out_channels", 1),
        "in_d": get("in_d", 1) if three else 1,
        "in_h": get("in_h", 1),
        "in_w": get("in_w", 1),
        "fil_d": get("fil_d", 1) if three else 1,
        "fil_h": get("fil_h", 1),
        "fil_w": get("fil_w", 1),
        "pad_d": get("pad_d", 0) if three else 0,
        "pad_h": get("pad_h", 0),
        "pad_w": get("pad_w", 0),
        "conv_stride_d": get("conv_stride_d", 1) if three else 0,
        "conv_stride_h": get("conv_stride_h", 1),
        "conv_stride_w": get("conv_stride_w", 1),
        "dilation_d": get("dilation_d", 1) if three else 0,
        "dilation_h": get("dilation_h", 1),
        "dilation_w": get("dilation_w", 1),
        "group_count": get("group_count", 1),
        "in_layout": _layout(values["in_layout"], spatial_dim, "--in_layout"),
        "fil_layout": _layout(values["fil_layout"], spatial_dim, "--fil_layout"),
        "out_layout": _layout(values["out_layout"], spatial_dim, "--out_layout"),
        "bias": 0,
    }
    _apply_pad_mode(params, values["pad_mode"].strip())
    return _conv_checked(params), directions


def _layout(raw: str, spatial_dim: int, flag: str) -> str:
    value = raw.strip().upper()
    if not value:
        return DEFAULT_LAYOUT[spatial_dim]
    if value not in LAYOUTS[spatial_dim]:
        raise DriverLineError(
            f"{flag} {raw} is not supported for {spatial_dim}-D problems (use {' or '.join(LAYOUTS[spatial_dim])})"
        )
    return value


_SPATIAL = ("d", "h", "w")


def _apply_pad_mode(params: dict[str, Any], pad_mode: str) -> None:
    if pad_mode == "default":
        return
    if pad_mode not in ("same", "valid"):
        raise DriverLineError(f"-z (pad_mode) must be default, same or valid, not {pad_mode!r}")
    axes = _SPATIAL if params["spatial_dim"] == 3 else _SPATIAL[1:]
    # MIOpenDriver recomputes the padding only when every dilation or every filter size is 1.
    if not (all(params[f"dilation_{a}"] == 1 for a in axes) or all(params[f"fil_{a}"] == 1 for a in axes)):
        raise DriverLineError(f"-z {pad_mode} with dilated filters is not supported")
    for axis in axes:
        size, fil, stride = params[f"in_{axis}"], params[f"fil_{axis}"], params[f"conv_stride_{axis}"]
        if pad_mode == "valid":
            params[f"pad_{axis}"] = 0
            continue
        pad = max(fil - stride, 0) if size % stride == 0 else max(fil - size % stride, 0)
        params[f"pad_{axis}"] = pad // 2
        # MIOpen's "same" output is ceil(size / stride); only symmetric padding gives that with explicit pads.
        if _out(size, fil, pad // 2, stride, params[f"dilation_{axis}"]) != -(-size // stride):
            raise DriverLineError(f"-z same pads {axis} asymmetrically here, which is not supported")


_CONV_INTS = (  # noqa: SIM905 - a word list reads better than a column
    "batchsize in_channels out_channels in_d in_h in_w fil_d fil_h fil_w pad_d pad_h pad_w conv_stride_d "
    "conv_stride_h conv_stride_w dilation_d dilation_h dilation_w group_count bias"
).split()


def _conv_checked(params: Mapping[str, Any]) -> dict[str, Any]:
    """Check a conv parameter dict for completeness and consistency; return its canonical copy."""
    missing = [name for name in ("spatial_dim", "precision", *_CONV_INTS) if name not in params]
    missing += [name for name in ("in_layout", "fil_layout", "out_layout") if name not in params]
    if missing:
        raise DriverLineError(f"conv parameters lack {', '.join(missing)}")
    for name in ("spatial_dim", *_CONV_INTS):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise DriverLineError(f"conv parameter {name} must be an integer, not {value!r}")
    spatial_dim = params["spatial_dim"]
    if spatial_dim not in (2, 3):
        raise DriverLineError(f"spatial_dim must be 2 or 3, not {spatial_dim}")
    if params["precision"] not in PRECISIONS:
        raise DriverLineError(f"precision must be one of {', '.join(PRECISIONS)}, not {params['precision']!r}")
    for name in ("in_layout", "fil_layout", "out_layout"):
        if params[name] not in LAYOUTS[spatial_dim]:
            raise DriverLineError(
                f"{name} {params[name]!r} is not a {spatial_dim}-D layout ({' or '.join(LAYOUTS[spatial_dim])})"
            )
    axes = _SPATIAL if spatial_dim == 3 else _SPATIAL[1:]
    for name in ("batchsize", "in_channels", "out_channels", "group_count"):
        if params[name] < 1:
            raise DriverLineError(f"{name} must be at least 1, not {params[name]}")
    for axis in axes:
        for prefix, minimum in (("in_", 1), ("fil_", 1), ("pad_", 0), ("conv_stride_", 1), ("dilation_", 1)):
            if params[prefix + axis] < minimum:
                raise DriverLineError(f"{prefix}{axis} must be at least {minimum}, not {params[prefix + axis]}")
    if spatial_dim == 2:
        neutral = {"in_d": 1, "fil_d": 1, "pad_d": 0, "conv_stride_d": 0, "dilation_d": 0}
        for name, value in neutral.items():
            if params[name] != value:
                raise DriverLineError(f"a 2-D problem has {name} {value}, not {params[name]}")
    groups = params["group_count"]
    if params["in_channels"] % groups or params["out_channels"] % groups:
        raise DriverLineError(
            f"group count {groups} must divide in_channels {params['in_channels']} "
            f"and out_channels {params['out_channels']}"
        )
    if params["bias"] not in (0, 1):
        raise DriverLineError(f"bias must be 0 or 1, not {params['bias']}")
    canonical = {name: params[name] for name in ("spatial_dim", "precision", *_CONV_INTS)}
    canonical.update({name: params[name] for name in ("in_layout", "fil_layout", "out_layout")})
    if "direction" in params:
        canonical["direction"] = params["direction"]
    return canonical


def _bnorm(values: dict[str, str], precision: str) -> tuple[dict, tuple[str, ...]]:
    def get(name: str, minimum: int) -> int:
        return _int(values, name, minimum, _BNORM_FLAGS[name][0])

    forw, back = get("forw", 0), get("back", 0)
    if forw > 2:
        raise DriverLineError(f"--forw must be 0 (off), 1 (training) or 2 (inference), not {forw}")
    if back > 1:
        raise DriverLineError(f"-b (back) must be 0 or 1, not {back}")
    # The driver's own rule: forward wins over backward, and nothing asked means forward training.
    direction = "F" if forw == 1 or (forw == 0 and back == 0) else "I" if forw == 2 else "B"
    mode = get("mode", 0)
    if mode > 1:
        raise DriverLineError(f"-m (mode) must be 0 (per-activation) or 1 (spatial), not {mode}")
    save, run = get("save", 0), get("run", 0)
    if save > 1 or run > 1:
        raise DriverLineError("-s (save) and -r (run) must be 0 or 1")
    in_d = get("in_d", 0)
    spatial_dim = 3 if in_d else 2
    params = {
        "spatial_dim": spatial_dim,
        "precision": precision,
        "batchsize": get("batchsize", 1),
        "in_channels": get("in_channels", 1),
        "in_d": in_d if in_d else 1,
        "in_h": get("in_h", 1),
        "in_w": get("in_w", 1),
        "layout": _layout(values["layout"], spatial_dim, "-L"),
        "mode": "spatial" if mode == 1 else "per_activation",
        "save": 0 if direction == "I" else save,
        "run": 0 if direction == "B" else run,
    }
    return params, (direction,)


_TABLES = {"conv": CONV_COMMANDS, "bnorm": BNORM_COMMANDS, "pool": POOL_COMMANDS}
# Older drivers' names for the pool strides; Fleet names them by axis.
_POOL_ALIASES = {"pool_stride_h": "pool_stride_1", "pool_stride_w": "pool_stride_0"}


def _pool(values: dict[str, str], precision: str) -> tuple[dict, tuple[str, ...]]:
    def get(name: str, minimum: int) -> int:
        return _int(values, name, minimum, _POOL_FLAGS[name][0])

    forw = get("forw", 0)
    if forw > 1:
        raise DriverLineError(f"-F (forw) of pool must be 0 (forward and backward) or 1 (forward only), not {forw}")
    mode = values["mode"].strip()
    if mode not in POOL_MODES:
        raise DriverLineError(f"-m (mode) of pool must be one of {', '.join(POOL_MODES)}, not {mode!r}")
    pad_mode = values["pad_mode"].strip()
    if pad_mode not in ("default", "same", "valid"):
        raise DriverLineError(f"-z (pad_mode) must be default, same or valid, not {pad_mode!r}")
    index_type = values["index_type"].strip()
    if index_type not in INDEX_TYPES:
        raise DriverLineError(f"-I (index_type) must be one of {', '.join(INDEX_TYPES)}, not {index_type!r}")
    params = {
        "spatial_dim": 2,
        "precision": precision,
        "batchsize": get("batchsize", 1),
        "in_channels": get("in_channels", 1),
        "in_h": get("in_h", 1),
        "in_w": get("in_w", 1),
        "win_h": get("win_h", 1),
        "win_w": get("win_w", 1),
        "pool_stride_h": get("pool_stride_1", 1),
        "pool_stride_w": get("pool_stride_0", 1),
        "pad_h": get("pad_h", 0),
        "pad_w": get("pad_w", 0),
        "mode": mode,
        "pad_mode": pad_mode,
        "index_type": index_type,
    }
    return params, ("F", "B") if forw == 0 else ("F",)


def _pool_argv(params: Mapping[str, Any], direction: Any) -> list[str]:
    if direction not in ("F", "B"):
        raise DriverLineError(f"pool direction must be F or B, not {direction!r}")
    p = params
    argv: list[object] = [command_for("pool", p["precision"])]
    argv += ["-n", p["batchsize"], "-c", p["in_channels"], "-H", p["in_h"], "-W", p["in_w"]]
    argv += ["-y", p["win_h"], "-x", p["win_w"], "-v", p["pool_stride_h"], "-u", p["pool_stride_w"]]
    argv += ["-p", p["pad_h"], "-q", p["pad_w"], "-m", p["mode"], "-z", p["pad_mode"], "-I", p["index_type"]]
    # The driver runs backward only together with forward (-F 0).
    argv += ["-F", 1 if direction == "F" else 0]
    return [str(item) for item in argv]
