"""``fleet status`` of the whole database, and ``status``, ``best``, ``trials`` and ``report`` of one campaign, read
it through :mod:`fleet.glance` (no SQLAlchemy): the same output as through the store, on both backends, for a
database with something of everything the views show."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text, update

import fleet.cli.campaigns as campaigns
from fleet.cli import cli
from fleet.cli._common import open_store
from fleet.glance import Glance, open_glance
from fleet.settings import reset_settings
from fleet.store import Campaign, Store, TrialResult
from tests.integration.test_store import (
    TARGET,
    add,
    evaluate,
    make_campaign,
    make_problem,
    new_trial,
    reuse_claim,
)


def fill(store: Store) -> None:
    """Campaigns running, done, done with no valid result (a failure), one with annealing chains, one held by
    a driver and one of a team; workers live, stopped and unhealthy."""
    running = make_campaign(store, "running")
    add(store, running, {"tile": 1}, {"tile": 2})
    done = make_campaign(store, "done", problem_ids=[make_problem(store, 1), make_problem(store, 2)])
    first, second = (p.id for p in store.campaign_problems(done.id))
    evaluate(store, add(store, done, {"tile": 1}, problem_id=first)[0], 2.0)
    evaluate(store, add(store, done, {"tile": 2}, problem_id=second)[0], 3.0, valid=False, state="invalid")
    store.set_campaign_status(done.id, "done")
    failed = make_campaign(store, "failed")
    for trial_id in add(store, failed, {"tile": 1}, {"tile": 2}):
        assert store.claim(trial_id, "compile", "b", 60, 3) is not None
        assert store.record(trial_id, "b", state="errored", reason="build failed\nline two")
    store.set_campaign_status(failed.id, "done")
    annealed = make_campaign(store, "annealed", strategy={"name": "anneal"})
    problem = store.campaign_problems(annealed.id)[0].id
    store.create_chains(annealed.id, problem, [{"tile": 1}, {"tile": 4}], seed=1, steps=10, temperature=1.0)
    driven = make_campaign(store, "driven")
    assert store.take_campaign(driven.id, "driver-a", 60)
    teamed = make_campaign(store, "teamed")
    with store.session() as session:  # as an operator gives a campaign to a team (the column is on SQLite too)
        session.execute(update(Campaign).where(Campaign.id == teamed.id).values(team="red"))
    for name, role, gpu in (("eval-gpu0@n1", "eval", "0"), ("build@n1", "build", None), ("driver-a", "driver", None)):
        store.register_worker(
            name=name, hostname="n1", role=role, target=TARGET if role != "driver" else "-",
            queues=[f"{role}.{TARGET}"] if role != "driver" else [], gpu=gpu, gpus=[], cpus=2, concurrency=1, pid=1,
        )  # fmt: skip
    store.set_fault("build@n1", "the disk is full")
    store.register_worker(
        name="gone@n2", hostname="n2", role="eval", target=TARGET, queues=[], gpu="1", gpus=[], cpus=2,
        concurrency=1, pid=2,
    )  # fmt: skip
    store.worker_stopped("gone@n2")


@pytest.fixture
def filled(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    fill(store)
    monkeypatch.setenv("FLEET_DATABASE_URL", store.url)
    monkeypatch.setenv("FLEET_BROKER_URL", f"filesystem://{tmp_path / 'broker'}")
    reset_settings()
    return store


def status(*args: str, command: str = "status") -> str:
    done = CliRunner().invoke(cli, [command, *args], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.output


@pytest.mark.parametrize("args", [(), ("--json",)])
def test_fleet_status_through_the_glance_says_what_it_says_through_the_store(
    filled: Store, args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    real = campaigns.glance_or_store
    monkeypatch.setattr(campaigns, "glance_or_store", lambda: opened.append(real()) or opened[-1])
    quick = status(*args)
    assert isinstance(opened[0], Glance)
    monkeypatch.setattr(campaigns, "glance_or_store", lambda: open_store(read_only=True))
    assert quick == status(*args)
    lines = ("failed: no valid measurement", "chain 1 of", "driven by driver-a", "unhealthy since", "done", "team red")
    for line in lines:
        assert line in quick or args, line


def test_a_database_the_glance_cannot_read_is_left_to_the_store(store: Store, tmp_path: Path) -> None:
    assert open_glance(store.url) is not None
    assert open_glance(f"sqlite:///{tmp_path}/missing.db") is None  # the store says where it looked
    empty = tmp_path / "empty.db"
    empty.touch()
    assert open_glance(f"sqlite:///{empty}") is None  # no schema: the store says to run fleet db upgrade
    assert open_glance("mysql://db/fleet") is None


def summaries(reader: Any, ref: str) -> list[tuple[Any, ...]]:
    """What :func:`fleet.driving.summary.summarize` finds of campaign ``ref`` through ``reader``: each problem's
    best and baseline (their attributes), counts and speedup."""
    from fleet.driving.summary import summarize

    def fields(result: Any) -> dict[str, Any] | None:
        return None if result is None else {name: getattr(result, name) for name in TrialResult.__dataclass_fields__}

    found = summarize(reader, reader.campaign(ref))
    return [(s.problem_id, fields(s.best), fields(s.baseline), list(s.counts.items()), s.speedup) for s in found]


def fill_bests(store: Store, goal: str) -> None:
    """Two campaigns of one goal: bests tied (the earlier wins), beaten by an invalid run, measured or reused,
    baselines of each run-time knob's value and of none, a problem with errors alone and one with nothing."""
    problems = [make_problem(store, n) for n in range(4)]
    knobs = {"tile": [1, 2, 4], "scale": {"values": [1, 2, 3], "build": False}}
    workload = {"kind": "command", "run": ["./k", "{tile}", "{scale}"], "objective": {"json": "s", "goal": goal}}
    first = make_campaign(store, f"first-{goal}", problem_ids=problems, space={"knobs": knobs}, workload=workload)
    second = make_campaign(store, f"second-{goal}", problem_ids=problems[:1], space={"knobs": knobs}, workload=workload)

    def score(seconds: float) -> float:
        return seconds if goal == "min" else 10 - seconds

    def trial(campaign: Any, problem: int, tile: int, scale: int, baseline: bool = False) -> int:
        config = {"tile": tile, "scale": scale}
        [(trial_id, _)] = store.add_trials(campaign.id, TARGET, [new_trial(problem, config, baseline=baseline)])
        return trial_id

    a, b, c, _ = problems
    evaluate(store, trial(first, a, 1, 1, baseline=True), score(5.0))
    evaluate(store, trial(first, a, 1, 3, baseline=True), score(0.5), valid=False, state="invalid")
    evaluate(store, trial(first, a, 1, 2, baseline=True), score(8.0))
    evaluate(store, trial(first, a, 4, 2), score(2.0), metrics={"gflops": 9.0})
    evaluate(store, trial(first, a, 2, 2), score(2.0))
    evaluate(store, trial(first, a, 4, 3), score(1.0), valid=False, state="invalid")
    evaluate(store, trial(first, b, 1, 1, baseline=True), score(4.0))
    evaluate(store, trial(first, b, 2, 3), score(1.5))
    errored = trial(first, c, 1, 1)
    assert store.claim(errored, "compile", "b", 60, 3) is not None
    assert store.record(errored, "b", state="errored", reason="build failed")
    reused = trial(second, a, 4, 2)
    assert store.record(reused, "evaluator", state="evaluated", source=reuse_claim(store, reused).reuse)
    evaluate(store, trial(second, a, 1, 1), score(7.0))
    evaluate(store, trial(second, a, 2, 2), score(2.0))
    for campaign in (first, second):
        store.set_campaign_status(campaign.id, "done")


