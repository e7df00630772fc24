"""T1, the autotuning community's input format (``kernel_tuner/schema/T1/1.0.0/input-schema.json``), in and out.

In: a T1 file is a spec. ``fleet tune kernel.json`` (and ``validate``, ``submit``) read it as Kernel Tuner's
``tune_kernel_T1`` does and make a campaign of it: the kernel (``KernelName`` of ``KernelFile``) is one problem of
kind ``kernel`` (params ``kernel_name`` and ``problem_size``, as ``fleet import kt`` names Kernel Tuner's results),
each tuning parameter a build-time knob, each condition a constraint. The workload is a ``command`` workload over
the kernel file and a host program that Fleet writes (:func:`harness`): it fills the ``Arguments``, launches the
kernel on the grid and block the file gives, times it and prints one JSON line, ``time_ms`` (lower is better). The
build defines each parameter as a macro (``-Dname=value``), as Kernel Tuner prepends ``#define`` lines, and compiles
with the language's compiler on the build workers: ``nvcc`` for CUDA (``-arch`` the campaign's ``sm_`` target),
``hipcc`` for HIP, ``cc`` (``c++`` for a ``.cpp`` file) for C on a CPU. C and HIP are Kernel Tuner's languages
that T1 1.0.0's schema does not list: Fleet accepts them beside the schema's own.

The grid follows Kernel Tuner: with ``ProblemSize`` (Kernel Tuner's field, which benchmark_hub's files give) each
dimension is ``ceil(ProblemSize[d] / product of GridDiv<D>)``, the divisors defaulting to ``LocalSize``'s; without
it, ``GlobalSize`` is the grid in blocks (``GlobalSizeType`` CUDA) or in threads (OpenCL).

Out: :func:`t1_document` writes a campaign's space as T1 when every knob has values of one T1 type and every
constraint is an expression (not a space file's Python predicate).
"""

from __future__ import annotations

import ast
import copy
import json
import math
import operator
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import SpecError, shown
from fleet.expr import MAX_LENGTH, Expression, Undefined

if TYPE_CHECKING:
    from fleet.space import Space

SCHEMA_VERSION = "1.0.0"
LANGUAGES = ("CUDA", "HIP", "C")
"""The languages whose kernels Fleet builds and runs."""
EXTENSIONS = ("C", "HIP")
"""Kernel Tuner languages that T1 1.0.0's schema does not list, which Fleet reads and writes too."""
HARNESS = "fleet_t1_main"
"""The host program's name (``.c``, ``.cpp`` or ``.cu``) and its executable's."""
ITERATIONS = 7
"""Timed runs of the kernel per evaluation, after one untimed (Kernel Tuner's default)."""

# T1 argument types -> C types; the vector types are CUDA's and HIP's own.
_SCALARS = {
    "bool": "bool", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
    "int32": "int32_t", "uint32": "uint32_t", "int64": "int64_t", "uint64": "uint64_t", "float": "float",
    "double": "double",
}  # fmt: skip
_VECTORS = {"float2": ("float", 2), "float4": ("float", 4), "double2": ("double", 2), "double4": ("double", 4)}
_STRATEGIES = {"brute_force": "grid", "random_sample": "random"}
_KT_STRATEGIES = {v: k for k, v in _STRATEGIES.items()}


# -- reading ----------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def input_schema() -> dict[str, Any]:
    """T1's input schema as Kernel Tuner ships it, its ``Language`` widened by :data:`EXTENSIONS`."""
    from importlib.resources import files

    try:
        text = files("kernel_tuner").joinpath(f"schema/T1/{SCHEMA_VERSION}/input-schema.json").read_text()
    except ModuleNotFoundError:
        raise SpecError("reading T1 needs Kernel Tuner's schema: pip install 'fleet-tune[kerneltuner]'") from None
    schema = json.loads(text)
    language = schema["properties"]["KernelSpecification"]["properties"]["Language"]
    language["enum"] = [*language["enum"], *EXTENSIONS]
    return schema


def is_t1(data: Any) -> bool:
    """Whether parsed JSON is a T1 input file rather than a Fleet spec."""
    return isinstance(data, Mapping) and "KernelSpecification" in data and "ConfigurationSpace" in data


