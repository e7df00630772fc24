"""Kernel Tuner and T4 results in and out of Fleet's store.

In: a file becomes a campaign ``import-kt-<file>-<sha256 prefix>@<target>``, done at once, whose provenance names
the file, its hash and Kernel Tuner's header; the file's kernel and problem size are its problem (kind
``kernel``); each configuration is a trial with its measurement, as MIOpen's imports store theirs
(:mod:`fleet.tuna.databases`): ``fleet best``, warm starts and reports read them like any other. A failed
configuration is an ``invalid`` trial whose reason is Kernel Tuner's failure string. Importing a file again finds
its campaign and adds nothing.

Out: every finished trial of a campaign, per problem, as :class:`~fleet.interop.kerneltuner.KTResults`, from which
the cache and T4 files are written.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fleet.canonical import digest
from fleet.errors import SpecError
from fleet.interop.kerneltuner import FAILURES, KTRecord, KTResults, problem_size_value, target_of_device
from fleet.interop.t1 import t1_document
from fleet.states import FINISHED, CampaignStatus, TrialState
from fleet.store import Campaign, Measurement, Problem, Store, Trial, trials_with_measurements, utcnow
from fleet.targets import check_target

KIND = "kernel"
"""The kind of the problems that Kernel Tuner's files bring: ``{"kernel_name", "problem_size"}``."""

_HIGHER = re.compile(r"flop|/s$|bandwidth|throughput", re.IGNORECASE)
_NO_TIMES = "kt_no_times"  # marks a record that had no ``times`` (an empty list is not the same)


@dataclass
class KTImported:
    """What one file's import did."""

    path: str
    campaign: str
    target: str
    format: str
    records: int
    invalid: int
    created: bool
    duplicates: int = 0


def objective_of(name: str) -> tuple[str, bool]:
    """Fleet's objective name and direction for Kernel Tuner's objective: ``time`` is ``time_ms``, lower is better;
    a rate (GFLOP/s, GB/s) is higher-is-better."""
    if name == "time":
        return "time_ms", False
    return name, bool(_HIGHER.search(name))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def import_kt(
    store: Store,
    path: Path,
    *,
    target: str | None = None,
    kernel: str | None = None,
    results: KTResults | None = None,
) -> KTImported:
    """Store a Kernel Tuner cache or T4 file's results as an evaluated campaign; one transaction.

    Parameters
    ----------
    path:
        The file (gzip'd too).
    target:
        The target the results are valid for; default: the one its device name gives.
    kernel:
        The kernel's name where the file does not give one (a T4 file with no cache file beside it).
    results:
        The file already read (:func:`fleet.interop.t4.read_results`).
    """
    from fleet.interop.t4 import read_results
    from fleet.store._models import CampaignProblem
    from fleet.tuna import bulk

    results = results or read_results(path)
    target = check_target(target) if target else target_of_device(results.device)
    if kernel:
        results.kernel = kernel
    if not results.kernel:
        raise SpecError(f"{path}: it names no kernel: give one with --kernel")
    if not results.records:
        raise SpecError(f"{path}: it holds no result")
    sha = _sha256(path)
    stem = path.name.removesuffix(".gz").removesuffix(".json")[:60]
    name = f"import-kt-{stem}-{sha[:12]}@{target}"
    toolchain = f"imported {stem} sha256:{sha}"
    unique: dict[str, KTRecord] = {}
    for record in results.records:
        unique.setdefault(digest(record.config), record)
    duplicates = len(results.records) - len(unique)
    invalid = sum(1 for r in unique.values() if r.error)
    source = {"source": str(path.resolve()), "file": path.name, "sha256": sha, "format": results.format}
    done = KTImported(str(path), name, target, results.format, len(unique), invalid, False, duplicates)
    now = utcnow()
    with store.transaction() as connection:
        problem = results.problem()
        ids, _ = bulk.insert_new(
            connection,
            Problem,
            ("kind", "params_key", "params", "created_at"),
            [(KIND, digest(problem), problem, now)],
            ("kind", "params_key"),
        )
        problem_id = ids[(KIND, digest(problem))]
        campaign_id = connection.scalar(
            store.insert(Campaign)
            .values(**_kt_campaign(results, name, target, sha, source, toolchain, now))
            .on_conflict_do_nothing()
            .returning(Campaign.id)
        )
        if campaign_id is None:
            return done
        connection.execute(store.insert(CampaignProblem).values(campaign_id=campaign_id, problem_id=problem_id))
        _write_kt_trials(connection, campaign_id, problem_id, target, sha, toolchain, now, unique, results)
    done.created = True
    return done


