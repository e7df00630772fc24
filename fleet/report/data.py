"""What the page shows, read from the database in a few queries: a row per trial, with its measurement.

It is read through a :class:`fleet.glance.Glance` (no SQLAlchemy) or :class:`fleet.report.stored.StoredReads`
(the store): both have the methods :func:`collect` calls.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from fleet.report.text import TOP, value_text
from fleet.states import FAILED, FINISHED, TrialState

if TYPE_CHECKING:
    from fleet.store import Campaign, Problem

_FINISHED = frozenset(FINISHED)  # a set of strings: a state is looked up by its hash, not compared with each
_OBJECTIVE = attrgetter("objective")  # a sort key in C: a Python function called per row costs more than the sort
_MEASURED = attrgetter("measured")
_T = attrgetter("t")


@dataclass(slots=True)
class Row:
    """One trial with what the page needs of its measurement (its own, or the earlier one it reused).

    Samples, metrics and output are not here: the page shows them for a few trials only (see :class:`Detail`).
    """

    trial_id: int
    problem_id: int
    config: dict[str, Any]
    state: str
    reason: str | None
    baseline: bool
    finished_us: int | None  # when it finished, in microseconds since the epoch (naive UTC, as the database keeps it)
    reused_from: int | None
    objective: float | None
    valid: bool
    node: str | None
    gpu: str | None
    worker: str | None
    toolchain: str | None
    device: str | None
    measured: bool = False  # a valid, finite objective of an evaluated trial
    series: str = ""
    t: float | None = None  # seconds from the campaign's first start to this trial's end
    finished: bool = False  # its state is a finished one (a field, not a property: read for every trial)


@dataclass(slots=True)
class Detail:
    """What the page shows of one trial of its tables: its measurement's samples and metrics, its output."""

    samples: list[Any] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    build_log: str | None = None


@dataclass
class Data:
    campaign: Campaign
    problems: list[Problem]
    rows: list[Row]
    objective_name: str
    maximize: bool
    knobs: dict[str, dict[str, Any]]  # name -> {"values": [...], "build": bool}
    t0: datetime | None
    details: dict[int, Detail] = field(default_factory=dict)  # by trial id: the trials the tables show
    # Each read by several sections; taken once, as each is a pass over every trial.
    problem_rows: dict[int, list[Row]] = field(default_factory=dict)  # by problem id: its rows, in the same order
    ranked: dict[int, list[Row]] = field(default_factory=dict)  # by problem id: its best table's rows (_ranked)
    errors: list[tuple[tuple[str, str], list[Row]]] = field(default_factory=list)  # _error_groups of every row
    # The trials proposed from history, as the store's history_trials gives them.
    history: list[tuple[int, int, dict[str, Any], float | None]] = field(default_factory=list)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.maximize else a < b

    def best_of(self, rows: Iterable[Row]) -> Row | None:
        """The first of ``rows`` with the best measurement (``min`` and ``max`` keep the first of equals)."""
        pick = max if self.maximize else min
        found: Row | None = pick(filter(_MEASURED, rows), key=_OBJECTIVE, default=None)
        return found

    def detail(self, row: Row) -> Detail:
        return self.details.get(row.trial_id) or Detail()