def check_t1(data: Any) -> None:
    """Raise :class:`SpecError` naming the first place where ``data`` breaks T1's input schema."""
    from fleet.extras import require

    require("jsonschema", "reading T1")
    import jsonschema

    validator = jsonschema.Draft7Validator(input_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top"
        raise SpecError(f"not a T1 input file: {error.message} (at {where})")


def parameter_values(parameter: Mapping[str, Any]) -> list[Any]:
    """A tuning parameter's values: ``Values`` is Python's text of a list, a ``range(...)``, ``list(...)`` of one,
    or a list comprehension over one (what Kernel Tuner evaluates), read without ``eval``; checked against
    ``Type``."""
    name, kind, text = parameter["Name"], parameter["Type"], parameter["Values"]
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        values = list(_values(tree))
    except (SyntaxError, ValueError, TypeError, Undefined, RecursionError) as error:
        raise SpecError(f"tuning parameter {name!r}: cannot read its Values {shown(text)} ({error})") from None
    if not values:
        raise SpecError(f"tuning parameter {name!r} has no values")
    checks: dict[str, Callable[[Any], bool]] = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "uint": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool) or v in (0, 1),
        "string": lambda v: isinstance(v, str),
    }
    wrong = next((v for v in values if not checks[kind](v)), None)
    if wrong is not None:
        raise SpecError(f"tuning parameter {name!r} of type {kind} has the value {shown(wrong)}")
    return values


def _values(node: ast.AST) -> list[Any]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [ast.literal_eval(element) for element in node.elts]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        arguments = [ast.literal_eval(a) if not isinstance(a, ast.Call) else _values(a) for a in node.args]
        bounds = [a for a in arguments if isinstance(a, int)]
        if node.func.id == "range" and len(bounds) == len(arguments) and 1 <= len(bounds) <= 3:
            if len(range(*bounds)) > 100_000:
                raise ValueError("more than 100,000 values")
            return list(range(*bounds))
        if node.func.id == "list" and len(node.args) == 1:
            return _values(node.args[0])
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        generator = node.generators[0]
        if isinstance(generator.target, ast.Name) and not generator.is_async:
            element = Expression(ast.unparse(node.elt))
            tests = [Expression(ast.unparse(test)) for test in generator.ifs]
            out = []
            for value in _values(generator.iter):
                bound = {generator.target.id: value}
                if all(test(bound) for test in tests):
                    out.append(element(bound))
            return out
    raise ValueError("not a list, a range or a list comprehension")


def read_t1(path: Path, data: Any) -> dict[str, Any]:
    """``data`` (a T1 file's JSON, read from ``path``) checked: its schema, then what Fleet needs to build it."""
    check_t1(data)
    spec = data["KernelSpecification"]
    if spec["Language"] not in LANGUAGES:
        raise SpecError(
            f"Fleet builds T1 kernels in {', '.join(LANGUAGES)}, not {spec['Language']} "
            "(its host program would need that language's runtime)"
        )
    return data


def kernel_file(path: Path, spec: Mapping[str, Any]) -> tuple[str, bytes]:
    """The kernel's source, its name and bytes: ``KernelFile`` beside the T1 file, or in its parent folder (as Kernel
    Tuner looks), through the one check a spec's sources get (:func:`fleet.bundle.read_inside`): a regular file
    inside that folder, reached through no link, so that a T1 file cannot pack ``/proc/self/environ`` or
    ``../../secret`` into the sources it stores."""
    from fleet.bundle import Refused, read_inside
    from fleet.limits import SOURCES_BYTES

    name = spec["KernelFile"]
    for folder in (path.parent, path.parent.parent):
        try:
            return Path(name).name, read_inside(folder, name, limit=SOURCES_BYTES)
        except Refused as refused:
            if refused.why != "missing":
                raise SpecError(refused.said("KernelFile", "the T1 file's folder")) from None
    raise SpecError(f"KernelFile {shown(name)} is not beside the T1 file (nor in its parent folder)")


# -- sizes, grids and C expressions ---------------------------------------------------------------------------

