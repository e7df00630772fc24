"""Fleet's database as a read-only Optuna storage: what optuna-dashboard (or ``optuna.load_study``) reads, live.

One study per campaign and problem, its id ``campaign id << 24 | the problem's position in the campaign``
(stable: both are fixed once the campaign exists) and its name ``<campaign> / problem <id>``. Knobs are
categorical distributions over the values the campaign's space lists (with any other value a trial holds, so that
every trial fits); the direction is the measurements' own, and a campaign of several objectives is a study of
several directions, each complete trial's values its objectives in the workload's order. A trial's number is its
rank among the study's trials by Fleet's trial id, so trials that finish later are appended and numbers never
change. States:

======================================  =================================================
Fleet                                   Optuna
======================================  =================================================
evaluated with a valid measurement      COMPLETE, its objective as the value
invalid, errored, evaluated but invalid FAIL (the reason in the user attribute ``reason``)
cancelled                               PRUNED
new                                     WAITING
compiling, compiled, evaluating         RUNNING
======================================  =================================================

User attributes carry Fleet's trial id, state, reason, worker, device, and compile and evaluation seconds. Nothing
is copied: each call reads the database through :mod:`fleet.store` (a finished trial, which never changes, is built
once and kept by the adapter). Every write raises.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Text, cast, func, select

from fleet.errors import FleetError, SpecError
from fleet.search.pareto import Objective
from fleet.spec.workloads import load_workload_spec
from fleet.states import TrialState as FleetState
from fleet.store import Campaign, Measurement, Store, Trial, collector_paused, trials_with_measurements
from fleet.store._models import CampaignProblem

SHIFT = 24
"""Bits of a study id that hold the problem's position in its campaign."""

_STATES = {
    FleetState.NEW: TrialState.WAITING,
    FleetState.COMPILING: TrialState.RUNNING,
    FleetState.COMPILED: TrialState.RUNNING,
    FleetState.EVALUATING: TrialState.RUNNING,
    FleetState.INVALID: TrialState.FAIL,
    FleetState.ERRORED: TrialState.FAIL,
    FleetState.CANCELLED: TrialState.PRUNED,
}
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
_CACHE_SECONDS = 1.0  # get_best_trial right after get_all_trials (as the dashboard calls them) reads once


class ReadOnlyStorageError(FleetError):
    """A write to Fleet's database through the Optuna storage adapter."""


@dataclass(frozen=True)
class _Study:
    id: int
    campaign_id: int
    problem_id: int
    name: str
    user_attrs: dict[str, Any]
    space: dict[str, Any]


