"""``fleet export mlflow``: a campaign as MLflow runs, on the tracking server MLflow's own environment names
(``MLFLOW_TRACKING_URI``; MLflow's default where unset).

The campaign is one parent run (its target, strategy, workload and status as params and tags); each finished trial
a child run (tag ``mlflow.parentRunId``) with the knobs as params, the objective (each of several), the numeric
metrics and the compile and evaluation seconds as metrics, its state, reason, worker and device as tags, its start
and end times Fleet's, and status FINISHED (a valid measurement) or FAILED. Exporting a campaign twice into one
experiment is refused: the parent run carries the tag ``fleet.campaign``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleet.errors import FleetError
from fleet.store import Campaign, Store

_NAME = re.compile(r"[^A-Za-z0-9_\-. /]")
_MAX_VALUE = 6000  # MLflow's longest param value


@dataclass
class MlflowExported:
    """Where the export went: the experiment, the parent run and how many child runs."""

    experiment_id: str
    parent_run_id: str
    runs: int
    tracking_uri: str


def _key(name: str) -> str:
    return _NAME.sub("_", name)[:250] or "_"


def _value(value: Any) -> str:
    return str(value)[:_MAX_VALUE]


def _millis(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.replace(tzinfo=UTC).timestamp() * 1000)


def export_mlflow(store: Store, campaign: Campaign, experiment: str | None = None) -> MlflowExported:
    """Write ``campaign``'s runs; see the module docstring.

    Parameters
    ----------
    experiment:
        The MLflow experiment's name; default the campaign's name. Created when missing.
    """
    import mlflow
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from fleet.interop.records import finished_trials

    client = MlflowClient()
    name = experiment or campaign.name
    found = client.get_experiment_by_name(name)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
    quoted = campaign.name.replace("'", "\\'")
    earlier = client.search_runs([experiment_id], filter_string=f"tags.`fleet.campaign` = '{quoted}'", max_results=1)
    if earlier:
        raise FleetError(
            f"campaign {campaign.name} is in MLflow experiment {name!r} already (run {earlier[0].info.run_id})"
        )
    trials = finished_trials(store, campaign.id)
    parent = client.create_run(
        experiment_id,
        start_time=_millis(campaign.created_at),
        tags={"fleet.campaign": campaign.name, "fleet.status": campaign.status},
        run_name=campaign.name,
    )
    parent_id = parent.info.run_id
    client.log_batch(
        parent_id,
        params=[
            Param("target", campaign.target),
            Param("strategy", _value((campaign.strategy or {}).get("name", ""))),
            Param("workload", _value((campaign.workload or {}).get("kind", ""))),
            Param("trials", str(len(trials))),
        ],
    )
    for trial in trials:
        start = _millis(trial.started_at or trial.finished_at) or 0
        tags = {
            "mlflow.parentRunId": parent_id,
            "fleet.trial": str(trial.id),
            "fleet.problem": str(trial.problem_id),
            "fleet.state": trial.state,
        }
        for key, value in (
            ("fleet.reason", trial.reason),
            ("fleet.worker", trial.worker),
            ("fleet.device", trial.device),
        ):
            if value:
                tags[key] = _value(value)
        run = client.create_run(experiment_id, start_time=start, tags=tags, run_name=f"trial {trial.id}")
        metrics = []
        if trial.valid and trial.objective is not None:
            metrics.append(Metric(_key(trial.objective_name or "objective"), float(trial.objective), start, 0))
            # Several objectives: each one a metric of its name, before any metric of the same name.
            for key, value in trial.objectives.items():
                metrics.append(Metric(_key(key), float(value), start, 0))
        for key, seconds in (("compile_seconds", trial.compile_seconds), ("eval_seconds", trial.eval_seconds)):
            if seconds is not None:
                metrics.append(Metric(key, seconds, start, 0))
        for key, value in trial.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics.append(Metric(_key(key), float(value), start, 0))
        params = [Param(_key(k), _value(v)) for k, v in trial.config.items()]
        client.log_batch(run.info.run_id, metrics=_unique(metrics), params=params, tags=[RunTag("fleet", "trial")])
        client.set_terminated(
            run.info.run_id, "FINISHED" if trial.valid else "FAILED", end_time=_millis(trial.finished_at)
        )
    client.set_terminated(parent_id, "FINISHED", end_time=_millis(campaign.finished_at))
    return MlflowExported(experiment_id, parent_id, len(trials), mlflow.get_tracking_uri())


def _unique(metrics: list[Any]) -> list[Any]:
    """One metric per key (two Fleet metric names can sanitize to one MLflow key): the first is kept."""
    seen: dict[str, Any] = {}
    for metric in metrics:
        seen.setdefault(metric.key, metric)
    return list(seen.values())
