"""PostgreSQL restarts under real worker processes and drivers: a short outage costs no trial, a long one
gives the trial back instead of erroring it, and nobody stumbles on a stale connection afterwards."""

from __future__ import annotations

import json
import time

import psycopg2

from fleet.services import PostgresServer
from tests.conftest import Fleet, write_spec
from tests.integration.test_faults import assert_each_recorded_once, script_spec, start_tune, trials


def restart(server: PostgresServer, down_seconds: float) -> None:
    """Crash the database (SIGKILL, as a host that loses power), keep it down, start it again.

    A checkpoint comes first, as on a server that had been up a while: the session's server has made a database
    for each test, all of it in the write-ahead log, whose replay took over 30 s on a loaded machine."""
    connection = psycopg2.connect(
        host=str(server.directory), port=server.port, user=server.superuser, dbname="postgres"
    )
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    finally:
        connection.close()
    server.kill()
    time.sleep(down_seconds)
    server.start(timeout=120)


def test_a_restart_while_trials_build_and_measure_errors_none(fleet: Fleet, postgres_server: PostgresServer) -> None:
    fleet.start_worker()
    spec = script_spec(fleet, ["sleep3", "sleep2.5", "a", "bb", "ccc"])
    tune = start_tune(fleet, write_spec(fleet.home, spec), "--window", "2")
    fleet.wait_for(
        lambda: any(t.state == "evaluating" and t.config["mode"].startswith("sleep") for t in trials(fleet)),
        what="a slow trial to be evaluating",
    )

    restart(postgres_server, down_seconds=2)
    started = time.monotonic()

    out, err = tune.communicate(timeout=180)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 5}
    # The crash may lose a claim that a worker committed without waiting for the disk; that worker sends
    # the trial again at once rather than leaving it to the requeue (300 s).
    assert time.monotonic() - started < 90
    assert all(t.attempts <= 2 and t.reason is None for t in trials(fleet))
    assert_each_recorded_once(fleet)


def test_each_workers_first_task_after_a_restart_succeeds(fleet: Fleet, postgres_server: PostgresServer) -> None:
    # Every worker process holds a connection; the restart breaks them all while the workers sit idle.
    fleet.start_worker("--build-procs", "2", "--eval-procs", "2", expect=3)
    warm = script_spec(fleet, ["a", "bb", "ccc", "dddd"])
    fleet.cli("tune", str(write_spec(fleet.home, warm, "warm.json")), "--window", "4", check=True)

    restart(postgres_server, down_seconds=1)

    after = script_spec(fleet, ["e", "ff", "ggg", "hhhh"]) | {"name": "after"}
    started = time.monotonic()
    done = fleet.cli("tune", str(write_spec(fleet.home, after, "after.json")), "--json", "--window", "4", check=True)
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 4}
    # Not one message waited for the requeue (300 s): no worker's first task failed on its stale connection.
    assert time.monotonic() - started < 90
    assert all(t.attempts == 1 for t in trials(fleet))
    assert_each_recorded_once(fleet)


def test_a_longer_outage_gives_the_trial_back_instead_of_erroring_it(
    fleet: Fleet, postgres_server: PostgresServer
) -> None:
    # The workers wait 2 s; the database stays down 6 s: the measurement is stopped and measured again.
    fleet.start_worker(env={"FLEET_DB_OUTAGE_SECONDS": "2"})
    spec = script_spec(fleet, ["sleep8", "a"])
    tune = start_tune(fleet, write_spec(fleet.home, spec), "--window", "1")
    fleet.wait_for(
        lambda: any(t.state == "evaluating" and t.config["mode"] == "sleep8" for t in trials(fleet)),
        what="the slow trial to be evaluating",
    )

    restart(postgres_server, down_seconds=6)

    out, err = tune.communicate(timeout=180)
    assert tune.returncode == 0, err
    assert json.loads(out)["problems"][0]["trials"] == {"evaluated": 2}
    slow = next(t for t in trials(fleet) if t.config["mode"] == "sleep8")
    assert slow.attempts <= 2 and slow.reason is None, (slow.attempts, slow.reason)
    # The worker gave up waiting, stopped the measurement and sent it again (the crash may also have lost
    # the claim, which its attempt count would show).
    assert "evaluate end: RETRY" in (fleet.home / "worker.log").read_text()
    assert_each_recorded_once(fleet)
