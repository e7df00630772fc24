"""Exports of what a campaign did, for people and other tools.

``steps_csv`` writes one row per trial (per chain step, for annealing chains on the fleet) with its
execution statistics: the problem (its id and its parameters), configuration, objective and every sample (with
several objectives, each one in a column of its name after ``objective``), build and step times, where it ran, and
what it was built and measured with (the build worker's toolchain, the evaluation worker's device), and, for a trial
proposed from history, its rank and score there.
"""

from __future__ import annotations

import csv
from typing import IO, Any

from fleet.labels import params_label
from fleet.space import Space
from fleet.states import TrialState
from fleet.store import Artifact, Campaign, Measurement, Store, Trial, trials_with_measurements

COLUMNS = [
    "problem",
    "problem_params",  # what the problem is (n=512): its id alone says nothing to a reader of the file
    "chain",
    "step",
    "trial",
    "state",
    "accepted",
    "temperature",
    "objective_name",
    "objective",
    "samples",
    "best_so_far",
    "build_seconds",
    "compile_seconds",
    "eval_seconds",
    "step_seconds",
    "worker",
    "node",
    "toolchain",
    "device",
    "started_at",
    "finished_at",
    "reason",
    "history_rank",
    "history_score",
]


def _trials(store: Store, campaign: Campaign) -> dict[int, dict[str, Any]]:
    # A trial that reused an earlier measurement reports that measurement.
    with store.session() as session:
        rows = session.execute(
            trials_with_measurements(Trial, Measurement, Artifact.build_seconds)
            # The artifact its own compile took: a build key has one artifact per toolchain that built it.
            .outerjoin(Artifact, (Artifact.build_key == Trial.build_key) & (Artifact.toolchain == Trial.toolchain))
            .where(Trial.campaign_id == campaign.id)
            .order_by(Trial.id)
        ).all()
    return {
        t.id: {
            "trial": t.id,
            "problem": t.problem_id,
            "state": t.state,
            "config": t.config,
            "reason": t.reason or "",
            "objective_name": m.objective_name if m else "",
            "objective": m.objective if m else None,
            "objectives": (m.objectives or {}) if m else {},
            "samples": ";".join(f"{x:.6g}" for x in m.samples) if m else "",
            "worker": m.worker if m else "",
            "node": m.node if m else "",
            # The measurement's: a reused trial reports what its source was built and measured with.
            "toolchain": m.toolchain if m else (t.toolchain or ""),
            "device": (m.device or "") if m else "",
            "build_seconds": build,
            # Its own slots' time: a trial that reused a measurement took its worker only the finding of it.
            "compile_seconds": t.compile_seconds,
            "eval_seconds": t.eval_seconds,
            "started_at": t.started_at,
            "finished_at": t.finished_at,
            "step_seconds": (t.finished_at - t.started_at).total_seconds() if t.finished_at and t.started_at else None,
            # Proposed from history: its rank and score there (fleet trial ID has its sources).
            "history_rank": (t.history or {}).get("rank", ""),
            "history_score": (t.history or {}).get("score", ""),
        }
        for t, m, build in rows
    }


def steps_csv(store: Store, campaign: Campaign, out: IO[str]) -> int:
    """Write the campaign's steps as CSV to ``out``; return the number of rows."""
    from fleet.spec.workloads import load_workload_spec

    knobs = Space.from_dict(campaign.space).names
    workload = load_workload_spec(campaign.workload)
    maximize = workload.maximize
    # Several objectives: a column each, named as the objective unless a column of that name is there already.
    taken = {*COLUMNS, *knobs}
    named = [o.name for o in workload.objectives] if len(workload.objectives) > 1 else []
    columns = {name: name if name not in taken else f"objective_{name}" for name in named}
    trials = _trials(store, campaign)
    chain_steps = store.chain_steps(campaign.id)
    rows: list[dict[str, Any]] = []
    if chain_steps:
        for chain, step in chain_steps:
            row = dict(trials[step.trial_id])
            row |= {
                "problem": chain.problem_id,
                "chain": chain.index,
                "step": step.step,
                "config": step.config,
                "accepted": step.accepted,
                "temperature": step.temperature,
                "step_seconds": step.seconds,
                "worker": step.worker,
            }
            rows.append(row)
    else:
        for number, row in enumerate(trials.values()):
            rows.append({**row, "chain": "", "step": number, "accepted": "", "temperature": ""})
    best: dict[tuple[Any, Any], float] = {}
    samples = COLUMNS.index("samples")  # the objectives before it, the knobs after it
    fields = [*COLUMNS[:samples], *columns.values(), "samples", *knobs, *COLUMNS[samples + 1 :]]
    params = {p.id: params_label(p.params or {}) for p in store.campaign_problems(campaign.id)}
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        key = (row["problem"], row["chain"])
        value = row["objective"] if row["state"] == TrialState.EVALUATED else None
        if value is not None and (key not in best or (value > best[key] if maximize else value < best[key])):
            best[key] = value
        measured = {column: row["objectives"].get(name, "") for name, column in columns.items()}
        shown = {"problem_params": params.get(row["problem"], ""), "best_so_far": best.get(key, "")}
        writer.writerow({**row, **measured, **row["config"], **shown})
    return len(rows)