@pytest.mark.parametrize("goal", ["min", "max"])
def test_a_campaigns_summary_through_the_glance_is_the_stores(store: Store, goal: str) -> None:
    fill_bests(store, goal)
    glance = open_glance(store.url)
    assert glance is not None
    try:
        for ref in (f"first-{goal}", f"second-{goal}"):
            assert summaries(glance, ref) == summaries(store, ref)
    finally:
        glance.close()


@pytest.mark.parametrize("command", ["status", "best", "trials"])
def test_a_campaigns_status_best_and_trials_through_the_glance_say_what_they_say_through_the_store(
    filled: Store, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_bests(filled, "min")
    fill_bests(filled, "max")
    names = [f"{which}-{goal}" for which in ("first", "second") for goal in ("min", "max")]
    opened: list[Any] = []
    real = campaigns.glance_or_store
    monkeypatch.setattr(campaigns, "glance_or_store", lambda: opened.append(real()) or opened[-1])
    if command == "trials":  # the reasons of reused and failed trials, several lines long, too
        names += ["failed"]
    options = ((), ("--json",), ("--state", "errored")) if command == "trials" else ((), ("--json",))
    quick = [status(name, *args, command=command) for name in names for args in options]
    assert opened and all(isinstance(reader, Glance) for reader in opened)
    monkeypatch.setattr(campaigns, "glance_or_store", lambda: open_store(read_only=True))
    assert quick == [status(name, *args, command=command) for name in names for args in options]
    shown = {
        "status": ("best of", "failed x1"),
        "best": ("x the baseline", "no valid measurement"),
        "trials": ("(baseline)", "build failed"),
    }[command]
    assert any(all(line in out for line in shown) for out in quick)


def test_a_campaign_whose_searcher_judges_its_best_or_whose_fronts_are_asked_for_is_read_through_the_store(
    filled: Store, caplog: pytest.LogCaptureFixture
) -> None:
    make_campaign(filled, "judged", strategy={"name": "step"})
    with caplog.at_level(logging.INFO, logger="fleet.cli"):
        reader, campaign = campaigns.glance_at_campaign("judged")
    assert isinstance(reader, Store) and campaign.name == "judged"
    assert [r.getMessage().startswith("database: ") for r in caplog.records] == [True]  # `fleet -v` names it once
    reader.close()
    # The report's best is the best measurement, which no searcher judges: a glance reads it.
    reader, campaign = campaigns.glance_at_campaign("judged", judged=False)
    assert isinstance(reader, Glance) and campaign.name == "judged"
    reader.close()
    reader, campaign = campaigns.glance_at_campaign("running")
    assert isinstance(reader, Glance) and campaign.name == "running"
    reader.close()
    objectives = [{"name": "s", "json": "s"}, {"name": "j", "json": "j"}]
    make_campaign(filled, "fronts", workload={"kind": "command", "run": ["./k"], "objectives": objectives})
    reader, _ = campaigns.glance_at_campaign("fronts")
    assert isinstance(reader, Glance)  # its status needs no front
    reader.close()
    reader, _ = campaigns.glance_at_campaign("fronts", fronts=True)
    assert isinstance(reader, Store)
    reader.close()


def test_a_report_through_the_glance_is_the_stores(store: Store) -> None:
    """Chains on the fleet (each trial in its first visitor's series), baselines, a reused best, failures."""
    from fleet.report import render
    from tests.integration.test_report import same_page, through_glance

    fill_bests(store, "min")
    workload = {"kind": "command", "run": ["./k"], "objective": {"json": "s", "goal": "min"}}
    annealed = make_campaign(store, "annealed", strategy={"name": "anneal"}, workload=workload)
    problem = store.campaign_problems(annealed.id)[0].id
    store.create_chains(annealed.id, problem, [{"tile": 1}, {"tile": 4}], seed=1, steps=10, temperature=1.0)
    trials = add(store, annealed, {"tile": 2}, {"tile": 4}, {"tile": 1})
    for trial_id, seconds in zip(trials, (3.0, 1.0, 2.0), strict=True):
        evaluate(store, trial_id, seconds)
    for chain, trial_id in zip(store.chains(annealed.id), trials[1:], strict=True):
        assert store.finish_chain_step(
            chain, trial_id=trial_id, config={}, objective=1.0, accepted=True, temperature=1.0, worker="w",
            seconds=0.1, maximize=False,
        )  # fmt: skip
    for name in ("first-min", "second-min", "annealed"):
        assert same_page(through_glance(store, name), render(store, name)), name
    assert "chain 1" in through_glance(store, "annealed")


def test_the_reports_objective_is_the_one_the_last_measured_trial_recorded(store: Store) -> None:
    """Read apart from the trials: the last trial with a measurement, not merely the last trial; None while no
    trial has one (the page then takes the workload's)."""
    from fleet.report.stored import StoredReads

    campaign = make_campaign(store, "recorded")
    first, second, _ = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 3})
    glance = open_glance(store.url)
    assert glance is not None
    assert glance.report_facts(campaign.id)[2] is StoredReads(store).report_facts(campaign.id)[2] is None
    evaluate(store, first, 1.0, name="seconds")
    evaluate(store, second, 2.0, name="gflops", maximize=True)  # the last trial is not measured yet
    assert glance.report_facts(campaign.id)[2] == StoredReads(store).report_facts(campaign.id)[2] == ("gflops", True)
    glance.close()


