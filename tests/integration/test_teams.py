"""Teams apart by PostgreSQL itself (issue 44): a submitter's own connection, as an attacker would use it, reaches no
other team's campaigns, trials, measurements, artifacts or stored sources, and the service role still runs every
team's campaigns, on real PostgreSQL, Redis, `fleet driver` and `fleet worker` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, create_engine, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from fleet.canonical import digest
from fleet.errors import StoreError
from fleet.store import Artifact, Measurement, Store, Trial
from fleet.tvm.msdb import RECORDS, WORKLOADS
from tests.conftest import SPACES, Fleet, migrated_database, write_spec
from tests.integration.test_campaign import kernel_spec
from tests.integration.test_store import add, make_campaign, make_problem

RLS_TABLES = (
    "campaigns", "campaign_problems", "trials", "measurements", "artifacts", "blobs", "chains", "chain_steps",
    "ms_records", "ms_workloads", "problem_tags",
)  # fmt: skip


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (the test server trusts 127.0.0.1: no password)."""
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


@dataclass
class Teams:
    """Two teams on one database: red (alice, the victim) and blue (mallory, the attacker), and the service login."""

    url: str
    red: str
    blue: str
    alice: str
    mallory: str
    service: str

    def url_of(self, login: str) -> str:
        return as_role(self.url, login)


def make_teams(url: str) -> Teams:
    """Roles are the server's, not one database's: each test's are its own names."""
    tag = uuid.uuid4().hex[:8]
    teams = Teams(url, f"red_{tag}", f"blue_{tag}", f"alice_{tag}", f"mallory_{tag}", f"svc_{tag}")
    operator = Store(as_role(url, "postgres"))  # a superuser: BYPASSRLS takes one
    try:
        operator.add_team(teams.red)
        operator.add_team(teams.blue)
        assert operator.add_member(teams.red, teams.alice)
        assert operator.add_member(teams.blue, teams.mallory)
        assert operator.add_service(teams.service)
    finally:
        operator.close()
    return teams


@pytest.fixture
def connect() -> Iterator[Any]:
    """Open direct connections (an attacker's psql), each closed after the test."""
    engines: list[Any] = []

    def opened(url: str) -> Connection:
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        engines.append(engine)
        return engine.connect()

    yield opened
    for engine in engines:
        engine.dispose()


@pytest.fixture
def on_own_database(tmp_path: Any, request: pytest.FixtureRequest) -> Iterator[tuple[Teams, Store]]:
    """Two teams on a database of the test's own, and a store on it with the service's login."""
    teams = make_teams(migrated_database("postgresql", tmp_path, request))
    service = Store(teams.url_of(teams.service))
    yield teams, service
    service.close()


def refused(connection: Connection, sql: str, **params: Any) -> str:
    """The error PostgreSQL answers ``sql`` with (the test fails if it is done)."""
    with pytest.raises(DBAPIError) as raised:
        connection.execute(text(sql), params)
    return str(raised.value.orig)


def start_driver(fleet: Fleet, url: str) -> None:
    with (fleet.home / "driver.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.cli", "driver", "--name", "driver-svc"],
            env={**fleet.env, "FLEET_DATABASE_URL": url, "FLEET_DRIVER_LEASE_SECONDS": "3"},
            cwd=fleet.home,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    fleet.procs.append(proc)
    fleet.wait_for(lambda: fleet.store.workers(role="driver", within=5), what="the driver")


def spec_of(fleet: Fleet, name: str, optimize: str) -> str:
    """The test kernel, each team's with its own build flags: the same problem, nothing shared by key between them."""
    spec = kernel_spec(fleet, name=name)
    spec["workload"] = {**spec["workload"], "warmup": 0, "repeats": 1}
    spec["workload"]["build"] = ["gcc", optimize, *spec["workload"]["build"][2:]]
    return str(write_spec(fleet.home, spec, f"{name}.json"))