_C_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}
_C_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _power(base: Any, exponent: Any) -> Any:
    # A size is at most 2**40 elements: a power past that is refused before it is computed (9**9**9 would not end).
    if abs(exponent) > 64 or abs(base) > 1 << 40:
        raise SpecError(f"{base}**{exponent} is too large for a size")
    return base**exponent


_PY_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
    ast.Pow: _power,
}


def _problem_index(node: ast.AST, problem_size: Sequence[Any]) -> int | None:
    """``ProblemSize[i]``'s value, or None when ``node`` is not that."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ProblemSize"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        if not 0 <= node.slice.value < len(problem_size):
            raise SpecError(f"ProblemSize[{node.slice.value}]: ProblemSize has {len(problem_size)} dimensions")
        return int(problem_size[node.slice.value])
    return None


def argument_size(text: Any, problem_size: Sequence[Any], values: Mapping[str, list[Any]]) -> int:
    """An argument's ``Size``: a number, or an expression over ``ProblemSize[i]`` and ``max``/``min`` of a tuning
    parameter's values, as Kernel Tuner evaluates it (one size for every configuration)."""
    if isinstance(text, int):
        return text

    def value(node: ast.AST) -> Any:
        index = _problem_index(node, problem_size)
        if index is not None:
            return index
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _PY_OPERATORS:
            return _PY_OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
            pick = max if node.func.id == "max" else min
            if len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id in values:
                return pick(values[node.args[0].id])
            return pick(value(a) for a in node.args)
        if isinstance(node, ast.Name) and node.id in values:
            raise SpecError(f"Size {shown(text)} changes with {node.id!r}: one size for every configuration is needed")
        raise SpecError(f"Size {shown(text)}: {ast.unparse(node)} is not a number, ProblemSize[i] or max(parameter)")

    _check_length("Size", text)
    try:
        size = value(ast.parse(str(text).strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError) as error:
        raise SpecError(f"Size {shown(text)}: {error}") from None
    except RecursionError:
        raise SpecError(f"Size {shown(text)}: nested too deeply") from None
    if not isinstance(size, (int, float)) or size < 0 or size > 1 << 40:
        raise SpecError(f"Size {shown(text)} is {size}, not a number of elements")
    return int(size)


def c_expression(text: Any, problem_size: Sequence[Any], knobs: Sequence[str]) -> str:
    """A grid or block expression (Python's, over tuning parameters and ``ProblemSize[i]``) as C over the macros
    that the build defines; integer arithmetic (``//`` is C's ``/`` on these non-negative sizes)."""

    def c(node: ast.AST) -> str:
        index = _problem_index(node, problem_size)
        if index is not None:
            return str(index)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return str(node.value)
        if isinstance(node, ast.Name) and node.id in knobs:
            return node.id
        if isinstance(node, ast.BinOp) and type(node.op) in _C_OPERATORS:
            return f"({c(node.left)} {_C_OPERATORS[type(node.op)]} {c(node.right)})"
        if isinstance(node, ast.IfExp):
            return f"({c(node.test)} ? {c(node.body)} : {c(node.orelse)})"
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _C_COMPARE:
            return f"({c(node.left)} {_C_COMPARE[type(node.ops[0])]} {c(node.comparators[0])})"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("max", "min")
            and len(node.args) == 2
        ):
            a, b = c(node.args[0]), c(node.args[1])
            return f"(({a}) {'>' if node.func.id == 'max' else '<'} ({b}) ? ({a}) : ({b}))"
        raise SpecError(
            f"grid or block size {shown(str(text))}: {ast.unparse(node)} is not an integer, a tuning parameter or "
            "ProblemSize[i]"
        )

    _check_length("grid or block size", text)
    try:
        return c(ast.parse(str(text).strip(), mode="eval").body)
    except SyntaxError as error:
        raise SpecError(f"grid or block size {shown(str(text))}: {error.msg}") from None
    except RecursionError:
        raise SpecError(f"grid or block size {shown(str(text))}: nested too deeply") from None