def test_the_reports_rows_give_each_trials_finish_in_microseconds_as_the_store_reads_it(store: Store) -> None:
    """A finish with microseconds, one on a whole second (SQLite's text then has no fraction when another writer
    left it so) and none: the glance's integers are the store's, and the times the page takes from them exact."""
    from datetime import datetime

    from fleet.report.data import microseconds
    from fleet.report.stored import StoredReads
    from fleet.store import Trial

    campaign = make_campaign(store, "finishes")
    added = add(store, campaign, {"tile": 1}, {"tile": 2}, {"tile": 3})
    finishes = [datetime(2026, 11, 28, 23, 59, 59, 999_999), datetime(2026, 11, 29, 0, 0, 1), None]
    with store.session() as session:
        for trial_id, finished in zip(added, finishes, strict=True):
            session.execute(update(Trial).where(Trial.id == trial_id).values(finished_at=finished))
        if store.engine.dialect.name == "sqlite":  # a whole second as text without its fraction
            session.execute(
                text("UPDATE trials SET finished_at = '2026-11-29 00:00:01' WHERE id = :id"), {"id": added[1]}
            )
    glance = open_glance(store.url)
    assert glance is not None
    reading, _ = glance.report_rows(campaign.id)
    found = [row[6] for rows in reading for row in rows]
    stored, _ = StoredReads(store).report_rows(campaign.id)
    assert found == [row[6] for rows in stored for row in rows]
    assert found == [1_795_910_399_999_999, 1_795_910_401_000_000, None]
    assert found[:2] == [microseconds(finished) for finished in finishes[:2]]
    assert (found[1] - found[0]) / 1_000_000 == (finishes[1] - finishes[0]).total_seconds() == 1.000001
    glance.close()


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_report_read_in_lists_has_every_trial_once_and_a_connection_lost_midway_is_one_line(store: Store) -> None:
    """On PostgreSQL the report's trials come in lists, two halves of them read at once by two threads on two
    connections, each through a cursor of the server's."""
    from fleet.errors import StoreError
    from fleet.report.stored import StoredReads

    campaign = make_campaign(store, "many")
    added = add(store, campaign, *({"tile": n} for n in range(25)))
    for trial_id in added[::2]:
        evaluate(store, trial_id, 1.0)
    glance = open_glance(store.url)
    assert glance is not None
    glance.streamed = 2  # two halves of 13 and 12 trials, each read at most 3 lists (6 trials) ahead of the caller
    reading, started = glance.report_rows(campaign.id)
    lists = list(reading)
    assert [len(found) for found in lists] == [2] * 6 + [1] + [2] * 6
    assert [row[0] for found in lists for row in found] == sorted(added)  # each once, in trial order
    # The same rows as the store reads, in one list, and the same start, read by the second half's reader.
    stored, stored_start = StoredReads(store).report_rows(campaign.id)
    assert list(stored) == [[row for found in lists for row in found]]
    assert started() == stored_start() == glance.report_facts(campaign.id)
    assert started()[0] is not None
    assert glance.connection.autocommit and glance.revision()  # back to reads that stand alone

    # The server ends both connections after the first list: the next says so in one line, and nothing hangs.
    reading, started = glance.report_rows(campaign.id)
    next(reading)
    with store.session() as session:
        session.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ''"
                " AND pid <> pg_backend_pid() AND datname = current_database()"
            )
        )
    with pytest.raises(StoreError, match=r"^database .* does not answer: ") as raised:
        list(reading)
    assert "\n" not in str(raised.value)
    try:  # read before the connections ended, or ended with them: an answer either way, not a wait
        assert started()[0] is not None
    except StoreError as error:
        assert "\n" not in str(error)
    glance.close()


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_a_login_the_server_gives_one_connection_reads_the_reports_halves_in_turn(store: Store) -> None:
    """Where the server takes no second connection of the login (its CONNECTION LIMIT, or the server's), the second
    half waits for the first and is read on the glance's own connection: the same rows."""
    import uuid

    from sqlalchemy.engine import make_url

    campaign = make_campaign(store, "limited")
    added = add(store, campaign, *({"tile": n} for n in range(9)))
    role = f"one_{uuid.uuid4().hex[:8]}"
    as_role = make_url(store.url).set(username=role, password=None).render_as_string(hide_password=False)
    operator = Store(make_url(store.url).set(username="postgres").render_as_string(hide_password=False))
    try:
        assert operator.add_service(role)  # reads every row (BYPASSRLS, which takes a superuser to give)
        with operator.session() as session:
            session.execute(text(f"ALTER ROLE {role} CONNECTION LIMIT 1"))
        glance = open_glance(as_role)
        assert glance is not None
        glance.streamed = 2
        reading, started = glance.report_rows(campaign.id)
        lists = list(reading)
        assert [row[0] for found in lists for row in found] == sorted(added)
        assert started() == glance.report_facts(campaign.id)  # read on the glance's connection, in turn
        assert glance.connection.autocommit and glance.revision()
        glance.close()
    finally:
        with operator.session() as session:
            session.execute(text(f"DROP OWNED BY {role}"))
            session.execute(text(f"DROP ROLE {role}"))
        operator.close()
