"""T4, the autotuning community's results format (``kernel_tuner/schema/T4/1.0.0/results-schema.json``).

A T4 file is ``{"schema_version": "1.0.0", "metadata": {"timeunit": ...}, "results": [...]}``; each result has the
``configuration``, ``times`` (``compilation``, ``benchmark``, ``framework``, ``search_algorithm``, ``validation``
and the ``runtimes`` samples), ``invalidity`` (``correct``, ``compile``, ``runtime``, ``constraints``, ``timeout``,
``correctness``), ``correctness``, ``objectives`` (names) and ``measurements`` (name, value, unit). Fleet writes it
as Kernel Tuner's ``file_utils.get_t4_results`` does, and reads what ``autotuning_methodology`` reads: the times
under ``compilation`` (the schema's own ``compilation_time`` is read too), in ``metadata.timeunit`` (seconds when
absent), which Fleet writes as milliseconds.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.errors import SpecError
from fleet.files import read_text
from fleet.interop.kerneltuner import KTRecord, KTResults, loads_open

SCHEMA_VERSION = "1.0.0"

# T4's time names -> Kernel Tuner's record fields (ms).
TIME_FIELDS = {
    "compilation": "compile_time",
    "benchmark": "benchmark_time",
    "framework": "framework_time",
    "search_algorithm": "strategy_time",
    "validation": "verification_time",
}
# Kernel Tuner's failure strings <-> T4's invalidity.
INVALIDITY = {
    "CompilationFailedConfig": "compile",
    "RuntimeFailedConfig": "runtime",
    "InvalidConfig": "constraints",
    "ErrorConfig": "runtime",
}
FAILURE_OF = {"compile": "CompilationFailedConfig", "runtime": "RuntimeFailedConfig", "constraints": "InvalidConfig"}
_SCALE = {"seconds": 1000.0, "milliseconds": 1.0, "microseconds": 1e-3, "nanoseconds": 1e-6}


@lru_cache(maxsize=1)
def results_schema() -> dict[str, Any]:
    """T4's results schema, as Kernel Tuner ships it (the copy Fleet validates against)."""
    from importlib.resources import files

    try:
        text = files("kernel_tuner").joinpath("schema/T4/1.0.0/results-schema.json").read_text()
    except ModuleNotFoundError:
        raise SpecError("reading T4 needs Kernel Tuner's schema: pip install 'fleet-tune[kerneltuner]'") from None
    return json.loads(text)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _surely_valid(row: Any) -> bool:
    """True only for a result that T4's results schema accepts: checked by hand, since ``jsonschema`` takes
    seconds over the tens of thousands of results of one file. What this cannot vouch for goes to ``jsonschema``."""
    if not isinstance(row, dict) or not {"configuration", "times", "invalidity", "correctness"} <= row.keys():
        return False
    times, measurements = row["times"], row.get("measurements", [])
    return (
        isinstance(row["configuration"], dict)
        and isinstance(times, dict)
        and all(
            _number(times[k]) for k in ("compilation_time", "framework", "search_algorithm", "validation") if k in times
        )
        and isinstance(times.get("runtimes", []), list)
        and row["invalidity"] in _INVALIDITIES
        and _number(row["correctness"])
        and isinstance(row.get("timestamp", ""), str)
        and isinstance(row.get("objectives", []), list)
        and isinstance(measurements, list)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("name", ""), str)
            and isinstance(m.get("unit", ""), str)
            and (_number(m.get("value", 0)) or isinstance(m.get("value"), (str, list)))
            for m in measurements
        )
    )


_INVALIDITIES = ("timeout", "compile", "runtime", "correctness", "constraints", "correct")


def check_t4(data: Any, path: Path | str) -> None:
    """Raise :class:`SpecError` naming the first place where ``data`` breaks T4's results schema."""
    from fleet.extras import require

    require("jsonschema", "reading T4")
    import jsonschema

    version = data.get("schema_version", "1.0.0") if isinstance(data, dict) else None
    rows = data.get("results") if isinstance(data, dict) else None
    if not (isinstance(version, str) and isinstance(rows, list) and all(_surely_valid(r) for r in rows)):
        validator = jsonschema.Draft202012Validator(results_schema())
        error = jsonschema.exceptions.best_match(validator.iter_errors(data))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the top"
            raise SpecError(f"{path}: not a T4 results file: {error.message} (at {where})")
    if not isinstance(rows, list):
        raise SpecError(f"{path}: not a T4 results file: it has no 'results' list")