def _check_length(what: str, text: Any) -> None:
    """Refuse an expression longer than a constraint may be (fleet.expr's bound): it is walked recursively."""
    if len(str(text)) > MAX_LENGTH:
        raise SpecError(f"{what} {shown(str(text))} has {len(str(text))} characters; at most {MAX_LENGTH} are allowed")


def launch_dimensions(spec: Mapping[str, Any], knobs: Sequence[str]) -> tuple[list[str], list[str]]:
    """The grid (in blocks) and the block of a CUDA or HIP kernel, as C expressions; see the module docstring."""
    problem = list(spec.get("ProblemSize") or [])
    local = spec["LocalSize"]
    block = [c_expression(local.get(axis, "1"), problem, knobs) for axis in "XYZ"]
    grid = []
    for index, axis in enumerate("XYZ"):
        if problem:
            extent = int(problem[index]) if index < len(problem) else 1
            divisors = spec.get(f"GridDiv{axis}") or None
            divisor = " * ".join(f"({c_expression(d, problem, knobs)})" for d in divisors) if divisors else block[index]
            grid.append(f"(({extent} + ({divisor}) - 1) / ({divisor}))")
            continue
        size = c_expression(spec["GlobalSize"].get(axis, "1"), problem, knobs)
        in_threads = spec.get("GlobalSizeType", "CUDA") != "CUDA"
        grid.append(f"(({size} + {block[index]} - 1) / {block[index]})" if in_threads else size)
    return grid, block


# -- the host program ---------------------------------------------------------------------------------------