def _kt_campaign(
    results: KTResults, name: str, target: str, sha: str, source: dict[str, Any], toolchain: str, now: datetime
) -> dict[str, Any]:
    """The imported campaign's row: a grid over the file's tuning parameters, done when it is imported."""
    from fleet.provenance import provenance

    objective_name, maximize = objective_of(results.objective)
    header = {
        "device_name": results.device,
        "kernel_name": results.kernel,
        "problem_size": results.problem_size,
        "tune_params_keys": results.keys,
        "objective": results.objective,
    }
    return {
        "name": name,
        "target": target,
        "space": {
            "knobs": {k: {"values": v, "build": True} for k, v in results.tune_params.items()},
            "constraints": [],
            "base": {},
        },
        "strategy": {"name": "grid"},
        "workload": {
            "kind": "kernel_tuner",
            "imported": True,
            "objective": {"name": objective_name, "goal": "max" if maximize else "min"},
        },
        "workload_key": digest(["import-kt", sha]),
        "baseline": None,
        "options": {"interop": {"kt": header, "import": source}},
        "provenance": {**provenance(toolchain), **source, "kernel_tuner": header},
        "status": CampaignStatus.DONE,
        "created_at": now,
        "finished_at": now,
    }


def _write_kt_trials(
    connection: Any,
    campaign_id: int,
    problem_id: int,
    target: str,
    sha: str,
    toolchain: str,
    now: datetime,
    unique: dict[str, KTRecord],
    results: KTResults,
) -> None:
    """The campaign's trials, one a distinct configuration (by its config key), each finished with its
    measurement: an invalid trial and measurement for a configuration that failed."""
    from fleet.tuna import bulk

    objective_name, maximize = objective_of(results.objective)
    keys = {k: hashlib.sha256(f'["import-kt","{sha}","{k}"]'.encode()).hexdigest() for k in unique}
    trials = bulk.Rows(
        ("config", "config_key", "build_key", "measure_key", "seq", "state", "reason"),
        (
            (r.config, k, keys[k], keys[k], i, TrialState.INVALID if r.error else TrialState.EVALUATED, r.error)
            for i, (k, r) in enumerate(unique.items())
        ),
        {"problem_id": problem_id},
    )
    # Each measurement row begins with its trial's config key (insert_finished's key for it).
    measurements = bulk.Rows(
        ("measure_key", "objective", "valid", "samples", "metrics"),
        (
            (
                k,
                keys[k],
                r.value,
                r.error is None,
                r.times or [],
                {**r.extra, _NO_TIMES: True} if r.times is None else r.extra,
            )
            for k, r in unique.items()
        ),
        {
            "problem_id": problem_id,
            "objective_name": objective_name,
            "maximize": maximize,
            "device_kind": results.device or None,
        },
    )
    bulk.insert_finished(connection, campaign_id, target, toolchain, now, trials, Trial.config_key, measurements)


# -- out ------------------------------------------------------------------------------------------------------


@dataclass
class Exported:
    """One problem's results as Kernel Tuner's, and what could not be mapped (what -> how many)."""

    problem: Problem
    results: KTResults
    unmapped: Counter[str] = field(default_factory=Counter)
    t1: dict[str, Any] | None = None
    """The campaign's space as a T1 input file for this problem (None where it cannot be written in T1)."""
    t1_unwritable: Counter[str] = field(default_factory=Counter)
    t1_notes: list[str] = field(default_factory=list)
    kernel: tuple[str, bytes] | None = None
    """The kernel's file (name, content), for a campaign made from a T1 file."""


@dataclass
class FinishedTrial:
    """A finished trial with its measurement, as the exports read it."""

    id: int
    problem_id: int
    config: dict[str, Any]
    state: str
    reason: str | None
    objective: float | None
    valid: bool
    objective_name: str | None
    samples: list[Any]
    metrics: dict[str, Any]
    device: str | None
    worker: str | None
    compile_seconds: float | None
    eval_seconds: float | None
    started_at: datetime | None
    finished_at: datetime | None
    objectives: dict[str, Any]  # with several objectives, each one's value by name; empty with one