class FleetStorage(BaseStorage):
    """Fleet's store, read as an Optuna storage; see the module docstring.

    Parameters
    ----------
    store:
        The store to read.
    campaigns:
        Names or ids of the campaigns to show; default every campaign.
    """

    def __init__(self, store: Store, campaigns: Sequence[str] = ()) -> None:
        self.store = store
        self.campaigns = [str(c) for c in campaigns]
        self._directions: dict[int, list[StudyDirection]] = {}
        self._objectives: dict[int, list[Objective] | None] = {}
        self._lock = threading.Lock()
        self._recent: dict[int, tuple[float, list[FrozenTrial]]] = {}
        self._kept: dict[int, dict[int, FrozenTrial]] = {}
        self._shared: dict[int, dict[str, BaseDistribution]] = {}
        self._settled: dict[int, tuple[tuple[int, int], list[FrozenTrial]]] = {}

    # -- studies ---------------------------------------------------------------------------------------------

    def _studies(self) -> list[_Study]:
        query = (
            select(
                Campaign.id,
                Campaign.name,
                Campaign.target,
                Campaign.status,
                Campaign.space,
                CampaignProblem.problem_id,
                CampaignProblem.position,
            )
            .join(CampaignProblem, CampaignProblem.campaign_id == Campaign.id)
            .order_by(Campaign.id, CampaignProblem.position)
        )
        if self.campaigns:
            ids = [int(c) for c in self.campaigns if c.isdigit()]
            query = query.where(Campaign.name.in_(self.campaigns) | Campaign.id.in_(ids))
        with self.store.transaction() as connection:
            rows = connection.execute(query).all()
        return [
            _Study(
                (r.id << SHIFT) | r.position,
                r.id,
                r.problem_id,
                f"{r.name} / problem {r.problem_id}",
                {"campaign": r.name, "problem": r.problem_id, "target": r.target, "status": r.status},
                r.space or {},
            )
            for r in rows
        ]

    def _study(self, study_id: int) -> _Study:
        campaign_id, position = study_id >> SHIFT, study_id & ((1 << SHIFT) - 1)
        query = (
            select(Campaign.name, Campaign.target, Campaign.status, Campaign.space, CampaignProblem.problem_id)
            .join(CampaignProblem, CampaignProblem.campaign_id == Campaign.id)
            .where(Campaign.id == campaign_id, CampaignProblem.position == position)
        )
        with self.store.transaction() as connection:
            r = connection.execute(query).first()
        if r is None:
            raise KeyError(f"no study {study_id}")
        return _Study(
            study_id,
            campaign_id,
            r.problem_id,
            f"{r.name} / problem {r.problem_id}",
            {"campaign": r.name, "problem": r.problem_id, "target": r.target, "status": r.status},
            r.space or {},
        )

    def _directions_of(self, campaign_id: int) -> list[StudyDirection]:
        """The direction of each of the campaign's objectives: of several, as its workload names them; of one, as
        its measurements recorded it (minimize until it has one)."""
        if campaign_id in self._directions:
            return self._directions[campaign_id]
        names = self._objective_names(campaign_id)
        if names is not None:
            directions = [StudyDirection.MAXIMIZE if o.maximize else StudyDirection.MINIMIZE for o in names]
            self._directions[campaign_id] = directions
            return directions
        query = (
            select(Measurement.maximize)
            .join(Trial, Trial.id == Measurement.trial_id)
            .where(Trial.campaign_id == campaign_id)
            .limit(1)
        )
        with self.store.transaction() as connection:
            maximize = connection.scalar(query)
        if maximize is None:
            return [StudyDirection.MINIMIZE]
        self._directions[campaign_id] = [StudyDirection.MAXIMIZE if maximize else StudyDirection.MINIMIZE]
        return self._directions[campaign_id]

    def _objective_names(self, campaign_id: int) -> list[Objective] | None:
        """The campaign's objectives when its workload names several (a trial's values are theirs), else None."""
        if campaign_id not in self._objectives:
            with self.store.transaction() as connection:
                workload = connection.scalar(select(Campaign.workload).where(Campaign.id == campaign_id))
            try:
                objectives = load_workload_spec(workload or {}).objectives
            except SpecError:  # a campaign of a kind this version does not know: its measurements say
                objectives = []
            self._objectives[campaign_id] = objectives if len(objectives) > 1 else None
        return self._objectives[campaign_id]

    def _frozen(self, study: _Study) -> FrozenStudy:
        directions = self._directions_of(study.campaign_id)
        one = directions[0] if len(directions) == 1 else None
        return FrozenStudy(study.name, one, dict(study.user_attrs), {}, study.id, directions=directions)

    def get_all_studies(self) -> list[FrozenStudy]:
        return [self._frozen(s) for s in self._studies()]

    def get_study_id_from_name(self, study_name: str) -> int:
        for study in self._studies():
            if study.name == study_name:
                return study.id
        raise KeyError(f"no study {study_name!r}")

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._study(study_id).name

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return list(self._directions_of(self._study(study_id).campaign_id))

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return dict(self._study(study_id).user_attrs)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        self._study(study_id)
        return {}

    # -- trials ----------------------------------------------------------------------------------------------

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        study = self._study(study_id)
        trials = self._trials(study)
        with self._lock:
            self._recent[study_id] = (time.monotonic(), trials)
        if states is not None:
            trials = [t for t in trials if t.state in states]
        # The kept trials (and one distributions dict) are shared between calls: a caller that may change them
        # asks for copies, as Optuna's own storages give.
        return copy.deepcopy(trials) if deepcopy else trials

    def _trials(self, study: _Study) -> list[FrozenTrial]:
        with collector_paused():
            return self._read_trials(study)

    def _read_trials(self, study: _Study) -> list[FrozenTrial]:
        """The study's trials. A finished trial never changes: it is built once and kept, so that a dashboard that
        polls a running campaign reads only the ids of the others, and the rows of what changed; once every trial
        has finished, a count and the last id tell that nothing changed.

        A cold call builds every trial: 100,000 of them for a large campaign. The rows are read with the columns
        the trials need only (the configuration as its JSON text, decoded in one call for all rows rather than one
        call a row) and built in one loop that shares what trials can share (see :meth:`_build`), with Python's
        cyclic garbage collector paused (see :func:`fleet.store.collector_paused`)."""
        columns = (
            Trial.id,
            cast(Trial.config, Text),
            Trial.state,
            Trial.reason,
            Trial.worker,
            Trial.compile_seconds,
            Trial.eval_seconds,
            func.coalesce(Trial.started_at, Trial.created_at),
            Trial.finished_at,
            Measurement.objective,
            Measurement.valid,
            Measurement.device_kind,
            Measurement.objectives,
        )
        mine = (Trial.campaign_id == study.campaign_id, Trial.problem_id == study.problem_id)
        kept = self._kept.setdefault(study.id, {})
        with self.store.transaction() as connection:
            settled = self._settled.get(study.id)
            if settled is not None:
                # Every trial was finished at the last read: the same count and the same last id (ids only grow)
                # mean the same trials, which never change.
                shape = connection.execute(select(func.count(), func.max(Trial.id)).where(*mine)).one()
                if tuple(shape) == settled[0]:
                    return list(settled[1])
            if kept:
                ids = list(connection.scalars(select(Trial.id).where(*mine).order_by(Trial.id)))
                wanted = [i for i in ids if i not in kept]
            rows: Sequence[Any] = []
            whole = not kept or len(wanted) > 5000
            if whole:
                query = trials_with_measurements(*columns).where(*mine)
                rows = connection.execute(query.order_by(Trial.id)).all()
                ids = [r[0] for r in rows]
            elif wanted:
                query = trials_with_measurements(*columns)
                rows = connection.execute(query.where(Trial.id.in_(wanted))).all()
        # One json.loads over every row's text costs a tenth of one a row.
        configs = json.loads("[" + ",".join(r[1] or "null" for r in rows) + "]") if rows else []
        distributions = self._shared.get(study.id)
        if distributions is not None and not _all_fit(configs, distributions):
            # A value that no distribution holds: every trial is built again, with the new distributions.
            self._shared.pop(study.id)
            kept.clear()
            if not whole:
                return self._read_trials(study)
            distributions = None
        if distributions is None:
            distributions = self._distributions(study, configs)
            self._shared[study.id] = distributions
        names = self._objective_names(study.campaign_id)
        fresh = self._build(rows, configs, None if whole else ids, distributions, names)
        for trial in fresh.values():
            if trial.state in _FINISHED:
                kept[trial._trial_id] = trial
        trials = [fresh.get(i) or kept[i] for i in ids]
        if all(t.state in _FINISHED for t in trials):
            self._settled[study.id] = ((len(ids), max(ids, default=None)), list(trials))  # type: ignore[assignment]  # max of no ids is None: the key says so
        else:
            self._settled.pop(study.id, None)
        return trials

    @staticmethod
    def _distributions(study: _Study, configs: Sequence[dict[str, Any] | None]) -> dict[str, BaseDistribution]:
        """One categorical distribution per knob, shared by every trial of the study: the space's values, then any
        other value a trial holds (in the order of the trials)."""
        choices: dict[str, list[Any]] = {}
        for name, knob in (study.space.get("knobs") or {}).items():
            choices[name] = list(knob["values"] if isinstance(knob, dict) else knob)
        seen = {name: set(map(_hashable, values)) for name, values in choices.items()}
        everything = [c for c in configs if c]
        names = dict.fromkeys(name for c in everything for name in c) if everything else {}
        for name in names:
            known = seen.setdefault(name, set())
            # Column by column: the distinct values first (a set of 100,000 is made in milliseconds), in the
            # order they come, then only those that are new looked at.
            for key in _distinct([c[name] for c in everything if name in c]):
                if key not in known:
                    known.add(key)
                    choices.setdefault(name, []).append(key[1])
        return {name: CategoricalDistribution(values) for name, values in choices.items() if values}

    @staticmethod
    def _build(
        rows: Sequence[Any],
        configs: Sequence[dict[str, Any] | None],
        ids: Sequence[int] | None,
        distributions: dict[str, BaseDistribution],
        objectives: Sequence[Objective] | None = None,
    ) -> dict[int, FrozenTrial]:
        """The trials of ``rows`` (their configurations decoded in ``configs``), numbered by their rank in ``ids``
        (None: the rows are every trial of the study, in order); with several ``objectives``, each complete trial's
        values are theirs, in order.

        This runs once a trial, 100,000 times for a large campaign's cold call: plain ifs rather than loops over
        pairs, names bound to locals, and one distributions dict (and one empty dict for the attributes a trial
        has none of) shared by every trial that sets exactly the study's knobs, as all of a campaign of Fleet's do.
        """
        position = None if ids is None else {trial_id: number for number, trial_id in enumerate(ids)}
        names = distributions.keys()
        states, complete, waiting, offset = _STATES, TrialState.COMPLETE, TrialState.WAITING, _OFFSET
        out: dict[int, FrozenTrial] = {}
        for number, (row, params) in enumerate(zip(rows, configs, strict=True)):
            trial_id, _, fleet_state, reason, worker, compile_s, eval_s, started, finished, objective, valid, device = (
                row[:12]
            )
            if position is not None:
                number = position.get(trial_id, -1)
                if number < 0:
                    continue
            attrs: dict[str, Any] = {"fleet_trial": trial_id, "state": fleet_state}
            value: float | None = None
            values: list[float] | None = None
            if objectives is not None and objective is not None:
                measured = row[12] or {}
                values = [v for o in objectives if (v := measured.get(o.name)) is not None]
                if len(values) < len(objectives):
                    objective = values = None  # a measurement without every objective is no point of the front
            if fleet_state == FleetState.EVALUATED and valid and objective is not None:
                state = complete
                value = None if values is not None else float(objective)
                if reason:
                    attrs["reason"] = reason
            else:
                state = states.get(fleet_state, TrialState.FAIL)
                if reason or fleet_state == FleetState.EVALUATED:
                    attrs["reason"] = reason or "invalid measurement"
            if worker is not None:
                attrs["worker"] = worker
            if device is not None:
                attrs["device"] = device
            if compile_s is not None:
                attrs["compile_seconds"] = compile_s
            if eval_s is not None:
                attrs["eval_seconds"] = eval_s
            mine = distributions
            if params is None:
                params, mine = {}, {}
            elif params.keys() != names:
                params = {k: v for k, v in params.items() if k in distributions}
                mine = {k: distributions[k] for k in params}
            out[trial_id] = FrozenTrial(
                number,
                state,
                value,
                None if state is waiting or started is None else started + offset,
                finished + offset if finished is not None and state in _FINISHED else None,
                params,
                mine,
                attrs,
                {},
                {},
                trial_id,
                values=values,
            )
        return out

    def _cached(self, study_id: int) -> list[FrozenTrial]:
        with self._lock:
            recent = self._recent.get(study_id)
        if recent is not None and time.monotonic() - recent[0] < _CACHE_SECONDS:
            return recent[1]
        return self.get_all_trials(study_id, deepcopy=False)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        trials = [t for t in self._cached(study_id) if t.state == TrialState.COMPLETE]
        if not trials:
            raise ValueError("no trials are completed yet")
        pick = max if self.get_study_directions(study_id)[0] == StudyDirection.MAXIMIZE else min
        return pick(trials, key=_value)

    def _study_of_trial(self, trial_id: int) -> int:
        query = (
            select(CampaignProblem.campaign_id, CampaignProblem.position)
            .join(
                Trial,
                (Trial.campaign_id == CampaignProblem.campaign_id) & (Trial.problem_id == CampaignProblem.problem_id),
            )
            .where(Trial.id == trial_id)
        )
        with self.store.transaction() as connection:
            r = connection.execute(query).first()
        if r is None:
            raise KeyError(f"no trial {trial_id}")
        return (r.campaign_id << SHIFT) | r.position

    def get_trial(self, trial_id: int) -> FrozenTrial:
        for trial in self._cached(self._study_of_trial(trial_id)):
            if trial._trial_id == trial_id:
                return trial
        raise KeyError(f"no trial {trial_id}")

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        trials = self._cached(study_id)
        if not 0 <= trial_number < len(trials):
            raise KeyError(f"no trial number {trial_number} in study {study_id}")
        return trials[trial_number]._trial_id

    # -- writes: none ----------------------------------------------------------------------------------------

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ReadOnlyStorageError("Fleet's database is read-only through Optuna: tune with `fleet tune`")

    create_new_study = _refuse
    delete_study = _refuse
    set_study_user_attr = _refuse
    set_study_system_attr = _refuse
    create_new_trial = _refuse
    set_trial_param = _refuse
    set_trial_state_values = _refuse
    set_trial_intermediate_value = _refuse
    set_trial_user_attr = _refuse
    set_trial_system_attr = _refuse


