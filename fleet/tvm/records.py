"""Measured TVM configurations as JSON lines: exported from one site's database, imported into another's.

One line per measurement::

    {"problem": {"kind": "tvm.dense", "params": {...}}, "target": "cpu-x86_64", "knobs": {...},
     "time_s": 0.0012, "gflops": 41.2, "valid": true, "samples": [...],
     "provenance": {"toolchain": "tvm 0.27.0 llvm 22", "node": "n1", "gpu": null,
                    "device": "AMD EPYC 7763 64-Core Processor (x86_64, 128 cores)", "worker": "eval-cpu0@n1",
                    "measured_at": "2026-11-21T20:00:00", "campaign": "..."}}

Lines are sorted, so an export of the same measurements is the same file (fit for version control). An import
checks every line before it writes anything, then records each measurement as an evaluated trial of an import
campaign (one per problem, target and toolchain), so :func:`fleet.tvm.best.best` and ``fleet best`` see it.
Importing the same records twice adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from sqlalchemy import select

from fleet.canonical import canonical_json, digest
from fleet.errors import NotFound, SpecError
from fleet.space import check_value
from fleet.states import CampaignStatus, TrialState
from fleet.trust import Trusted, choose, resolve
from fleet.tvm.operators import KINDS, OPS, check_problem
from fleet.tvm.spaces import space_for

IMPORTER = "fleet-tvm-import"
ALL_CAMPAIGNS = Trusted(None)


class RecordError(SpecError):
    """A records file line that is not a measured TVM configuration."""


def records(store: Any, target: str | None = None, trusted: Trusted | None = ALL_CAMPAIGNS) -> Iterator[dict[str, Any]]:
    """Every measurement of a TVM problem (on ``target``, or all) by the campaigns ``trusted`` names, as record
    dicts, in a stable order.

    Parameters
    ----------
    trusted:
        The campaigns to draw on (fleet.trust's rule; every one by default, as an import's check of what is there
        needs); None: the one campaign that measured any, several refused in one line.
    """
    from fleet.store import Campaign, Measurement, Problem, Trial

    query = (
        select(Measurement, Trial.config, Problem.kind, Problem.params, Campaign.name, Campaign.id)
        .join(Trial, Trial.id == Measurement.trial_id)
        .join(Problem, Problem.id == Measurement.problem_id)
        .join(Campaign, Campaign.id == Trial.campaign_id)
        .where(Problem.kind.in_(KINDS))
    )
    if target is not None:
        query = query.where(Measurement.target == target)
    with store.session() as session:
        rows = session.execute(query).all()
    resolve(store, trusted)
    measured = {row[5]: row[4] for row in rows}
    drawn = set(choose(f"the export of TVM records{f' on {target}' if target else ''}", measured, trusted))
    out = []
    for m, config, kind, params, campaign, campaign_id in rows:
        if campaign_id not in drawn:
            continue
        metrics = m.metrics or {}
        out.append(
            {
                "problem": {"kind": kind, "params": params},
                "target": m.target,
                "knobs": config,
                "time_s": metrics.get("time_s"),
                "gflops": metrics.get("gflops", m.objective),
                "valid": bool(m.valid),
                "samples": list(m.samples or []),
                "provenance": {
                    "toolchain": m.toolchain,
                    "node": m.node,
                    "gpu": m.gpu,
                    "device": m.device,
                    "worker": m.worker,
                    "measured_at": metrics.get("measured_at") or m.created_at.isoformat(timespec="seconds"),
                    "campaign": metrics.get("campaign") or campaign,
                },
            }
        )
    # The same measurement, re-imported, is one line: its content decides, not the database it came through.
    unique = {canonical_json(r): r for r in out}
    yield from (unique[key] for key in sorted(unique))


def export_records(
    store: Any, out: IO[str], target: str | None = None, trusted: Trusted | None = ALL_CAMPAIGNS
) -> tuple[int, list[str]]:
    """Write the TVM measurements (on ``target``, or all) of the campaigns ``trusted`` names (see :func:`records`)
    to ``out`` as JSON lines; how many, and the campaigns they came from."""
    count = 0
    campaigns: set[str] = set()
    for record in records(store, target, trusted):
        out.write(canonical_json(record) + "\n")
        campaigns.add(record["provenance"]["campaign"])
        count += 1
    return count, sorted(campaigns)


def parse_records(lines: Iterable[str], where: str = "records") -> list[dict[str, Any]]:
    """Check and parse record lines; :class:`RecordError` names the first bad line."""
    parsed = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            parsed.append(_check(record))
        except (json.JSONDecodeError, SpecError, TypeError, KeyError, ValueError) as error:
            raise RecordError(f"{where} line {number}: {error}") from None
    return parsed


def _check(record: Any) -> dict[str, Any]:
    from fleet.targets import check_target

    if not isinstance(record, dict):
        raise ValueError("a record is a JSON object")
    problem = record.get("problem")
    if not isinstance(problem, dict) or not isinstance(problem.get("params"), dict):
        raise ValueError('\'problem\' must be {"kind": ..., "params": {...}}')
    if not isinstance(record.get("knobs"), dict):
        raise ValueError("'knobs' must be an object of knob values")
    kind: Any = problem.get("kind")  # check_problem says what is wrong with it
    params = check_problem(kind, problem["params"])
    target = check_target(record["target"])
    space = space_for(kind, params, target)
    knobs = space.check(record["knobs"])
    if record.get("valid") and not space.is_valid(knobs):
        raise ValueError(f"knobs {knobs} break the constraints of the {kind} space")
    gflops = record.get("gflops")
    if gflops is not None:
        check_value("gflops", gflops)
    samples = record.get("samples", [])
    if not isinstance(samples, list) or not all(isinstance(s, int | float) for s in samples):
        raise ValueError("'samples' must be a list of numbers")
    provenance = record.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise ValueError("'provenance' must be an object")
    return {**record, "problem": {"kind": kind, "params": params}, "knobs": knobs, "provenance": provenance}


def import_records(store: Any, parsed: list[dict[str, Any]], source: str = "records") -> tuple[int, int]:
    """Record parsed records (see :func:`parse_records`) in the store; return (added, already there)."""
    from fleet.keys import trial_keys
    from fleet.provenance import provenance as submit_provenance
    from fleet.store import NewTrial

    # A record this database already holds (exported from it, or imported before) is not added again.
    known = {canonical_json(record) for record in records(store)}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    present = 0
    for record in parsed:
        if canonical_json(record) in known:
            present += 1
            continue
        key = (canonical_json(record["problem"]), record["target"], str(record["provenance"].get("toolchain", "")))
        groups.setdefault(key, []).append(record)
    added = 0
    owner = f"{IMPORTER}/{source}"
    for (problem_json, target, toolchain), group in sorted(groups.items()):
        problem = json.loads(problem_json)
        kind, params = problem["kind"], problem["params"]
        problem_id = store.add_problem(kind, params, ["imported"])
        space = space_for(kind, params, target)
        campaign = store.create_campaign(
            name=f"tvm-import-{digest([problem, target, toolchain])[:16]}",
            target=target,
            problem_ids=[problem_id],
            space=space.to_dict(),
            strategy={"name": "imported"},
            workload={"kind": "tvm", "op": OPS[kind]},
            options={},
            provenance={**submit_provenance(toolchain), "argv": []},
            baseline=None,
        )
        news = []
        for seq, record in enumerate(group):
            build_key, measure_key = trial_keys(campaign, problem_id, record["knobs"], space)
            news.append(NewTrial(problem_id, record["knobs"], build_key, measure_key, seq))
        created = store.add_trials(campaign.id, target, news)
        for record, (trial_id, state) in zip(group, created, strict=True):
            if state != TrialState.NEW or store.claim(trial_id, "compile", owner, 600, 1) is None:
                present += 1
                continue
            info = record["provenance"]
            metrics = {
                "time_s": record.get("time_s"),
                "gflops": record.get("gflops"),
                "correct": bool(record.get("valid")),
                "measured_at": info.get("measured_at"),
                "campaign": info.get("campaign"),
                "imported_from": source,
            }
            store.record(
                trial_id,
                owner,
                state=TrialState.EVALUATED if record.get("valid") else TrialState.INVALID,
                reason=None if record.get("valid") else "imported as invalid",
                measurement={
                    "objective_name": "gflops",
                    "maximize": True,
                    "objective": record.get("gflops"),
                    "valid": bool(record.get("valid")),
                    "samples": record.get("samples", []),
                    "metrics": metrics,
                    "toolchain": toolchain,
                    "node": info.get("node"),
                    "gpu": info.get("gpu"),
                    "device": info.get("device"),
                    "worker": info.get("worker"),
                },
            )
            added += 1
        store.set_campaign_status(campaign.id, CampaignStatus.DONE)
    return added, present


def read_records(path: Path) -> list[dict[str, Any]]:
    """Parse a records file."""
    from fleet.files import read_text

    try:
        text = read_text(path)
    except NotFound as error:
        raise RecordError(str(error)) from None
    return parse_records(text.splitlines(), str(path))