def _literal(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def harness(data: Mapping[str, Any], kernel: str, values: Mapping[str, list[Any]]) -> tuple[str, str]:
    """The host program that runs one configuration of a T1 kernel, and its file name.

    Parameters
    ----------
    data:
        The T1 file's JSON, checked (:func:`read_t1`).
    kernel:
        The kernel file's name, included by the program.
    values:
        Each tuning parameter's values (for sizes such as ``max(filter_width)``).
    """
    spec = data["KernelSpecification"]
    language = spec["Language"]
    gpu = language in ("CUDA", "HIP")
    api = "hip" if language == "HIP" else "cuda"
    lines = _harness_head(spec, kernel, list(values))
    lines += ["", "int main(void) {"]
    if gpu:
        lines += [
            "  int devices = 0;",
            f"  {api}Error_t found = {api}GetDeviceCount(&devices);",
            "  if (found != " + api + "Success || devices == 0) {",
            f'    fprintf(stderr, "no {language} device to run {spec["KernelName"]} on: %s\\n",',
            f'            found != {api}Success ? {api}GetErrorString(found) : "none found");',
            "    return 1;",
            "  }",
        ]
    call: list[str] = []
    checks: list[str] = []
    problem = list(spec.get("ProblemSize") or [])
    for number, argument in enumerate(spec.get("Arguments") or []):
        made, passed, check = _harness_argument(number, argument, language, problem, values)
        lines += made
        if passed is not None:
            call.append(passed)
        if check is not None:
            checks.append(check)
    lines += _harness_timing(spec, ", ".join(call))
    lines += ["  double sum = 0, check = 0;", f"  for (int i = 0; i < {ITERATIONS}; i++) sum += times[i];"]
    if not gpu and checks:
        # The kernel's outputs are read, so that no compiler drops its calls as writes nobody reads.
        lines.append(f"  check = {' + '.join(checks)};")
    lines += [
        f'  printf("{{\\"time_ms\\": %.9g, \\"check\\": %.9g, \\"times\\": [", sum / {ITERATIONS}, check);',
        f'  for (int i = 0; i < {ITERATIONS}; i++) printf("%s%.9g", i ? ", " : "", times[i]);',
        '  printf("]}\\n");',
        "  return 0;",
        "}",
        "",
    ]
    suffix = ".cu" if language == "CUDA" else ".cpp" if language == "HIP" or kernel.endswith((".cpp", ".cc")) else ".c"
    return "\n".join(lines), HARNESS + suffix


def _harness_head(spec: Mapping[str, Any], kernel: str, knobs: list[str]) -> list[str]:
    """The host program's includes, launch sizes and helpers, up to its main()."""
    language = spec["Language"]
    gpu = language in ("CUDA", "HIP")
    api = "hip" if language == "HIP" else "cuda"
    lines = ["// Written by Fleet from a T1 input file: runs one configuration of the kernel and prints its time."]
    if not gpu:
        lines.append("#define _POSIX_C_SOURCE 199309L")
    lines += ["#include <stdio.h>", "#include <stdlib.h>", "#include <stdint.h>", "#include <time.h>"]
    if gpu:
        lines.append("#include <hip/hip_runtime.h>" if language == "HIP" else "#include <cuda_runtime.h>")
        grid, block = launch_dimensions(spec, knobs)
        # Kernel Tuner defines the block and grid sizes for the kernel; a tuning parameter of that name wins.
        for axis, b, g in zip("xyz", block, grid, strict=True):
            if f"block_size_{axis}" not in knobs:
                lines += [f"#ifndef block_size_{axis}", f"#define block_size_{axis} {b}", "#endif"]
            lines += [f"#ifndef grid_size_{axis}", f"#define grid_size_{axis} {g}", "#endif"]
    else:
        lines.append("#include <stdbool.h>")
    lines.append(f'#include "{kernel}"')
    lines += [
        "",
        "static uint64_t fleet_state = 0x9E3779B97F4A7C15ULL;",
        "static double fleet_random(void) {",
        "  fleet_state = fleet_state * 6364136223846793005ULL + 1442695040888963407ULL;",
        "  return (double)(fleet_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;",
        "}",
    ]
    if not gpu:
        lines += [
            "static double fleet_now_ms(void) {",
            "  struct timespec t;",
            "  clock_gettime(CLOCK_MONOTONIC, &t);",
            "  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;",
            "}",
        ]
    if gpu:
        lines += [
            f"#define FLEET_CHECK(call) do {{ {api}Error_t e_ = (call); if (e_ != {api}Success) {{ "
            f'fprintf(stderr, "%s: %s\\n", #call, {api}GetErrorString(e_)); exit(1); }} }} while (0)',
        ]
    return lines


def _harness_argument(
    number: int, argument: Mapping[str, Any], language: str, problem: list[Any], values: Mapping[str, list[Any]]
) -> tuple[list[str], str | None, str | None]:
    """One kernel argument: the lines of main() that make it, what the launch passes (None for a symbol, which
    is not passed), and the value a CPU program reads back from it (None for a scalar)."""
    gpu = language in ("CUDA", "HIP")
    api = "hip" if language == "HIP" else "cuda"
    name = argument.get("Name") or f"argument {number}"
    kind, memory = argument["Type"], argument["MemoryType"]
    if kind in _SCALARS:
        c_type, lanes, base = _SCALARS[kind], 1, _SCALARS[kind]
    elif kind in _VECTORS and gpu:
        base, lanes = _VECTORS[kind]
        c_type = kind
    else:
        raise SpecError(f"argument {name!r}: type {kind} is not one Fleet's {language} host program passes")
    value = _fill_value(argument, name, kind, base)
    if memory == "Scalar":
        return [f"  {c_type} a{number} = {value};"], f"a{number}", None
    if memory not in ("Vector", "Symbol"):
        raise SpecError(f"argument {name!r}: MemoryType {memory} is not supported (Vector, Scalar, Symbol are)")
    if "Size" not in argument:
        raise SpecError(f"argument {name!r}: a vector needs its Size")
    count = argument_size(argument["Size"], problem, values) * lanes
    lines = [
        f"  size_t n{number} = {count}ULL;",
        f"  {base} *h{number} = ({base} *)malloc(n{number} * sizeof({base}) + 1);",
        f"  for (size_t i = 0; i < n{number}; i++) h{number}[i] = {value};",
    ]
    check = f"(n{number} ? (double)h{number}[0] : 0.0)"
    symbol = memory == "Symbol" or argument.get("MemType") == "Constant"
    if symbol and not gpu:
        raise SpecError(f"argument {name!r}: a {memory} argument needs a GPU language")
    if symbol:
        # Kernel Tuner copies it to the kernel's symbol of its name (constant memory); a T1 Symbol is not
        # passed, a vector marked MemType Constant is passed too, as Kernel Tuner does.
        target = f"HIP_SYMBOL({argument['Name']})" if language == "HIP" else argument["Name"]
        lines.append(f"  FLEET_CHECK({api}MemcpyToSymbol({target}, h{number}, n{number} * sizeof({base})));")
        if memory == "Symbol":
            return lines, None, check
    if not gpu:
        return lines, f"({c_type} *)h{number}", check
    lines += [
        f"  {c_type} *d{number};",
        f"  FLEET_CHECK({api}Malloc((void **)&d{number}, n{number} * sizeof({base}) + 1));",
        f"  FLEET_CHECK({api}Memcpy(d{number}, h{number}, n{number} * sizeof({base}), {api}MemcpyHostToDevice));",
    ]
    return lines, f"d{number}", check


def _fill_value(argument: Mapping[str, Any], name: str, kind: str, base: str) -> str:
    """The C expression of an argument's elements (its FillType and FillValue)."""
    fill = argument.get("FillType", "Constant")
    if fill not in ("Constant", "Random"):
        raise SpecError(f"argument {name!r}: FillType {fill} is not supported (Constant and Random are)")
    constant = _literal(argument.get("FillValue", 0))
    if kind == "bool":
        return "fleet_random() > 0" if fill == "Random" else ("true" if argument.get("FillValue") else "false")
    return f"({base})fleet_random()" if fill == "Random" else f"({base}){constant}"


def _harness_timing(spec: Mapping[str, Any], arguments: str) -> list[str]:
    """main()'s launches: one to warm up, then :data:`ITERATIONS` timed into ``times``."""
    language = spec["Language"]
    api = "hip" if language == "HIP" else "cuda"
    shared = int(spec.get("SharedMemory") or 0)
    if language not in ("CUDA", "HIP"):
        launch = f"{spec['KernelName']}({arguments})"
        return [
            f"  double times[{ITERATIONS}];",
            f"  {launch};",
            f"  for (int i = 0; i < {ITERATIONS}; i++) {{",
            "    double begin = fleet_now_ms();",
            f"    {launch};",
            "    times[i] = fleet_now_ms() - begin;",
            "  }",
        ]
    launch = (
        f"{spec['KernelName']}<<<dim3(grid_size_x, grid_size_y, grid_size_z), "
        f"dim3(block_size_x, block_size_y, block_size_z), {shared}>>>({arguments})"
    )
    return [
        f"  double times[{ITERATIONS}];",
        f"  {launch};",
        f"  FLEET_CHECK({api}GetLastError());",
        f"  FLEET_CHECK({api}DeviceSynchronize());",
        f"  {api}Event_t start, stop;",
        f"  FLEET_CHECK({api}EventCreate(&start));",
        f"  FLEET_CHECK({api}EventCreate(&stop));",
        f"  for (int i = 0; i < {ITERATIONS}; i++) {{",
        f"    FLEET_CHECK({api}EventRecord(start, 0));",
        f"    {launch};",
        f"    FLEET_CHECK({api}EventRecord(stop, 0));",
        f"    FLEET_CHECK({api}EventSynchronize(stop));",
        f"    FLEET_CHECK({api}GetLastError());",
        "    float ms = 0;",
        f"    FLEET_CHECK({api}EventElapsedTime(&ms, start, stop));",
        "    times[i] = ms;",
        "  }",
    ]


def build_command(data: Mapping[str, Any], target: str, source: str, knobs: Sequence[str]) -> list[str]:
    """The build's argument list: the language's compiler, the file's options, each parameter a macro."""
    spec = data["KernelSpecification"]
    language = spec["Language"]
    options = [str(o) for o in spec.get("CompilerOptions") or []]
    defines = [f"-D{name}={{{name}}}" for name in knobs]
    if language == "CUDA":
        arch = [f"-arch={target}"] if re.fullmatch(r"sm_\d+[a-z]?", target) else []
        return ["nvcc", *arch, "-O3", *options, *defines, source, "-o", HARNESS]
    if language == "HIP":
        arch = [f"--offload-arch={target.split(':')[0]}"] if target.startswith("gfx") else []
        return ["hipcc", *arch, "-O3", *options, *defines, source, "-o", HARNESS]
    compiler = "c++" if source.endswith(".cpp") else "cc"
    return [compiler, "-O2", *options, *defines, source, "-o", HARNESS, "-lm"]


def t1_campaign(
    path: Path, data: Any, *, name: str | None = None, target: str | None = None, budget: int | None = None
) -> dict[str, Any]:
    """The fields of the :class:`~fleet.spec.CampaignSpec` of a T1 input file; see the module docstring.

    :func:`fleet.spec.load_spec`, which reads the file, makes the campaign of them (this module imports nothing of
    ``fleet.spec.campaign``, which calls it), its problems given as ``(kind, params)`` and its strategy's name
    None where the file names no search: the default for the space and budget.

    Parameters
    ----------
    path:
        The T1 file (its kernel file is looked for beside it).
    data:
        Its JSON.
    name, target, budget:
        Override the file's own (``General.BenchmarkName``, ``KernelSpecification.Device.Name``, ``Budget``).
    """
    import hashlib

    from fleet.bundle import pack
    from fleet.interop.kerneltuner import problem_size_param

    data = read_t1(path, data)
    spec = data["KernelSpecification"]
    values, space = _t1_space(data["ConfigurationSpace"])
    if target is None:
        target = _t1_target(spec)
    source_name, source = kernel_file(path, spec)
    program, program_name = harness(data, source_name, values)
    if source_name == program_name:
        raise SpecError(f"the kernel file may not be named {program_name} (Fleet's host program is)")
    files = {source_name: source, program_name: program.encode()}
    bundle = pack(files)
    digest = hashlib.sha256(bundle).hexdigest()
    workload = {
        "kind": "command",
        "bundle": digest,
        "build": build_command(data, target, program_name, list(values)),
        "artifacts": [HARNESS],
        "run": [f"./{HARNESS}"],
        "objective": {"name": "time_ms", "json": "time_ms", "goal": "min"},
        "build_timeout": 600,
        "run_timeout": 300,
    }
    if budget is None:
        budget = _t1_budget(data, space.size)
    strategy: dict[str, Any] = {} if budget is None else {"budget": budget}
    search = (data.get("Search") or {}).get("Name")
    strategy["name"] = None if search is None else _STRATEGIES.get(search)
    problem_size = problem_size_param(spec.get("ProblemSize") or [spec["GlobalSize"].get(a, "1") for a in "XYZ"])
    origin = {
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "kernel_file": source_name,
        "kernel_bundle": digest,
        "General": data.get("General") or {},
        "KernelSpecification": spec,
    }
    return {
        "name": name or (data.get("General") or {}).get("BenchmarkName") or path.stem,
        "problems": [("kernel", {"kernel_name": spec["KernelName"], "problem_size": problem_size})],
        "target": target,
        "space": space,
        "workload": workload,
        "strategy": strategy,
        "files": {digest: bundle},
        "options": {"interop": {"t1": origin}},
    }


def _t1_space(space_data: Mapping[str, Any]) -> tuple[dict[str, list[Any]], Space]:
    """A T1 ConfigurationSpace's tuning parameters' values, and the space of them and its conditions."""
    from fleet.space import Space

    values: dict[str, list[Any]] = {}
    for parameter in space_data["TuningParameters"]:
        if parameter["Name"] in values:
            raise SpecError(f"tuning parameter {parameter['Name']!r} is named twice")
        values[parameter["Name"]] = parameter_values(parameter)
    constraints = [c["Expression"] for c in space_data.get("Conditions") or []]
    space = Space.from_dict(
        {"knobs": {k: {"values": v, "build": True} for k, v in values.items()}, "constraints": constraints}
    )
    return values, space


def _t1_target(spec: Mapping[str, Any]) -> str:
    """The target a T1 kernel runs on: this machine's CPU for a C kernel, its Device.Name's for a GPU's."""
    from fleet.interop.kerneltuner import target_of_device
    from fleet.targets import cpu_target

    language = spec["Language"]
    device = (spec.get("Device") or {}).get("Name")
    if language == "C":
        return cpu_target()
    if device:
        return target_of_device(device)
    raise SpecError(f"a {language} kernel's target is not in the file (no Device.Name): give --target")


def _t1_budget(data: Mapping[str, Any], size: int) -> int | None:
    """The trials a T1 file's Budget allows in a space of ``size`` configurations (the last entry that says)."""
    budget = None
    for entry in data.get("Budget") or []:
        if entry["Type"] == "ConfigurationCount":
            budget = int(entry["BudgetValue"])
        elif entry["Type"] == "ConfigurationFraction":
            budget = max(1, math.ceil(entry["BudgetValue"] * size))
    return budget


# -- writing ------------------------------------------------------------------------------------------------


def _t1_type(values: Sequence[Any]) -> str | None:
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    if all(isinstance(v, str) for v in values):
        return "string"
    return None


def t1_document(
    space: Mapping[str, Any], options: Mapping[str, Any], strategy: Mapping[str, Any], problem: Any, target: str
) -> tuple[dict[str, Any] | None, Counter[str], list[str]]:
    """A campaign's space as a T1 input file for one of its problems.

    Returns the document (None when the space cannot be written in T1), what could not be written (reason ->
    count), and notes on what was made up (a kernel file Fleet does not have).
    """
    from fleet.interop.kerneltuner import problem_size_value

    unwritable: Counter[str] = Counter()
    notes: list[str] = []
    if options.get("space_file"):
        unwritable["constraints that are a space file's Python predicate"] += 1
    parameters = []
    for name, knob in (space.get("knobs") or {}).items():
        values = list(knob["values"] if isinstance(knob, Mapping) else knob)
        kind = _t1_type(values)
        if kind is None:
            unwritable[f"knob {name!r}: values of several types"] += 1
            continue
        parameters.append({"Name": name, "Type": kind, "Values": repr(values)})
    conditions = []
    base = space.get("base") or {}
    for text in space.get("constraints") or []:
        expression = Expression(text)
        if expression.names & set(base):
            unwritable["constraints over the space's base values"] += 1
            continue
        conditions.append({"Parameters": sorted(expression.names), "Expression": text})
    if unwritable:
        return None, unwritable, notes
    origin = (options.get("interop") or {}).get("t1")
    params = problem.params or {}
    if origin:
        kernel_spec = copy.deepcopy(origin["KernelSpecification"])
        general = dict(origin.get("General") or {})
    else:
        name = str(params.get("kernel_name") or problem.kind)
        language = "CUDA" if target.startswith("sm_") else "HIP" if target.startswith("gfx") else "C"
        suffix = {"CUDA": ".cu", "HIP": ".cpp", "C": ".c"}[language]
        names = [p["Name"] for p in parameters]
        local = {a: (f"block_size_{a.lower()}" if f"block_size_{a.lower()}" in names else "1") for a in "XYZ"}
        kernel_spec = {
            "Language": language,
            "KernelName": name,
            "KernelFile": re.sub(r"[^A-Za-z0-9._+-]+", "_", name) + suffix,
            "GlobalSizeType": "CUDA",
            "GlobalSize": {"X": "1", "Y": "1", "Z": "1"},
            "LocalSize": local,
        }
        notes.append(f"KernelFile names {kernel_spec['KernelFile']}, which Fleet does not have: put the kernel there")
        if language in EXTENSIONS:
            notes.append(f"Language {language} is Fleet's (and Kernel Tuner's), not in T1 {SCHEMA_VERSION}'s schema")
        general = {"BenchmarkName": name}
    size = problem_size_value(params.get("problem_size"))
    if isinstance(size, list):
        kernel_spec["ProblemSize"] = size
    document: dict[str, Any] = {
        "General": {**general, "FormatVersion": 1},
        "ConfigurationSpace": {"TuningParameters": parameters, "Conditions": conditions},
        "KernelSpecification": kernel_spec,
    }
    search = _KT_STRATEGIES.get(str(strategy.get("name")))
    if search:
        document["Search"] = {"Name": search}
    if strategy.get("budget"):
        document["Budget"] = [{"Type": "ConfigurationCount", "BudgetValue": int(strategy["budget"])}]
    check_t1(document)
    return document, unwritable, notes
