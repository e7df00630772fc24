"""Fleet's read-only Optuna storage and ``fleet bench dashboard``'s timings, on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert, select, update

from fleet.bench.dashboard import make_cache, timings
from fleet.interop.optuna_export import add_trials
from fleet.interop.optuna_storage import SHIFT, FleetStorage, ReadOnlyStorageError
from fleet.interop.records import import_kt
from fleet.store import Store, Trial


def test_the_storage_reads_an_imported_campaign_and_times_like_optuna_rdb(tmp_path: Path) -> None:
    import optuna

    store = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    store.upgrade()
    make_cache(tmp_path / "bench.json", 400)
    done = import_kt(store, tmp_path / "bench.json")
    study_id = store.campaign(done.campaign).id << SHIFT
    fleet = FleetStorage(store)
    trials = fleet.get_all_trials(study_id, deepcopy=False)
    assert len(trials) == 400 and [t.number for t in trials] == list(range(400))
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 20 and failed[0].user_attrs["reason"] == "RuntimeFailedConfig"
    assert fleet.get_all_trials(study_id, deepcopy=False)[5] is trials[5]  # a finished trial is built once
    assert fleet.get_all_trials(study_id)[5] is not trials[5]  # copies, when asked for
    with pytest.raises(ReadOnlyStorageError):
        fleet.set_trial_user_attr(trials[0]._trial_id, "k", 1)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    # As `fleet export optuna` calls it: on the RDB storage itself (a study's own is Optuna's cache in front of
    # it, which add_trials leaves to Optuna's trial-a-transaction add_trials: 15 s of this test's CPU).
    rdb = optuna.storages.RDBStorage(url)
    copy = optuna.create_study(storage=rdb, study_name="copy", directions=fleet.get_study_directions(study_id))
    add_trials(rdb, copy, trials)
    loaded = optuna.load_study(study_name="copy", storage=url)
    assert len(loaded.trials) == 400 and loaded.best_value == fleet.get_best_trial(study_id).value
    mine = timings(lambda: FleetStorage(store), study_id, 1, api_trials=False)
    # Optuna's own RDB storage reads slowly (tens of seconds for a few hundred trials on a busy machine): the
    # benchmark times it; here, Fleet's side alone.
    assert mine["trials"] == 400
    assert set(mine) >= {"studies_s", "trials_cold_s", "trials_warm_s", "api_studies_s"}
    store.close()


def _seen(trials: list) -> list[tuple]:
    return [
        (t.number, t.state, t.value, t.params, t.distributions, t.user_attrs, t.datetime_start, t.datetime_complete)
        for t in trials
    ]


def test_a_warm_read_of_a_running_campaign_gives_what_a_cold_read_gives(tmp_path: Path) -> None:
    """The storage keeps finished trials and rereads the others: trials that finish later, and a value outside the
    space (which changes every trial's distributions), read warm as a new storage reads them cold."""
    import optuna

    store = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    store.upgrade()
    make_cache(tmp_path / "bench.json", 1000)
    done = import_kt(store, tmp_path / "bench.json")
    campaign = store.campaign(done.campaign)
    study_id = campaign.id << SHIFT
    with store.transaction() as connection:
        ids = list(connection.scalars(select(Trial.id).where(Trial.campaign_id == campaign.id).order_by(Trial.id)))
        running = ids[-10:]
        connection.execute(update(Trial).where(Trial.id.in_(running)).values(state="evaluating", finished_at=None))
    warm = FleetStorage(store)
    before = warm.get_all_trials(study_id, deepcopy=False)
    assert [t.state for t in before[-10:]] == [optuna.trial.TrialState.RUNNING] * 10
    assert all(t.datetime_complete is None for t in before[-10:])
    assert _seen(before) == _seen(FleetStorage(store).get_all_trials(study_id, deepcopy=False))
    with store.transaction() as connection:
        connection.execute(update(Trial).where(Trial.id.in_(running[:5])).values(state="evaluated"))
        connection.execute(update(Trial).where(Trial.id == running[5]).values(config={"x": 0, "y": 5000}))
    after = warm.get_all_trials(study_id, deepcopy=False)
    assert [t.state for t in after[-10:-5]] == [optuna.trial.TrialState.COMPLETE] * 5
    assert after[-5].params == {"x": 0, "y": 5000} and 5000 in after[0].distributions["y"].choices
    assert _seen(after) == _seen(FleetStorage(store).get_all_trials(study_id, deepcopy=False))
    # Every trial finished: a count and the last id say nothing changed, until a new trial comes.
    with store.transaction() as connection:
        connection.execute(update(Trial).where(Trial.id.in_(running[5:])).values(state="evaluated"))
    settled = warm.get_all_trials(study_id, deepcopy=False)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in settled[-5:])
    assert _seen(warm.get_all_trials(study_id, deepcopy=False)) == _seen(settled)
    with store.transaction() as connection:
        first = connection.execute(select(Trial).where(Trial.id == ids[0])).mappings().one()
        row = {**{k: v for k, v in first.items() if k != "id"}, "config": {"x": 1, "y": 1}, "config_key": "new"}
        connection.execute(insert(Trial).values({**row, "state": "new"}))
    grown = warm.get_all_trials(study_id, deepcopy=False)
    assert len(grown) == 1001 and grown[-1].state == optuna.trial.TrialState.WAITING
    assert _seen(grown) == _seen(FleetStorage(store).get_all_trials(study_id, deepcopy=False))
    store.close()
