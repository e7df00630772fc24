"""Kernel Tuner's cache files, read and written as Kernel Tuner 1.5 does (``kernel_tuner.util.process_cache``).

A cache file is one JSON object: ``device_name``, ``kernel_name``, ``problem_size``, ``tune_params_keys``,
``tune_params`` (knob -> values), ``objective`` and ``cache``, a map from the comma-joined ``str()`` of a
configuration's values (in ``tune_params_keys`` order) to its record: every knob's value, ``time`` (ms) and
``times`` (the repeats, ms), ``compile_time``, ``verification_time``, ``benchmark_time``, ``strategy_time``,
``framework_time`` (ms), ``timestamp``, and any metric. A configuration that failed holds one of Kernel Tuner's
failure strings (:data:`FAILURES`) where its objective would be.

Kernel Tuner appends to its cache as it tunes and closes it at the end, so a run that was cut short leaves a file
without its closing braces (and with a trailing comma): :func:`read_cache` reads those as Kernel Tuner does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.errors import SpecError
from fleet.files import read_text

FAILURES = ("InvalidConfig", "CompilationFailedConfig", "RuntimeFailedConfig", "ErrorConfig")
"""Kernel Tuner's failure strings (``kernel_tuner.util.ErrorConfig`` and its subclasses, as cache files spell
them)."""

TIMINGS = ("compile_time", "verification_time", "benchmark_time", "strategy_time", "framework_time")
"""A record's own timings, in ms."""

HEADER = ("device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params", "objective", "cache")

# Kernel Tuner names a device as its runtime does (CUDA's device name, HIP's marketing name, OpenCL's device
# name). Fleet's targets are architectures: sm_<compute capability>, gfx<arch>:<compute units>. First match wins.
_DEVICES: tuple[tuple[str, str], ...] = (
    (r"\bH100\b|\bH200\b|\bGH200\b", "sm_90"),
    (r"\bL4\b|\bL40S?\b|RTX 40[5-9]0|RTX [0-9]000 Ada", "sm_89"),
    (r"\bA100\b|\bA30\b", "sm_80"),
    (r"\bA10G?\b|\bA40\b|\bA[2-6]000\b|RTX 30[5-9]0|\bA16\b|\bA2\b", "sm_86"),
    (r"RTX 20[6-8]0|TITAN RTX|\bT4\b|Quadro RTX", "sm_75"),
    (r"\bV100\b|TITAN V\b", "sm_70"),
    (r"GTX 10[5-8]0|TITAN Xp|\bP40\b|\bP4\b", "sm_61"),
    (r"\bP100\b", "sm_60"),
    (r"MI300X", "gfx942:304"),
    (r"MI300A", "gfx942:228"),
    (r"MI250X", "gfx90a:110"),
    (r"MI250\b", "gfx90a:104"),
    (r"MI210", "gfx90a:104"),
    (r"MI100", "gfx908:120"),
    (r"MI50|MI60", "gfx906:60"),
    (r"W6600", "gfx1032:28"),
    (r"W6800|RX 6800 XT", "gfx1030:60"),
    (r"RX 7900 XTX", "gfx1100:96"),
)


def target_of_device(device: str) -> str:
    """Fleet's target for a device named as Kernel Tuner names it.

    Raises
    ------
    SpecError
        When the device is not one Fleet knows; the caller says which target with ``--target``.
    """
    for pattern, target in _DEVICES:
        if re.search(pattern, device):
            return target
    raise SpecError(f"unknown device name {device!r}: give its target with --target (e.g. sm_86, gfx90a:104)")


def cache_key(config: dict[str, Any], keys: list[str]) -> str:
    """A configuration's key in a cache file: ``str()`` of its values in ``keys`` order, comma-joined."""
    return ",".join(str(config[k]) for k in keys)


