"""Annealing chains on the fleet: anneal_step tasks that drive themselves, on real workers."""

from __future__ import annotations

import csv
import json

from sqlalchemy import func, select

from fleet.api import CampaignHandle
from fleet.store import ChainStep, Measurement
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def chain_spec(fleet: Fleet, **options: object) -> dict:
    spec = kernel_spec(fleet, name="chains")
    spec["space"]["knobs"]["size"] = list(range(1, 9))
    spec["strategy"] = {
        "name": "anneal",
        "budget": 12,
        "seed": 3,
        "options": {"on_fleet": True, "chains": 2, "temperature": 0.5, **options},
    }
    spec.pop("baseline")
    return spec


def steps(fleet: Fleet) -> list[ChainStep]:
    with fleet.store.session() as session:
        return list(session.scalars(select(ChainStep).order_by(ChainStep.chain_id, ChainStep.step)))


def test_chains_run_to_their_end_and_export_their_steps(fleet: Fleet) -> None:
    fleet.start_worker()
    path = write_spec(fleet.home, chain_spec(fleet))

    done = fleet.cli("tune", str(path), "--json", check=True, timeout=300)

    chains = fleet.store.chains(fleet.store.campaign("chains").id)
    assert [(c.index, c.step, c.state) for c in chains] == [(0, 6, "done"), (1, 6, "done")]
    recorded = steps(fleet)
    assert len(recorded) == 12
    assert {s.step for s in recorded} == set(range(6))
    # A chain only ever moves to a configuration it measured, and its best is the best it measured.
    for chain in chains:
        mine = [s for s in recorded if s.chain_id == chain.id and s.objective is not None]
        assert chain.best_objective == max(s.objective for s in mine)
    assert json.loads(done.stdout)["problems"][0]["best"]["score"] == max(s.objective or 0 for s in recorded)
    out = fleet.home / "steps.csv"
    fleet.cli("trials", "chains", "--csv", "-o", str(out), check=True)
    rows = list(csv.DictReader(out.open()))
    assert [(r["chain"], r["step"]) for r in rows] == [(str(c), str(s)) for c in (0, 1) for s in range(6)]
    assert all(r["accepted"] in ("True", "False") and r["temperature"] for r in rows)


def test_chains_need_no_driver_and_come_back_after_their_messages_are_lost(fleet: Fleet, redis_server: object) -> None:
    path = write_spec(fleet.home, chain_spec(fleet))
    sent = fleet.cli("tune", str(path), "--detach", check=True)  # the driver leaves at once
    assert "2 trials sent" in sent.stdout or "sent" in sent.stdout
    redis_server.client().flushall()  # type: ignore[attr-defined]  # every message is lost

    fleet.start_worker(env={"FLEET_REQUEUE_SECONDS": "2"})

    campaign = fleet.store.campaign("chains")
    fleet.wait_for(
        lambda: all(c.state == "done" for c in fleet.store.chains(campaign.id)),
        timeout=180,
        what="the chains to finish with no driver",
    )
    assert len(steps(fleet)) == 12
    with fleet.store.session() as session:
        measured = session.scalar(select(func.count()).select_from(Measurement))
        distinct = session.scalar(select(func.count(func.distinct(ChainStep.trial_id))))
    assert measured == distinct  # a configuration two chains visited is measured once
    # Their end is the campaign's, with no driver and no `fleet resume`: its last step ends it.
    assert fleet.store.campaign("chains").status == "done"
    [summary] = CampaignHandle(fleet.store, campaign.id).wait(timeout=10, drive=False)
    assert summary.best is not None
