"""``fleet status`` of the whole database reads it through :mod:`fleet.glance` (no SQLAlchemy): the same output as
through the store, on both backends, for a database with something of everything the view shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import update

import fleet.cli.campaigns as campaigns
from fleet.cli import cli
from fleet.cli._common import open_store
from fleet.glance import Glance, open_glance
from fleet.settings import reset_settings
from fleet.store import Campaign, Store
from tests.integration.test_store import TARGET, add, evaluate, make_campaign, make_problem


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


def status(*args: str) -> str:
    done = CliRunner().invoke(cli, ["status", *args], catch_exceptions=False)
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
