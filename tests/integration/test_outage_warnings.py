"""A database outage is not a missing worker: the driver does not say "no worker is listening" because the workers'
heartbeats, written to the database, stopped while it was down."""

from __future__ import annotations

import sys

import pytest

from fleet.services import PostgresServer
from fleet.settings import Settings
from tests.conftest import Fleet, write_spec
from tests.integration.test_faults import start_tune, trials
from tests.integration.test_outages import restart

SLEEP = "import sys, time; time.sleep(float(sys.argv[1])); print('{\"score\": 1}')"


def test_the_driver_does_not_warn_of_missing_workers_after_a_database_outage(
    fleet: Fleet, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short liveness window (3 x 0.5 s + 2.5 s), for an outage longer than it to be short too.
    monkeypatch.setitem(fleet.env, "FLEET_LIVENESS_SLACK_SECONDS", "2.5")
    liveness = Settings.from_env(fleet.env).liveness_seconds
    fleet.start_worker()
    spec = {
        "name": "outage",
        "target": fleet.target,
        "problems": [{"kind": "sleeper", "params": {}}],
        "space": {"knobs": {"seconds": {"values": ["4", "0.1", "0.2"], "build": False}}},
        "workload": {
            "kind": "command",
            "run": [sys.executable, "-c", SLEEP, "{seconds}"],
            "objective": {"json": "score"},
        },
    }
    tune = start_tune(fleet, write_spec(fleet.home, spec), "--window", "1")
    fleet.wait_for(lambda: any(t.state == "evaluating" for t in trials(fleet)), what="a trial to be evaluating")

    restart(postgres_server, down_seconds=liveness + 1)  # longer than a heartbeat counts: every worker's is too old

    _, err = tune.communicate(timeout=180)
    assert tune.returncode == 0, err
    assert "no worker is listening" not in err, err