@dataclass
class KTRecord:
    """One configuration's result.

    Parameters
    ----------
    config:
        The knobs' values.
    value:
        The objective's value, or None when the configuration failed (``error`` says how).
    error:
        One of :data:`FAILURES`, or None.
    times:
        The repeats (ms); None where the file had none.
    extra:
        Every other field of the record (timings in ms, timestamp, metrics), as the file spelt it.
    """

    config: dict[str, Any]
    value: float | None
    error: str | None = None
    times: list[Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class KTResults:
    """The results of one kernel on one device: a cache file's content (or a T4 file's, with a made-up header)."""

    device: str
    kernel: str
    problem_size: Any
    keys: list[str]
    tune_params: dict[str, list[Any]]
    objective: str
    records: list[KTRecord]
    format: str = "cache"

    def problem(self) -> dict[str, Any]:
        """The Fleet problem these are results of: the kernel and its problem size (see :func:`problem_size_param`)."""
        return {"kernel_name": self.kernel, "problem_size": problem_size_param(self.problem_size)}


def problem_size_param(size: Any) -> Any:
    """Kernel Tuner's ``problem_size`` as a problem parameter, which is a scalar: a list of sizes comma-joined
    (``[4096, 4096]`` is ``"4096,4096"``, as ``--param problem_size=4096,4096`` gives it), anything else as it is. A
    T1 file's ``ProblemSize`` is the same parameter, so its campaigns and imported results share their problem."""
    if isinstance(size, (list, tuple)):
        return ",".join(str(s) for s in size)
    return size


def problem_size_value(param: Any) -> Any:
    """The ``problem_size`` of a problem parameter (:func:`problem_size_param` undone): a list of integers where the
    text is comma-joined integers."""
    if isinstance(param, str) and re.fullmatch(r"\d+(,\d+)*", param):
        return [int(s) for s in param.split(",")]
    return param


def loads_open(text: str, path: Path) -> Any:
    """JSON text, closing what a run cut short left open as Kernel Tuner does (``util.correct_open_cache``):
    a trailing comma dropped, the cache's and the file's braces added."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        first = error
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply") from None
    body = text.strip().removesuffix(",")
    for ending in ("}\n}", "}"):
        try:
            return json.loads(body + ending)
        except json.JSONDecodeError:
            continue
        except RecursionError:
            raise SpecError(f"{path}: nested too deeply") from None
    raise SpecError(f"{path}: not JSON ({first.msg} at line {first.lineno} column {first.colno})")


def failure_of(record: dict[str, Any]) -> str | None:
    """The failure string a record holds in any field (Kernel Tuner's ``read_cache`` looks at every one)."""
    for value in record.values():
        if isinstance(value, str) and value in FAILURES:
            return value
    return None


def parse_cache(data: Any, path: Path) -> KTResults:
    """A cache file's JSON as :class:`KTResults`, checked: every entry's key must be its configuration's."""
    if not isinstance(data, dict) or not isinstance(data.get("cache"), dict):
        raise SpecError(f"{path}: not a Kernel Tuner cache file (no 'cache' object)")
    keys, params = data.get("tune_params_keys"), data.get("tune_params")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or not isinstance(params, dict):
        raise SpecError(f"{path}: a Kernel Tuner cache file needs 'tune_params_keys' (names) and 'tune_params'")
    if set(keys) != set(params):
        raise SpecError(f"{path}: 'tune_params_keys' {keys} are not the keys of 'tune_params' {list(params)}")
    objective = data.get("objective") or "time"
    if not isinstance(objective, str):
        raise SpecError(f"{path}: several objectives ({objective}) cannot be imported; one is expected")
    records = []
    for key, entry in data["cache"].items():
        if not isinstance(entry, dict):
            raise SpecError(f"{path}: the entry {key!r} is not an object")
        missing = [k for k in keys if k not in entry]
        if missing:
            raise SpecError(f"{path}: the entry {key!r} lacks parameter {missing[0]!r}")
        config = {k: entry[k] for k in keys}
        if cache_key(config, keys) != key:
            raise SpecError(
                f"{path}: the entry {key!r} does not match its parameters (they give {cache_key(config, keys)!r})"
            )
        error = failure_of(entry)
        value = entry.get(objective)
        if error is not None:
            value = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: the entry {key!r} has no numeric {objective!r} and no failure string")
        else:
            value = float(value)
        rest = {k: v for k, v in entry.items() if k not in config and k not in (objective, "times")}
        times = entry.get("times")
        records.append(KTRecord(config, value, error, times, rest))
    return KTResults(
        device=str(data.get("device_name") or ""),
        kernel=str(data.get("kernel_name") or ""),
        problem_size=data.get("problem_size"),
        keys=list(keys),
        tune_params={k: list(params[k]) for k in keys},
        objective=objective,
        records=records,
    )


def read_cache(path: Path) -> KTResults:
    """A Kernel Tuner cache file (gzip'd too), read as Kernel Tuner reads it; :class:`SpecError` if it is not one."""
    return parse_cache(loads_open(read_text(path), path), path)


def record_dict(record: KTRecord, objective: str) -> dict[str, Any]:
    """A record as a cache file holds it: knobs, the objective (or the failure string), ``times``, the rest."""
    out: dict[str, Any] = dict(record.config)
    out[objective] = record.error if record.error else record.value
    if record.times is not None:
        out["times"] = record.times
    for key, value in record.extra.items():
        out.setdefault(key, value)
    return out


def cache_document(results: KTResults) -> dict[str, Any]:
    """The JSON object of a cache file, closed (Kernel Tuner reads it as it is and can append to it)."""
    return {
        "device_name": results.device,
        "kernel_name": results.kernel,
        "problem_size": results.problem_size,
        "tune_params_keys": results.keys,
        "tune_params": results.tune_params,
        "objective": results.objective,
        "cache": {cache_key(r.config, results.keys): record_dict(r, results.objective) for r in results.records},
    }


def dumps_cache(results: KTResults) -> str:
    """A cache file's text laid out as Kernel Tuner writes it: the header indented, one record a line."""
    document = cache_document(results)
    entries = document.pop("cache")
    head = json.dumps({**document, "cache": {}}, indent="")[: -len("{}\n}")]
    lines = [json.dumps({k: v})[1:-1] for k, v in entries.items()]
    return head + "{\n" + ",\n".join(lines) + "\n}\n}\n"