def test_a_submitters_own_connection_reaches_no_other_teams_rows_and_the_service_runs_both(
    fleet: Fleet, connect: Any
) -> None:
    teams = make_teams(fleet.env["FLEET_DATABASE_URL"])
    service = teams.url_of(teams.service)
    fleet.start_worker(env={"FLEET_DATABASE_URL": service})
    start_driver(fleet, service)
    for login, name, optimize in ((teams.alice, "victim", "-O1"), (teams.mallory, "attacker", "-O2")):
        # A submitter needs no broker: the database is all it is given.
        alone = {"FLEET_DATABASE_URL": teams.url_of(login), "FLEET_BROKER_URL": ""}
        done = fleet.cli("submit", spec_of(fleet, name, optimize), env=alone)
        assert done.returncode == 0, done.stderr
    for name in ("victim", "attacker"):
        fleet.wait_for(lambda n=name: fleet.store.campaign(n).status == "done", timeout=180, what=f"{name} to end")
    victim, attacker = fleet.store.campaign("victim"), fleet.store.campaign("attacker")
    assert (victim.team, attacker.team) == (teams.red, teams.blue)
    with fleet.store.session() as session:  # the operator's view: every row
        trials = list(session.scalars(select(Trial.id).where(Trial.campaign_id == victim.id)))
        build_keys = set(session.scalars(select(Trial.build_key).where(Trial.campaign_id == victim.id)))
        artifact_blobs = set(session.scalars(select(Artifact.blob_digest).where(Artifact.build_key.in_(build_keys))))
        measured = session.scalar(
            select(text("count(*)")).select_from(Measurement).where(Measurement.trial_id.in_(trials))
        )
    assert len(trials) == measured == 8 and len(artifact_blobs) == len(build_keys) == 4  # grid 6, baseline 2

    mallory = connect(teams.url_of(teams.mallory))
    seen = {table: mallory.scalar(text(f"SELECT count(*) FROM {table}")) for table in RLS_TABLES}
    assert (
        mallory.scalar(
            text("SELECT count(*) FROM campaigns WHERE id = :id OR team = :red"), {"id": victim.id, "red": teams.red}
        )
        == 0
    )
    assert mallory.scalar(text("SELECT count(*) FROM trials WHERE campaign_id = :id"), {"id": victim.id}) == 0
    assert mallory.scalar(text("SELECT count(*) FROM measurements WHERE trial_id = ANY(:t)"), {"t": trials}) == 0
    assert (
        mallory.scalar(text("SELECT count(*) FROM artifacts WHERE build_key = ANY(:k)"), {"k": list(build_keys)}) == 0
    )
    assert mallory.scalar(text("SELECT count(*) FROM blobs WHERE digest = ANY(:d)"), {"d": list(artifact_blobs)}) == 0
    assert seen["campaigns"] == 1 and seen["trials"] == seen["measurements"] == 8  # its own, all of them

    # Change the victim's rows: each is refused, or finds no row to change.
    assert (
        mallory.execute(text("UPDATE campaigns SET status = 'cancelled' WHERE id = :id"), {"id": victim.id}).rowcount
        == 0
    )
    assert (
        mallory.execute(text("UPDATE trials SET state = 'errored' WHERE campaign_id = :id"), {"id": victim.id}).rowcount
        == 0
    )
    assert (
        mallory.execute(text("UPDATE campaigns SET priority = 100 WHERE team = :red"), {"red": teams.red}).rowcount == 0
    )
    assert "permission denied" in refused(
        mallory, "UPDATE campaigns SET team = :red WHERE id = :id", red=teams.red, id=attacker.id
    )
    assert "permission denied" in refused(mallory, "DELETE FROM trials WHERE campaign_id = :id", id=victim.id)
    assert "permission denied" in refused(mallory, "DELETE FROM campaigns")
    forged = (
        "INSERT INTO measurements (trial_id, problem_id, target, measure_key, objective_name, maximize, objective,"
        " valid, samples, metrics, toolchain, created_at) SELECT id, problem_id, target, measure_key, 'score', true,"
        " 1e308, true, '[]', '{}', '', now() FROM trials WHERE id = :id"
    )
    assert "permission denied" in refused(mallory, forged, id=trials[0])
    assert "permission denied" in refused(
        mallory, "UPDATE trials SET measure_key = 'x' WHERE campaign_id = :id", id=attacker.id
    )
    assert "permission denied" in refused(
        mallory, "UPDATE trials SET source_trial_id = :t WHERE campaign_id = :id", t=trials[0], id=attacker.id
    )
    assert "permission denied" in refused(
        mallory,
        "INSERT INTO artifacts (build_key, problem_id, target, build_config, toolchain, state, attempts, created_at)"
        " VALUES ('k', 1, 't', '{}', '', 'built', 0, now())",
    )
    new_campaign = (
        "INSERT INTO campaigns (name, target, space, strategy, workload, workload_key, options, provenance, status,"
        " submitted, priority, created_at, team) VALUES ('forged', 't', '{}', '{}', '{}', 'k', '{}', '{}', 'running',"
        " true, 1, now(), :team)"
    )
    assert "row-level security" in refused(mallory, new_campaign, team=teams.red)
    assert "row-level security" in refused(mallory, new_campaign, team=None)
    assert "row-level security" in refused(
        mallory, "INSERT INTO campaign_problems (campaign_id, problem_id, position) VALUES (:id, 1, 9)", id=victim.id
    )
    # A stored source under another's digest would be what that campaign builds: only bytes' own digests are kept.
    assert "row-level security" in refused(
        mallory, "INSERT INTO blobs (digest, size, data, created_at) VALUES (:d, 1, 'x', now())", d="0" * 64
    )
    # Become someone else, or switch the policies off.
    assert "permission denied" in refused(mallory, f"SET ROLE {teams.red}")
    assert "permission denied" in refused(mallory, f"SET ROLE {teams.service}")
    assert "permission denied" in refused(mallory, f"SET ROLE {teams.alice}")
    assert "must be owner" in refused(mallory, "ALTER TABLE campaigns DISABLE ROW LEVEL SECURITY")
    assert "must be owner" in refused(mallory, "DROP POLICY team_rows ON trials")
    mallory.execute(text("SET row_security = off"))
    assert "row-level security" in refused(mallory, "SELECT count(*) FROM trials")
    mallory.execute(text("RESET row_security"))
    # A session's own table cannot stand in for the catalog the policies read.
    mallory.execute(text("CREATE TEMP TABLE pg_roles AS SELECT rolname, oid FROM pg_catalog.pg_roles"))
    mallory.execute(
        text("UPDATE pg_temp.pg_roles SET oid = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)")
    )
    assert mallory.scalar(text("SELECT count(*) FROM campaigns WHERE id = :id"), {"id": victim.id}) == 0

    # Nothing of the victim's moved; the victim's own login sees all of it, and Fleet's commands show each its own.
    after = fleet.store.campaign("victim")
    assert (after.status, after.team, after.priority) == ("done", teams.red, 1.0)
    assert fleet.store.trial_counts(victim.id) == {"evaluated": 8}
    alice = connect(teams.url_of(teams.alice))
    assert alice.scalar(text("SELECT count(*) FROM measurements WHERE trial_id = ANY(:t)"), {"t": trials}) == 8
    assert alice.scalar(text("SELECT count(*) FROM blobs WHERE digest = ANY(:d)"), {"d": list(artifact_blobs)}) == 4
    as_mallory = {"FLEET_DATABASE_URL": teams.url_of(teams.mallory)}
    status = fleet.cli("status", env=as_mallory)
    assert status.returncode == 0, status.stderr
    assert "attacker" in status.stdout and "victim" not in status.stdout
    for args in (
        ("status", "victim"),
        ("trials", "victim"),
        ("best", "victim"),
        ("report", "victim"),
        ("cancel", "victim"),
        ("pause", "victim"),
    ):
        done = fleet.cli(*args, env=as_mallory)
        assert done.returncode == 1 and "no campaign 'victim'" in done.stderr, (args, done.stderr)
    best = fleet.cli("best", "--kind", "kernel", "--from", "all", "--json", env=as_mallory)
    assert best.returncode == 0, best.stderr
    assert "victim" not in best.stdout and "attacker" in best.stdout
    assert f"--from all: the campaigns of your teams ({teams.blue})" in best.stderr
    as_alice = {"FLEET_DATABASE_URL": teams.url_of(teams.alice)}
    assert fleet.cli("best", "victim", env=as_alice).returncode == 0
    assert fleet.cli("report", "victim", env=as_alice).returncode == 0