def t4_document(results: KTResults) -> dict[str, Any]:
    """The T4 results of ``results``, as Kernel Tuner would have written them."""
    out = []
    params = set(results.keys)
    for record in results.records:
        row: dict[str, Any] = {}
        if "timestamp" in record.extra:
            row["timestamp"] = record.extra["timestamp"]
        row["configuration"] = dict(record.config)
        times: dict[str, Any] = {t4: record.extra[kt] for t4, kt in TIME_FIELDS.items() if kt in record.extra}
        times["runtimes"] = list(record.times or [])
        row["times"] = times
        row["invalidity"] = INVALIDITY.get(record.error, "runtime") if record.error else "correct"
        row["correctness"] = 1
        measured = {results.objective: record.error or record.value}
        measured.update((k, v) for k, v in record.extra.items() if k not in TIME_FIELDS.values() and k != "timestamp")
        row["measurements"] = [
            {"name": k, "value": v, "unit": "ms" if k.startswith("time") else ""}
            for k, v in measured.items()
            if k not in params
        ]
        row["objectives"] = [results.objective]
        out.append(row)
    return {"results": out, "schema_version": SCHEMA_VERSION, "metadata": {"timeunit": "milliseconds"}}


def parse_t4(data: Any, path: Path, header: KTResults | None = None) -> KTResults:
    """A T4 file's results as :class:`KTResults`.

    T4 names neither the device nor the kernel nor the knobs' values: they come from ``header`` (the cache file
    beside it, when there is one), else the knobs from the configurations in their order of appearance, and
    the device from the file's name (``<device>_T4.json``).
    """
    check_t4(data, path)
    scale = _SCALE.get(str((data.get("metadata") or {}).get("timeunit", "seconds")).lower())
    if scale is None:
        raise SpecError(f"{path}: unknown metadata.timeunit {data['metadata']['timeunit']!r}")
    records: list[KTRecord] = []
    objectives: set[str] = set()
    seen: dict[str, list[Any]] = {}
    for number, row in enumerate(data["results"]):
        config = row["configuration"]
        for key, value in config.items():
            values = seen.setdefault(key, [])
            if value not in values:
                values.append(value)
        names = row.get("objectives") or ["time"]
        if len(names) != 1:
            raise SpecError(f"{path}: result {number} has {len(names)} objectives; one is expected")
        objective = names[0]
        objectives.add(objective)
        measured = {m.get("name"): m.get("value") for m in row.get("measurements") or []}
        extra: dict[str, Any] = {}
        if "timestamp" in row:
            extra["timestamp"] = row["timestamp"]
        times = dict(row["times"])
        if "compilation_time" in times and "compilation" not in times:
            times["compilation"] = times.pop("compilation_time")
        for t4, kt in TIME_FIELDS.items():
            if t4 in times:
                extra[kt] = _scaled(times[t4], scale)
        extra.update((k, v) for k, v in measured.items() if k is not None and k != objective)
        invalidity = row["invalidity"]
        error = None if invalidity == "correct" else FAILURE_OF.get(invalidity, "RuntimeFailedConfig")
        value = measured.get(objective)
        if error is not None:
            value = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: result {number} is correct but has no numeric {objective!r} measurement")
        else:
            value = float(value)
        samples = [_scaled(t, scale) for t in times.get("runtimes", [])]
        records.append(KTRecord(dict(config), value, error, samples, extra))
    if len(objectives) > 1:
        raise SpecError(f"{path}: its results have different objectives ({', '.join(sorted(objectives))})")
    keys = header.keys if header else list(seen)
    for number, record in enumerate(records):
        if list(record.config) != keys and set(record.config) != set(keys):
            raise SpecError(f"{path}: result {number}'s configuration has knobs {list(record.config)}, not {keys}")
    device = header.device if header else path.name.removesuffix(".json").removesuffix("_T4").replace("_", " ")
    return KTResults(
        device=device,
        kernel=header.kernel if header else "",
        problem_size=header.problem_size if header else None,
        keys=keys,
        tune_params=header.tune_params if header else seen,
        objective=objectives.pop() if objectives else (header.objective if header else "time"),
        records=records,
        format="t4",
    )


def _scaled(value: Any, scale: float) -> Any:
    if scale == 1.0 or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value * scale


def is_t4(data: Any) -> bool:
    """Whether parsed JSON looks like a T4 results file rather than a cache file."""
    return isinstance(data, dict) and "results" in data and "cache" not in data


def read_results(path: Path) -> KTResults:
    """A Kernel Tuner cache file or a T4 results file (gzip'd too), by its content.

    A T4 file ``<device>_T4.json`` takes its header from the cache file ``<device>.json`` beside it, when there
    is one.
    """
    from fleet.interop.kerneltuner import parse_cache

    data = loads_open(read_text(path), path)
    if not is_t4(data):
        return parse_cache(data, path)
    header = None
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    if stem.endswith("_T4"):
        twin = path.with_name(stem.removesuffix("_T4") + ".json")
        if twin.is_file():
            header = parse_cache(loads_open(read_text(twin), twin), twin)
    return parse_t4(data, path, header)