def _knobs(space: Mapping[str, Any], rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Each knob's values (the space's, then any others the trials used) and whether it is build-time."""
    knobs: dict[str, dict[str, Any]] = {}
    raw = space.get("knobs", {}) if isinstance(space, Mapping) else {}
    run_time = set(space.get("run_time", []) if isinstance(space, Mapping) else [])
    for name, knob in raw.items():
        if isinstance(knob, Mapping):
            values, build = list(knob.get("values", [])), bool(knob.get("build", True))
        else:
            values, build = list(knob) if isinstance(knob, list) else [knob], True
        knobs[str(name)] = {"values": values, "build": build and name not in run_time}
    # Sets, and each value the trials used once: a knob of 10 000 values over 100 000 trials would otherwise
    # cost 10^9 comparisons. A baseline's values may lie outside the space: they are not the space's.
    seen = {name: {_identity(v) for v in knob["values"]} for name, knob in knobs.items()}
    used = dict.fromkeys((k, type(v), v) for row in rows if not row.baseline for k, v in row.config.items())
    for name, kind, value in used:
        knob = knobs.setdefault(name, {"values": [], "build": True})
        if (kind, value) not in seen.setdefault(name, set()):
            seen[name].add((kind, value))
            knob["values"].append(value)
    return knobs


def _identity(value: Any) -> tuple[type, Any]:
    """A value as a key that keeps 1, 1.0 and True apart (they are equal, and hash alike, in Python)."""
    return type(value), value


def _series(chain: Any, config: Mapping[str, Any], strategy: str) -> str:
    """A trial's series: the ``chain`` of its measurement's metrics, else of its configuration, else the strategy."""
    if chain is None:
        chain = config.get("chain")
    if chain is None:
        return strategy
    if isinstance(chain, float) and chain.is_integer():
        chain = int(chain)
    return f"chain {value_text(chain)}"


def _json_list(texts: Sequence[str | None]) -> list[Any]:
    """JSON texts decoded in one call: 100,000 calls of ``json.loads`` cost several times as much."""
    return json.loads("[" + ",".join(text or "null" for text in texts) + "]")


def collect(reader: Any, campaign: Campaign) -> Data:
    """Everything the page shows, read in a few queries through ``reader`` (a glance, or the store's reads)."""
    problems = reader.campaign_problems(campaign.id)
    strategy = str((campaign.strategy or {}).get("name", "strategy"))
    # Annealing chains on the fleet keep their steps apart from the trials: a trial is in its first visitor's series.
    chain_of: dict[int, int] = {}
    for index, trial_id in reader.chain_trials(campaign.id):
        chain_of.setdefault(trial_id, index)
    # The trials come in lists (on PostgreSQL, the next read by threads while this one is made rows): each list's
    # tuples are dropped once they are rows. The campaign's start and objective come after them (read meanwhile).
    rows: list[Row] = []
    lists, facts = reader.report_rows(campaign.id)
    for found in lists:
        rows += _rows(found, chain_of, strategy)
    t0, from_history, recorded = facts()
    objective_name, maximize = _objective(campaign, recorded)
    rows = _in_finishing_order(rows, t0)
    data = Data(
        campaign=campaign,
        problems=problems,
        rows=rows,
        objective_name=objective_name,
        maximize=maximize,
        knobs=_knobs(campaign.space or {}, rows),
        t0=t0,
    )
    for problem in problems:
        problem_id = problem.id  # a column of an ORM object: slow to read 100,000 times
        data.problem_rows[problem_id] = [row for row in rows if row.problem_id == problem_id]
        data.ranked[problem_id] = _ranked(data, data.problem_rows[problem_id])
    data.errors = _error_groups(rows)
    if from_history:  # most campaigns have none, and the query would read every trial again to say so
        data.history = reader.history_trials(campaign.id)
    data.details = _details(reader, _shown(data))
    return data


def _rows(found: Sequence[Any], chain_of: dict[int, int], strategy: str) -> list[Row]:
    """The rows of ``report_rows`` (:func:`fleet.report.stored.trials_query`), as the page's rows, in the same
    order, their times (``t``) not yet taken."""
    # Tuples indexed and unpacked in the query's order: looking up 16 columns by name in each of 100,000 rows
    # costs a second.
    configs = _json_list([t[2] for t in found])
    chains = [t[10] for t in found]
    chains = _json_list(chains) if any(chains) else chains  # most campaigns have no chains: nothing to decode
    rows: list[Row] = []
    # The state as a plain string: comparing with the enum's member costs twice as much.
    append, evaluated, isfinite = rows.append, str(TrialState.EVALUATED), math.isfinite
    finished = _FINISHED
    for (
        trial_id,
        problem_id,
        _,  # config, as text
        state,
        reason,
        baseline,
        finished_us,
        reused_from,
        objective,
        valid,
        _,  # chain, as JSON text
        node,
        gpu,
        worker,
        toolchain,
        device,
    ), config, chain in zip(found, configs, chains, strict=True):
        config = config or {}
        measured = bool(valid) and state == evaluated and objective is not None and isfinite(objective)
        if trial_id in chain_of:
            series = f"chain {chain_of[trial_id]}"
        elif chain is None and "chain" not in config:  # most trials: the strategy's
            series = strategy
        else:
            series = _series(chain, config, strategy)
        # Positional, in the order of Row's fields: keywords cost a tenth of a second more for 100,000 rows.
        append(
            Row(
                trial_id,
                problem_id,
                config,
                state,
                reason,
                bool(baseline),
                finished_us,
                reused_from,
                objective,
                bool(valid),
                node,
                gpu,
                worker,
                toolchain,
                device,
                measured,
                series,
                None,
                state in finished,
            )
        )
    return rows


_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def microseconds(moment: datetime) -> int:
    """``moment`` (naive UTC) in microseconds since the epoch, as the reads give a trial's finish."""
    return (moment - _EPOCH) // _MICROSECOND


def _in_finishing_order(rows: list[Row], t0: datetime | None) -> list[Row]:
    """``rows`` (in trial order) with their times from ``t0``, in the order they finished: the first trial to reach
    the best value is the one the search found it with. A stable sort keeps trial order among equal times; trials
    without a time go last."""
    if t0 is None:
        return rows
    timed: list[Row] = []
    untimed: list[Row] = []
    start = microseconds(t0)
    for row in rows:
        if (finished := row.finished_us) is None:
            untimed.append(row)
        else:
            t = (finished - start) / 1_000_000  # as timedelta.total_seconds() takes it: exact microseconds, divided
            row.t = t if t > 0.0 else 0.0  # max(0.0, t), without the call
            timed.append(row)
    timed.sort(key=_T)
    return timed + untimed


def _ranked(data: Data, rows: Sequence[Row]) -> list[Row]:
    """The best table's rows: the ``TOP`` best valid measurements of the search, best first."""
    valid = [r for r in rows if r.measured and not r.baseline]
    # As sorted(...)[:TOP] (reverse=True to maximize: equals keep their order either way), without sorting 100,000
    # rows for ten of them.
    pick = heapq.nlargest if data.maximize else heapq.nsmallest
    return pick(TOP, valid, key=_OBJECTIVE)


def _measured_objective(row: Row) -> float:
    """A measured row's objective, which ``measured`` says is there."""
    assert row.objective is not None
    return row.objective


def _error_groups(rows: Iterable[Row]) -> list[tuple[tuple[str, str], list[Row]]]:
    """Errored and invalid trials by (state, reason), the largest group first."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.state in FAILED:
            groups.setdefault((row.state, row.reason or "(no reason recorded)"), []).append(row)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _shown(data: Data) -> list[Row]:
    """The trials whose samples, metrics or output the page shows: best tables, baselines, error examples."""
    shown = [row for row in data.rows if row.baseline]
    for ranked in data.ranked.values():
        shown += ranked
    shown += [members[0] for _, members in data.errors]
    return shown


def _details(reader: Any, rows: Sequence[Row]) -> dict[int, Detail]:
    """The samples, metrics and output of ``rows``, and the build logs of those that errored, by trial id."""
    if not rows:
        return {}
    found = reader.trial_outputs(sorted({row.trial_id for row in rows}))
    errored = {row.trial_id for row in rows if row.state == TrialState.ERRORED}
    failed_keys = {build_key for trial_id, build_key, *_ in found if trial_id in errored}
    logs = reader.failed_build_logs(sorted(failed_keys)) if failed_keys else {}
    return {
        trial_id: Detail(
            samples=list(samples or []),
            metrics=dict(metrics or {}),
            stdout_tail=stdout_tail,
            stderr_tail=stderr_tail,
            build_log=logs.get(build_key),
        )
        for trial_id, build_key, stdout_tail, stderr_tail, samples, metrics in found
    }


def _objective(campaign: Campaign, recorded: tuple[str, bool] | None) -> tuple[str, bool]:
    """The objective's name and direction: as the measurements recorded them, else as the workload says."""
    if recorded is not None:
        return recorded
    objective = (campaign.workload or {}).get("objective")
    if not isinstance(objective, Mapping):
        return "objective", False
    return str(objective.get("name") or objective.get("json") or "objective"), objective.get("goal") == "max"