def test_submit_takes_the_logins_one_team_and_refuses_in_one_line_what_it_cannot_tell(fleet: Fleet) -> None:
    teams = make_teams(fleet.env["FLEET_DATABASE_URL"])
    operator = {"FLEET_DATABASE_URL": teams.url_of("postgres")}
    as_alice = {"FLEET_DATABASE_URL": teams.url_of(teams.alice)}
    as_mallory = {"FLEET_DATABASE_URL": teams.url_of(teams.mallory)}

    done = fleet.cli("submit", spec_of(fleet, "mine", "-O1"), env=as_alice)
    assert done.returncode == 0, done.stderr
    assert f"team {teams.red})" in done.stdout
    for steer in ("pause", "cancel"):  # a team's login steers its own campaigns
        steered = fleet.cli(steer, "mine", env=as_alice)
        assert steered.returncode == 0, steered.stderr
    assert fleet.store.campaign("mine").status == "cancelled"
    # An import writes measurements, which no team's login may: one line, nothing stored.
    imported = fleet.cli("import", "kt", str(SPACES / "pnpoly__RTX_2080_Ti.json.gz"), env=as_alice)
    assert imported.returncode == 1 and " refused: " in imported.stderr, imported.stderr
    assert len(imported.stderr.strip().splitlines()) == 1
    assert [c.name for c in fleet.store.campaigns()] == ["mine"]
    taken = fleet.cli("submit", spec_of(fleet, "mine", "-O2"), env=as_mallory)
    assert taken.returncode == 1
    assert taken.stderr.strip().splitlines() == [
        "fleet: error: campaign name 'mine' is taken (by a campaign you may not see): choose another"
    ]
    not_mine = fleet.cli("submit", spec_of(fleet, "theirs", "-O2"), "--team", teams.red, env=as_mallory)
    assert not_mine.returncode == 1 and f"is not a member of team '{teams.red}'" in not_mine.stderr

    # A login in two teams names one; in none, it is told who adds it.
    assert fleet.cli("team", "member", teams.blue, teams.alice, env=operator, check=True)
    both = fleet.cli("submit", spec_of(fleet, "both", "-O2"), env=as_alice)
    assert both.returncode == 1 and "name the campaign's with --team or FLEET_TEAM" in both.stderr
    named = fleet.cli("submit", spec_of(fleet, "both", "-O2"), env={**as_alice, "FLEET_TEAM": teams.blue}, check=True)
    assert f"team {teams.blue})" in named.stdout
    loner = f"loner_{teams.red[4:]}"
    with Store(teams.url_of("postgres")).transaction() as connection:
        connection.execute(text(f"CREATE ROLE {loner} LOGIN"))
    alone = fleet.cli("submit", spec_of(fleet, "alone", "-O3"), env={"FLEET_DATABASE_URL": teams.url_of(loner)})
    assert alone.returncode == 1 and "refused: permission denied for table alembic_version" in alone.stderr

    # The operator's own campaign has no team: no team's login sees it.
    fleet.cli("submit", spec_of(fleet, "operators", "-O3"), check=True)
    assert fleet.store.campaign("operators").team is None
    status = fleet.cli("status", env=as_mallory, check=True).stdout
    assert "both" in status and "mine" not in status and "operators" not in status
    assert f"team {teams.blue}" in status and teams.red not in status
    one = json.loads(fleet.cli("status", "both", "--json", env=as_mallory, check=True).stdout)
    assert one["campaigns"][0]["team"] == teams.blue
    assert "team" not in json.loads(fleet.cli("status", "operators", "--json", check=True).stdout)["campaigns"][0]
    listed = fleet.cli("team", "list", env=operator, check=True).stdout.splitlines()
    assert listed == [
        f"{teams.blue}  1 campaigns  members: {teams.alice}, {teams.mallory}",
        f"{teams.red}  1 campaigns  members: {teams.alice}",
    ]
    # A team's login makes no team, and a name that is not a plain role name is refused.
    made = fleet.cli("team", "add", f"x_{teams.red}", env=as_mallory)
    assert made.returncode == 1 and "permission denied" in made.stderr and len(made.stderr.splitlines()) == 1
    bad = fleet.cli("team", "add", "Red-Team", env=operator)
    assert bad.returncode == 1 and "a role name is lower-case letters" in bad.stderr
    login_as_team = fleet.cli("team", "add", teams.alice, env=operator)
    assert login_as_team.returncode == 1 and "exists and is a login" in login_as_team.stderr