def finished_trials(store: Store, campaign_id: int, *, after: int = 0) -> list[FinishedTrial]:
    """Every finished (evaluated, invalid or errored) trial of a campaign, by id, with its measurement (its
    source trial's for a reused one)."""
    query = (
        trials_with_measurements(
            Trial.id,
            Trial.problem_id,
            Trial.config,
            Trial.state,
            Trial.reason,
            Measurement.objective,
            Measurement.valid,
            Measurement.objective_name,
            Measurement.samples,
            Measurement.metrics,
            Measurement.device_kind,
            Trial.worker,
            Trial.compile_seconds,
            Trial.eval_seconds,
            Trial.started_at,
            Trial.finished_at,
            Measurement.objectives,
        )
        .where(Trial.campaign_id == campaign_id, Trial.state.in_(FINISHED), Trial.id > after)
        .order_by(Trial.id)
    )
    with store.transaction() as connection:
        rows = connection.execute(query).all()
    return [
        FinishedTrial(
            r.id,
            r.problem_id,
            r.config,
            r.state,
            r.reason,
            r.objective,
            bool(r.valid and r.state == TrialState.EVALUATED and r.objective is not None),
            r.objective_name,
            r.samples or [],
            r.metrics or {},
            r.device_kind,
            r.worker,
            r.compile_seconds,
            r.eval_seconds,
            r.started_at,
            r.finished_at,
            r.objectives or {},
        )
        for r in rows
    ]


def _failure(trial: FinishedTrial) -> str:
    """Kernel Tuner's failure string for a trial that did not give a valid result."""
    reason = trial.reason or ""
    if reason in FAILURES:
        return reason
    if trial.state == TrialState.INVALID:
        return "InvalidConfig"
    return "CompilationFailedConfig" if re.search(r"compil|build", reason, re.IGNORECASE) else "RuntimeFailedConfig"


def _scale(objective_name: str | None) -> tuple[str, float]:
    """Kernel Tuner's objective and the factor to its unit for a Fleet objective: times are ms."""
    name = objective_name or "time_ms"
    if name in ("time_ms", "ms"):
        return "time", 1.0
    if name in ("time_s", "seconds", "time", "s"):
        return "time", 1000.0
    if name in ("time_us", "us"):
        return "time", 1e-3
    return name, 1.0


def export_kt(store: Store, campaign: Campaign) -> list[Exported]:
    """Each problem of ``campaign`` with its finished trials as Kernel Tuner's results."""
    trials = finished_trials(store, campaign.id)
    problems = store.campaign_problems(campaign.id)
    imported = (campaign.options or {}).get("interop", {}).get("kt")
    knobs = list((campaign.space or {}).get("knobs", {}))
    values = {
        k: list(v["values"] if isinstance(v, dict) else v) for k, v in (campaign.space or {}).get("knobs", {}).items()
    }
    origin = (campaign.options or {}).get("interop", {}).get("t1")
    kernel = None
    if origin:
        from fleet.bundle import unpack_files

        kernel_name = origin["kernel_file"]
        kernel = (kernel_name, unpack_files(store.get_blob(origin["kernel_bundle"]))[kernel_name])
    out = []
    for problem in problems:
        mine = [t for t in trials if t.problem_id == problem.id]
        unmapped: Counter[str] = Counter()
        names = Counter(t.objective_name for t in mine if t.objective_name)
        objective, factor = _scale(names.most_common(1)[0][0] if names else None)
        devices = Counter(t.device for t in mine if t.device)
        if imported:
            header = imported
            keys = list(header["tune_params_keys"])
            objective = header.get("objective") or "time"
            factor = 1.0
        else:
            keys = knobs or sorted({k for t in mine for k in t.config})
            header = {
                "device_name": devices.most_common(1)[0][0] if devices else campaign.target,
                "kernel_name": str(problem.params.get("kernel_name") or f"{problem.kind}-{problem.id}"),
                "problem_size": problem_size_value(problem.params.get("problem_size", [1])),
            }
        records: dict[str, KTRecord] = {}
        for trial in mine:
            if any(k not in trial.config for k in keys):
                unmapped["trials whose configuration lacks a knob"] += 1
                continue
            config = {k: trial.config[k] for k in keys}
            extra: dict[str, Any]
            times: list[Any] | None
            if imported:
                extra = dict(trial.metrics)
                times = None if extra.pop(_NO_TIMES, False) else list(trial.samples)
            else:
                extra, times = _fleet_extra(trial, factor, unmapped)
            record = KTRecord(
                config,
                None if not trial.valid else float(trial.objective) * factor,  # type: ignore[arg-type]  # a valid trial has an objective
                None if trial.valid else _failure(trial),
                times,
                extra,
            )
            key = digest(config)
            if key in records:
                unmapped["measurements of a configuration measured before (the first is kept)"] += 1
                continue
            records[key] = record
        tune_params = values or {k: sorted({r.config[k] for r in records.values()}, key=str) for k in keys}
        results = KTResults(
            device=str(header.get("device_name") or ""),
            kernel=str(header.get("kernel_name") or ""),
            problem_size=header.get("problem_size"),
            keys=keys,
            tune_params={k: tune_params[k] for k in keys},
            objective=objective,
            records=list(records.values()),
        )
        document, unwritable, notes = t1_document(
            campaign.space or {}, campaign.options or {}, campaign.strategy or {}, problem, campaign.target
        )
        out.append(Exported(problem, results, unmapped, document, unwritable, notes, kernel))
    return out