def _hashable(value: Any) -> Any:
    # 1 and True are equal in Python: a knob with both keeps both.
    return (type(value).__name__, value)


def _value(trial: FrozenTrial) -> float:
    """A complete trial's value, which a single-objective study's trial always has (Optuna's own storages cast)."""
    value = trial.value
    if value is None:
        raise ValueError(f"trial {trial.number} is complete without a value")
    return value


_OFFSET = datetime.now().astimezone().utcoffset() or timedelta(0)


def _local(moment: datetime | None) -> datetime | None:
    """Fleet's naive UTC as the naive local time of Optuna's FrozenTrial (this process's offset from UTC)."""
    return None if moment is None else moment + _OFFSET


def _all_fit(configs: Sequence[dict[str, Any] | None], distributions: dict[str, BaseDistribution]) -> bool:
    """Whether every knob value of every configuration is among its distribution's choices (knob by knob: a set
    test of each distinct value, not one call a configuration)."""
    choices = {name: set(map(_hashable, d.choices)) for name, d in distributions.items()}  # type: ignore[attr-defined]  # categorical ones only: checked by the caller
    names = dict.fromkeys(name for c in configs if c for name in c)
    for name in names:
        column = _distinct([c[name] for c in configs if c and name in c])
        if column and not column.keys() <= choices.get(name, set()):
            return False
    return True


def _distinct(column: list[Any]) -> dict[Any, None]:
    """The distinct values of a knob that can be categorical choices (not a list or an object), each as
    :func:`_hashable` makes it, in the order they come."""
    kinds = set(map(type, column))
    if len(kinds) == 1 and kinds <= {int, str, float}:
        # One type: no 1 and True, or 1 and 1.0, to keep apart, so the plain values can be made distinct first.
        name = next(iter(kinds)).__name__
        return {(name, value): None for value in dict.fromkeys(column)}
    scalar = (bool, int, float, str, type(None))
    return dict.fromkeys(_hashable(v) for v in column if isinstance(v, scalar))
