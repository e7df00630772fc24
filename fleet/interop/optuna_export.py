"""``fleet export optuna``: a campaign's studies copied into a real Optuna storage (another database, or a journal
file), each trial as :class:`~fleet.interop.optuna_storage.FleetStorage` reads it, timestamps kept."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import make_url

from fleet.errors import FleetError, SpecError
from fleet.store import Campaign, Store


def open_storage(url: str, fleet_url: str = "") -> Any:
    """The Optuna storage ``url`` names: a journal file for a path ending in ``.log`` or ``.journal``, else a
    database. Fleet's own database is refused: Optuna's table ``trials`` is Fleet's table's name."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url.endswith((".log", ".journal")) and "://" not in url:
        return JournalStorage(JournalFileBackend(url))
    try:
        wanted = make_url(url)
    except Exception:
        raise SpecError(f"--storage {url!r} is neither a database URL nor a journal file (.log, .journal)") from None
    if fleet_url:
        mine = make_url(fleet_url)
        same = (wanted.drivername.split("+")[0], wanted.host, wanted.port, wanted.database) == (
            mine.drivername.split("+")[0],
            mine.host,
            mine.port,
            mine.database,
        )
        if same:
            raise SpecError(
                "--storage is Fleet's own database: Optuna's tables would meet Fleet's; give another database or a "
                "journal file"
            )
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as error:  # SQLAlchemy's and Optuna's errors alike: one line
        raise FleetError(f"cannot open Optuna storage {url!r}: {str(error).splitlines()[0]}") from None


def export_optuna(store: Store, campaign: Campaign, url: str, *, fleet_url: str = "") -> list[tuple[str, int]]:
    """Copy each study of ``campaign`` into the storage ``url``; return (study name, trials) for each.

    Every study is checked to be new before the first is written.
    """
    import optuna

    from fleet.interop.optuna_storage import FleetStorage

    source = FleetStorage(store, [str(campaign.id)])
    target = open_storage(url, fleet_url)
    studies = source.get_all_studies()
    existing = {s.study_name for s in target.get_all_studies()}
    clash = [s.study_name for s in studies if s.study_name in existing]
    if clash:
        raise FleetError(f"study {clash[0]!r} exists in {url} already: export into another storage")
    done = []
    for study in studies:
        trials = source.get_all_trials(study._study_id, deepcopy=False)
        copy = optuna.create_study(storage=target, study_name=study.study_name, directions=study.directions)
        for key, value in study.user_attrs.items():
            copy.set_user_attr(key, value)
        add_trials(target, copy, trials)
        done.append((study.study_name, len(trials)))
    return done


def add_trials(storage: Any, study: Any, trials: list[Any]) -> None:
    """``study.add_trials(trials)``, in one transaction on an RDB storage.

    Optuna's own ``add_trials`` writes a trial a transaction, a dozen statements each: 4,000 trials took minutes
    on SQLite. On an RDB storage the rows go in with one multi-row INSERT per table, through Optuna's own table
    definitions, as its ``create_new_trial`` would write them (each trial is validated first).
    """
    import json

    from optuna.distributions import distribution_to_json
    from optuna.storages import RDBStorage
    from optuna.storages._rdb import models
    from sqlalchemy import insert

    if not isinstance(storage, RDBStorage):
        study.add_trials(trials)
        return
    for trial in trials:
        trial._validate()
    study_id = study._study_id
    start = len(study.get_trials(deepcopy=False))
    tables = {m: m.__table__ for m in (models.TrialModel, models.TrialValueModel, models.TrialParamModel)}
    attrs_table = models.TrialUserAttributeModel.__table__
    json_of = {}
    with storage.engine.begin() as connection:
        rows = [
            {
                "number": start + i,
                "study_id": study_id,
                "state": t.state,
                "datetime_start": _utc(t.datetime_start),
                "datetime_complete": _utc(t.datetime_complete),
            }
            for i, t in enumerate(trials)
        ]
        table = tables[models.TrialModel]
        ids = (
            list(connection.scalars(insert(table).returning(table.c.trial_id, sort_by_parameter_order=True), rows))
            if rows
            else []
        )
        values, params, attrs = [], [], []
        for trial_id, t in zip(ids, trials, strict=True):
            for objective, value in enumerate(t.values or []):
                stored, kind = models.TrialValueModel.value_to_stored_repr(value)
                values.append({"trial_id": trial_id, "objective": objective, "value": stored, "value_type": kind})
            for name, value in t.params.items():
                distribution = t.distributions[name]
                if id(distribution) not in json_of:
                    json_of[id(distribution)] = distribution_to_json(distribution)
                params.append(
                    {
                        "trial_id": trial_id,
                        "param_name": name,
                        "param_value": distribution.to_internal_repr(value),
                        "distribution_json": json_of[id(distribution)],
                    }
                )
            attrs += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in t.user_attrs.items()]
        for model, batch in ((models.TrialValueModel, values), (models.TrialParamModel, params)):
            if batch:
                connection.execute(insert(tables[model]), batch)
        if attrs:
            connection.execute(insert(attrs_table), attrs)


def _utc(moment: Any) -> Any:
    """A naive local time (Optuna's FrozenTrial) as the naive UTC that Optuna's tables hold."""
    from datetime import UTC

    return None if moment is None else moment.astimezone(UTC).replace(tzinfo=None)