def _fleet_extra(trial: FinishedTrial, factor: float, unmapped: Counter[str]) -> tuple[dict[str, Any], list[Any]]:
    """A Fleet trial's timings and metrics as Kernel Tuner's record fields (ms)."""
    extra: dict[str, Any] = {
        "compile_time": (trial.compile_seconds or 0.0) * 1000.0,
        "verification_time": 0,
        "benchmark_time": (trial.eval_seconds or 0.0) * 1000.0,
        "strategy_time": 0,
        "framework_time": 0,
    }
    if trial.finished_at is not None:
        extra["timestamp"] = trial.finished_at.isoformat()
    # Several objectives: the record's objective is the first; each one is a field under its name, as measured.
    extra.update(trial.objectives)
    for name, value in trial.metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            extra.setdefault(name, value)
        else:
            unmapped[f"metric {name!r} (not a number)"] += 1
    times = [s * factor for s in trial.samples if isinstance(s, (int, float))]
    if len(times) != len(trial.samples):
        unmapped["samples that are not numbers"] += 1
    return extra, times


def device_file_stem(results: KTResults, target: str) -> str:
    """``<device>`` of ``<device>.json``: the device's name with what a file name cannot hold replaced."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", results.device or target).strip("_") or target


def problem_dir(exported: Exported) -> str:
    """The folder of one problem's files: its kernel's name (and id, which keeps two problems apart)."""
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", exported.results.kernel).strip("_") or exported.problem.kind
    return f"{name}-{exported.problem.id}"


def write_kt(exports: Sequence[Exported], directory: Path, target: str) -> list[Path]:
    """Write each problem's cache and T4 files under ``directory/<kernel>-<problem id>/``; every text is made
    before the first is written, so an error writes nothing."""
    import json

    from fleet.interop.kerneltuner import dumps_cache
    from fleet.interop.t4 import t4_document

    texts: list[tuple[Path, str]] = []
    for exported in exports:
        folder = directory / problem_dir(exported)
        stem = device_file_stem(exported.results, target)
        texts.append((folder / f"{stem}.json", dumps_cache(exported.results)))
        texts.append((folder / f"{stem}_T4.json", json.dumps(t4_document(exported.results))))
    for path, text in texts:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return [p for p, _ in texts]


def write_t1(exports: Sequence[Exported], directory: Path) -> list[Path]:
    """Write each problem's T1 input file (``<kernel>_T1.json``, and the kernel's file when Fleet has it) beside
    its cache file; the paths of the T1 files written."""
    import json

    written = []
    for exported in exports:
        if exported.t1 is None:
            continue
        folder = directory / problem_dir(exported)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{problem_dir(exported).rpartition('-')[0]}_T1.json"
        path.write_text(json.dumps(exported.t1, indent=2) + "\n")
        if exported.kernel is not None:
            (folder / exported.kernel[0]).write_bytes(exported.kernel[1])
        written.append(path)
    return written