def test_teams_need_postgresql(tmp_path: Any, request: pytest.FixtureRequest) -> None:
    url = migrated_database("sqlite", tmp_path, request)
    env = {**os.environ, "FLEET_DATABASE_URL": url, "FLEET_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "team", "add", "red"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip().endswith("teams are PostgreSQL roles; an SQLite database has one user")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_migration_keeps_a_databases_campaigns_for_its_operators(
    backend: str, tmp_path: Any, request: pytest.FixtureRequest, connect: Any
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("postgres_server").create_database(f"m{uuid.uuid4().hex[:12]}")
    store = Store(url)
    try:
        with store.engine.begin() as connection:
            command.upgrade(store._alembic(connection), "0013")
        with store.engine.begin() as connection:
            connection.execute(text(OLD_CAMPAIGN))
            for old in OLD_MS_RECORD:
                connection.execute(text(old))
        assert store.upgrade() == store.head() == "0015"
        old = store.campaign("old")
        assert (old.team, old.status) == (None, "running")
        with store.engine.connect() as connection:
            assert connection.scalar(text("SELECT team FROM ms_records")) == ""  # the operators'
        if backend == "sqlite":
            return
        with store.engine.connect() as connection:
            secured = set(connection.scalars(text("SELECT relname FROM pg_class WHERE relrowsecurity")))
        assert secured == set(RLS_TABLES)
        teams = make_teams(url)
        for table in ("campaigns", "ms_records", "ms_workloads"):
            assert connect(teams.url_of(teams.alice)).scalar(text(f"SELECT count(*) FROM {table}")) == 0
            assert connect(teams.url_of(teams.service)).scalar(text(f"SELECT count(*) FROM {table}")) == 1
        with store.engine.begin() as connection:
            command.downgrade(store._alembic(connection), "0013")
        with store.engine.connect() as connection:
            assert not list(connection.scalars(text("SELECT relname FROM pg_class WHERE relrowsecurity")))
        assert store.upgrade() == "0015"
    finally:
        store.close()


OLD_MS_RECORD = (
    "INSERT INTO ms_workloads (shash, line, line_key, tvm, created_at) VALUES ('1', '[\"1\", \"AA\"]', 'w', '',"
    " CURRENT_TIMESTAMP)",
    "INSERT INTO ms_records (workload_id, record, record_key, mean_seconds, target, provenance, created_at)"
    " SELECT id, '[]', 'r', 0.5, 'llvm', '{}', CURRENT_TIMESTAMP FROM ms_workloads",
)
OLD_CAMPAIGN = (
    "INSERT INTO campaigns (name, target, space, strategy, workload, workload_key, options, provenance, status,"
    " submitted, priority, created_at) VALUES ('old', 't', '{}', '{}', '{}', 'k', '{}', '{}', 'running', true, 1,"
    " CURRENT_TIMESTAMP)"
)


def test_a_measurement_another_team_reused_shows_to_it_by_its_key_only(
    tmp_path: Any, request: pytest.FixtureRequest, connect: Any
) -> None:
    teams = make_teams(migrated_database("postgresql", tmp_path, request))
    service = Store(teams.url_of(teams.service))
    try:
        problem = make_problem(service)
        red = make_campaign(service, "red", problem_ids=[problem], team=teams.red)
        blue = make_campaign(service, "blue", problem_ids=[problem], team=teams.blue)
        [measured] = add(service, red, {"tile": 1})
        reusing, other = add(service, blue, {"tile": 1}, {"tile": 2})  # the first has the same measure key
        with service.session() as session:
            key = session.get(Trial, measured).measure_key  # type: ignore[union-attr]
            session.add(
                Measurement(
                    trial_id=measured, problem_id=problem, target=red.target, measure_key=key, objective_name="s",
                    objective=1.0, samples=[1.0], metrics={}, objectives={},
                )
            )  # fmt: skip
            session.execute(update(Trial).where(Trial.id == other).values(source_trial_id=measured))
        mallory = connect(teams.url_of(teams.mallory))
        count = "SELECT count(*) FROM measurements WHERE trial_id = :t"
        assert mallory.scalar(text(count), {"t": measured}) == 0  # named as the source of a trial of another key
        with service.session() as session:
            session.execute(update(Trial).where(Trial.id == reusing).values(source_trial_id=measured))
        assert mallory.scalar(text(count), {"t": measured}) == 1  # what its own trial reused
        assert mallory.scalar(text("SELECT count(*) FROM trials WHERE id = :t"), {"t": measured}) == 0
        # Problems are shared: a row planted under the key of another's parameters is refused, not tuned.
        planted = "INSERT INTO problems (kind, params, params_key, created_at) VALUES ('conv', :p, :k, now())"
        mallory.execute(text(planted), {"p": '{"n": 666}', "k": digest({"n": 1})})
        victim = Store(teams.url_of(teams.alice))
        with pytest.raises(StoreError, match=r"stored under the key of .* with other parameters: a forged row"):
            victim.add_problem("conv", {"n": 1})
        victim.close()
        assert "permission denied" in refused(mallory, "INSERT INTO miopen_keys VALUES (:p, 'forged')", p=problem)
        # Written in bulk through the driver's own cursor, a refused row is one line too.
        attacker = Store(teams.url_of(teams.mallory))
        row = {"campaign_id": blue.id, "problem_id": problem, "target": blue.target, "config": {}, "config_key": "k"}
        refusal = pytest.raises(StoreError, match="refused: permission denied for table trials")
        with refusal, attacker.transaction() as connection:
            attacker.insert_many(connection, Trial, [{**row, "build_key": "b", "measure_key": key}])
        attacker.close()
    finally:
        service.close()


def ms_dir(path: Path, shash: str, seconds: float) -> Path:
    """A MetaSchedule JSON database of one workload and one record of it (a made-up trace: nothing builds it)."""
    path.mkdir()
    (path / WORKLOADS).write_text(json.dumps([shash, "AAAA"]) + "\n")
    (path / RECORDS).write_text(json.dumps([0, [[[], []], [seconds], {"kind": "llvm"}, []]]) + "\n")
    return path


def test_metaschedule_records_are_their_teams_and_an_operators_are_no_teams(
    fleet: Fleet, connect: Any, tmp_path: Path
) -> None:
    teams = make_teams(fleet.env["FLEET_DATABASE_URL"])
    operator = {"FLEET_DATABASE_URL": teams.url_of("postgres")}
    as_mallory = {"FLEET_DATABASE_URL": teams.url_of(teams.mallory)}
    reds = ms_dir(tmp_path / "reds", "111", 0.001)
    imported = fleet.cli("tvm", "import-ms", str(reds), "--team", teams.red, env=operator, check=True)
    assert imported.stdout.startswith("1 records and 1 workloads imported")
    fleet.cli("tvm", "import-ms", str(ms_dir(tmp_path / "ours", "222", 0.002)), env=operator, check=True)
    with fleet.store.session() as session:
        assert sorted(session.scalars(text("SELECT team FROM ms_records"))) == ["", teams.red]

    # The attacker's own connection and commands read none of them: neither red's nor the operators'.
    mallory = connect(teams.url_of(teams.mallory))
    assert mallory.scalar(text("SELECT count(*) FROM ms_records")) == 0
    assert mallory.scalar(text("SELECT count(*) FROM ms_workloads")) == 0
    exported = fleet.cli("tvm", "export-ms", str(tmp_path / "out"), env=as_mallory, check=True)
    assert exported.stdout.startswith("0 records and 0 workloads written")
    assert "permission denied" in refused(mallory, "UPDATE ms_records SET team = :blue", blue=teams.blue)
    assert "permission denied" in refused(mallory, "DELETE FROM ms_records")
    assert "permission denied" in refused(
        mallory,
        "INSERT INTO ms_records (workload_id, record, record_key, target, provenance, created_at, team)"
        " VALUES (1, '[]', 'k', 'llvm', '{}', now(), :blue)",
        blue=teams.blue,
    )
    planted = fleet.cli("tvm", "import-ms", str(ms_dir(tmp_path / "mine", "333", 1e-9)), env=as_mallory)
    assert planted.returncode == 1 and "permission denied" in planted.stderr, planted.stderr
    assert len(planted.stderr.strip().splitlines()) == 1
    # Red's login reads red's, with its workload, and not the operators'.
    alice = connect(teams.url_of(teams.alice))
    assert list(alice.scalars(text("SELECT team FROM ms_records"))) == [teams.red]
    assert list(alice.scalars(text("SELECT shash FROM ms_workloads"))) == ["111"]
    as_alice = {"FLEET_DATABASE_URL": teams.url_of(teams.alice)}
    exported = fleet.cli("tvm", "export-ms", str(tmp_path / "reds-out"), env=as_alice, check=True)
    assert exported.stdout.startswith("1 records and 1 workloads written")
    assert (tmp_path / "reds-out" / WORKLOADS).read_text() == (reds / WORKLOADS).read_text()
    # The operator's and the service's view is every record.
    for login in ("postgres", teams.service):
        assert connect(teams.url_of(login)).scalar(text("SELECT count(*) FROM ms_records")) == 2
    # The same records imported for blue are blue's own copy, not "already there" because red has them.
    again = fleet.cli("tvm", "import-ms", str(reds), env={**operator, "FLEET_TEAM": teams.blue}, check=True)
    assert again.stdout.startswith("1 records and 0 workloads imported") and "0 records already there" in again.stdout
    assert list(mallory.scalars(text("SELECT team FROM ms_records"))) == [teams.blue]
    twice = fleet.cli("tvm", "import-ms", str(reds), "--team", teams.blue, env=operator, check=True)
    assert twice.stdout.startswith("0 records") and "1 records already there" in twice.stdout


def test_a_team_tags_only_its_own_problems_and_changes_no_problem_or_golden_set(
    on_own_database: tuple[Teams, Store], connect: Any
) -> None:
    teams, service = on_own_database
    victims, shared, own = make_problem(service, 1), make_problem(service, 2), make_problem(service, 3)
    make_campaign(service, "red", problem_ids=[victims, shared], team=teams.red)
    make_campaign(service, "blue", problem_ids=[shared, own], team=teams.blue)
    mallory = connect(teams.url_of(teams.mallory))
    tag = "INSERT INTO problem_tags (problem_id, tag) VALUES (:p, :t)"
    assert "row-level security" in refused(mallory, tag, p=victims, t="planted")
    mallory.execute(text(tag), {"p": own, "t": "mine"})
    mallory.execute(text(tag), {"p": shared, "t": "ours"})  # a problem of its own campaign, shared by key
    # Every login still reads every tag; no team's login changes or removes one, or a problem.
    assert mallory.scalar(text("SELECT count(*) FROM problem_tags WHERE tag = 'planted'")) == 0
    assert connect(teams.url_of(teams.alice)).scalar(text("SELECT count(*) FROM problem_tags")) == 2
    for sql in (
        "UPDATE problem_tags SET tag = 'x'",
        "DELETE FROM problem_tags",
        "UPDATE problems SET params = '{\"n\": 666}'",
        "UPDATE problems SET params_key = 'x', kind = 'y'",
        "DELETE FROM problems",
        "INSERT INTO problems (kind, params, params_key, created_at) SELECT kind, '{\"n\": 666}', params_key, now()"
        " FROM problems ON CONFLICT (kind, params_key) DO UPDATE SET params = excluded.params",
        # Golden sets are the operators': no team's login reads or writes one.
        "SELECT count(*) FROM golden_versions",
        "SELECT count(*) FROM golden_entries",
        "INSERT INTO golden_versions (target, version, campaigns, provenance, created_at)"
        " VALUES ('t', 99, '[]', '{}', now())",
    ):
        assert "permission denied" in refused(mallory, sql), sql


def test_tune_ms_for_a_team_gives_it_the_campaign_and_the_records(fleet: Fleet, connect: Any) -> None:
    pytest.importorskip("tvm")
    teams = make_teams(fleet.env["FLEET_DATABASE_URL"])
    service = {"FLEET_DATABASE_URL": teams.url_of(teams.service)}
    fleet.start_worker("--eval-procs", "1", "--build-procs", "1", env=service)
    tuned = fleet.cli(
        "tvm", "tune-ms", "tvm.dense", "--param=m=16", "--param=k=128", "--param=n=10", "--target", fleet.target,
        "--trials", "2", "--per-iter", "2", "--cost-model", "random", "--number", "1", "--min-repeat-ms", "1",
        "--team", teams.red, "--json", env=service, timeout=600, check=True,
    )  # fmt: skip
    campaign = fleet.store.campaign(json.loads(tuned.stdout)["campaign"])
    assert campaign.team == teams.red
    with fleet.store.session() as session:
        records = list(session.scalars(text("SELECT team FROM ms_records")))
    assert records and set(records) == {teams.red}
    alice, mallory = connect(teams.url_of(teams.alice)), connect(teams.url_of(teams.mallory))
    assert alice.scalar(text("SELECT count(*) FROM ms_records")) == len(records)
    assert alice.scalar(text("SELECT count(*) FROM ms_workloads")) == 1
    assert mallory.scalar(text("SELECT count(*) FROM ms_records")) == 0
    assert mallory.scalar(text("SELECT count(*) FROM ms_workloads")) == 0
    assert mallory.scalar(text("SELECT count(*) FROM campaigns WHERE id = :id"), {"id": campaign.id}) == 0
