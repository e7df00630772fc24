"""Fleet's read-only Optuna storage and ``fleet bench dashboard``'s timings, on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.bench.dashboard import make_cache, timings
from fleet.interop.optuna_export import add_trials
from fleet.interop.optuna_storage import SHIFT, FleetStorage, ReadOnlyStorageError
from fleet.interop.records import import_kt
from fleet.store import Store


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
    copy = optuna.create_study(storage=url, study_name="copy", directions=fleet.get_study_directions(study_id))
    add_trials(copy._storage, copy, trials)
    loaded = optuna.load_study(study_name="copy", storage=url)
    assert len(loaded.trials) == 400 and loaded.best_value == fleet.get_best_trial(study_id).value
    mine = timings(lambda: FleetStorage(store), study_id, 1, api_trials=False)
    # Optuna's own RDB storage reads slowly (tens of seconds for a few hundred trials on a busy machine): the
    # benchmark times it; here, Fleet's side alone.
    assert mine["trials"] == 400
    assert set(mine) >= {"studies_s", "trials_cold_s", "trials_warm_s", "api_studies_s"}
    store.close()
