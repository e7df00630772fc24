"""Answers that combine campaigns draw only on the campaigns their asker names (issue 44, item 5; fleet.trust), tried
as an attacker who submits to a shared fleet would: a campaign whose workload prints -1e308 for a problem another
campaign tunes, read by `fleet best`, history, the MIOpen exports and golden set, `fleet.api.best` and the TVM
lookups and records. Real PostgreSQL, Redis and worker processes in the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.api import best
from fleet.errors import FleetError
from fleet.store import Store
from fleet.trust import Trusted
from fleet.tvm.best import best as tvm_best
from fleet.tvm.models import Layer
from fleet.tvm.operators import DENSE, check_problem
from fleet.tvm.tune import tune_layers
from tests.conftest import MIOPEN, Fleet, write_spec
from tests.integration.test_tuna_jobs import fake_driver

# The problem both campaigns tune, and its knob: the victim's time is x; the attacker's is -1e308 at x=3.
PROBLEM = {"kind": "kernel", "params": {"n": 64}}


def timed_spec(fleet: Fleet, name: str, program: str, **extra: object) -> Path:
    """A campaign of PROBLEM on this fleet's target whose run prints ``program``'s time for knob x."""
    return command_spec(fleet, name, PROBLEM, f"{{'t': {program}}}", **extra)


def one_line_error(done: object, said: str) -> None:
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert done.returncode != 0 and len(lines) == 1 and said in lines[0], done.stderr  # type: ignore[attr-defined]


def test_a_hostile_campaign_changes_no_answer_it_was_not_named_in(fleet: Fleet) -> None:
    """The attacker's -1e308 became `fleet best --kind`'s fleet-wide best and history's first proposal; now each
    answer draws on the campaigns named, says which, and refuses to guess among several."""
    fleet.start_worker()
    fleet.cli("tune", str(timed_spec(fleet, "victim", "float(x)")), "--json", check=True, timeout=240)
    fleet.cli("tune", str(timed_spec(fleet, "attacker", "-1e308 if x == 3 else 1e308")), check=True, timeout=240)

    # Named nothing, several campaigns measured it: one line naming them, not the attacker's number.
    one_line_error(
        fleet.cli("best", "--kind", "kernel"),
        "has results from 2 campaigns (attacker, victim); name those to draw on with --from CAMPAIGN[,..]",
    )
    mine = json.loads(fleet.cli("best", "--kind", "kernel", "--from", "victim", "--json", check=True).stdout)
    assert (mine["t"], mine["config"], mine["campaign"]) == (1.0, {"x": 1}, "victim")
    shown = fleet.cli("best", "--kind", "kernel", "--from", "victim", check=True).stdout
    assert "of campaign victim" in shown
    # Every campaign, said on purpose: the attacker's number, and its campaign named with it.
    everyone = json.loads(fleet.cli("best", "--kind", "kernel", "--from", "all", "--json", check=True).stdout)
    assert (everyone["t"], everyone["campaign"]) == (-1e308, "attacker")
    one_line_error(fleet.cli("best", "--kind", "kernel", "--from", "nobody"), "no campaign 'nobody'")
    one_line_error(fleet.cli("best", "--kind", "kernel", "--from", "victim,"), "give campaign names")

    # History: a campaign's auto search starts from the campaigns its spec names, and from no other.
    auto = {"name": "auto", "budget": 3, "seed": 0}
    trusting = timed_spec(fleet, "trusting", "float(x)", strategy=auto, history={"from": ["victim"]})
    fleet.cli("tune", str(trusting), check=True, timeout=240)
    seeded = trials_in_order(fleet.store, "trusting")
    assert seeded[0].history and seeded[0].config == {"x": 1}, [(t.config, t.history) for t in seeded]
    assert all("-1e+308" not in json.dumps(t.history) for t in seeded if t.history)
    unnamed = timed_spec(fleet, "unnamed", "float(x)", strategy=auto)
    fleet.cli("tune", str(unnamed), check=True, timeout=240)
    assert not any(t.history for t in trials_in_order(fleet.store, "unnamed"))  # named none: history from none
    bad = timed_spec(fleet, "bad", "float(x)", strategy=auto, history={"from": "everyone"})
    one_line_error(fleet.cli("tune", str(bad)), "'history' 'from' is \"all\" or a list of campaign names")


def trials_in_order(store: Store, name: str) -> list:
    return sorted(store.trials(store.campaign(name).id), key=lambda t: t.seq)


def command_spec(fleet: Fleet, name: str, problem: dict, printed: str, goal: str = "min", **extra: object) -> Path:
    """A campaign of ``problem`` on this fleet's target whose run prints the JSON object ``printed`` (Python) for
    knob x, its objective ``t``; ``extra``: more of the spec."""
    spec = {
        "name": name,
        "target": fleet.target,
        "problems": [problem],
        "space": {"knobs": {"x": {"values": [1, 2, 3], "build": False}}},
        "workload": {
            "kind": "command",
            "run": ["python3", "-c", f"import json, sys; x = int(sys.argv[1]); print(json.dumps({printed}))", "{x}"],
            "objective": {"json": "t", "goal": goal},
        },
        **extra,
    }
    return write_spec(fleet.home, spec, f"{name}.json")


def test_a_hostile_campaign_is_in_no_miopen_export_or_api_lookup_that_names_another(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A victim's find jobs ran on the fleet. An attacker's campaign on the same conv problem prints -1e308 and a
    forged `find` metric; another imports a find-db claiming 1e-30 ms for the victim's key, which an export of every
    campaign on the target would ship to MIOpen."""
    t = fleet.target
    victim = f"tune@{t}"
    fleet.cli("miopen", "import", str(MIOPEN / "conv_configs_NHWC.txt"), "-t", "nhwc", check=True)
    fleet.cli("miopen", "jobs", "add", "--target", t, "--reason", "tune", "--tag", "nhwc", check=True)
    fleet.start_worker(env={"FLEET_MIOPEN_DRIVER": str(fake_driver(tmp_path))})
    jobs = fleet.store.campaign(victim)
    fleet.wait_for(lambda: fleet.store.trial_counts(jobs.id) == {"evaluated": 5}, timeout=180, what="5 find jobs")
    out = tmp_path / "out"
    exported = lambda name, *how: fleet.cli(  # noqa: E731
        "miopen", "export", "find-db", "--target", t, *how, "-o", str(out / name)
    )
    # One campaign holds results: named none, the export draws on it and says so.
    first = exported("first.txt")
    assert first.returncode == 0 and f"from campaign {victim} (provenance" in first.stdout, first.stderr

    problem = fleet.store.campaign_problems(jobs.id)[0]
    [(measured, _)] = fleet.store.best(problem.id, t)
    attack = {"kind": problem.kind, "params": problem.params}
    spec = command_spec(fleet, "attacker", attack, "{'t': -1e308, 'find': 'forged'}")
    fleet.cli("tune", str(spec), check=True, timeout=240)
    key, _, entries = (out / "first.txt").read_text().splitlines()[0].partition("=")
    solver, _, *rest = entries.split(";")[0].split(",")
    (tmp_path / "evil.txt").write_text(f"{key}={solver},1e-30,{','.join(rest)}\n")
    imported = fleet.cli("miopen", "import-db", str(tmp_path / "evil.txt"), "--target", t, check=True).stdout
    evil = imported.rsplit(" as campaign ", 1)[1].strip()

    # Named none, two campaigns hold find results (the attacker's forged metric is none): one line naming them.
    one_line_error(exported("none.txt"), f"target {t} (find) has results from 2 campaigns ({evil}, {victim})")
    assert not (out / "none.txt").exists()
    mine = exported("mine.txt", "--from", victim)
    assert mine.returncode == 0 and f"from campaign {victim} (provenance" in mine.stdout, mine.stderr
    assert (out / "mine.txt").read_bytes() == (out / "first.txt").read_bytes()
    assert json.loads((out / "mine.txt.provenance.json").read_text())["campaigns"] == [victim]
    assert exported("campaign.txt", "--campaign", "tune").returncode == 0
    assert (out / "campaign.txt").read_bytes() == (out / "mine.txt").read_bytes()
    everyone = exported("all.txt", "--from", "all")  # every campaign, said on purpose: the forged time wins
    assert f"from campaigns {evil}, {victim}" in everyone.stdout, everyone.stderr
    assert f"{key}={solver},1e-30," in (out / "all.txt").read_text()
    one_line_error(exported("both.txt", "--from", victim, "--campaign", "tune"), "give one of --campaign, --from")
    one_line_error(exported("typo.txt", "--from", "victm"), "no campaign 'victm'")
    refused = fleet.cli("miopen", "export", "kernel-db", "--target", t, "-o", str(out / "k.kdb"))
    one_line_error(refused, f"target {t} has results from 2 campaigns ({evil}, {victim}); name those to draw on with")
    kernels = fleet.cli("miopen", "export", "kernel-db", "--target", t, "--from", victim, "-o", str(out / "k.kdb"))
    assert f"5 records written to {out / 'k.kdb'}; from campaign {victim}" in kernels.stdout, kernels.stderr

    # The golden set takes the campaigns named; its export says which campaigns its entries came from.
    fleet.cli("miopen", "golden", "update", "--campaign", "tune", "--target", t, check=True)
    golden = exported("golden.txt", "--golden")
    assert f"from campaign {victim}" in golden.stdout
    assert (out / "golden.txt").read_bytes() == (out / "mine.txt").read_bytes()
    assert json.loads((out / "golden.txt.provenance.json").read_text())["campaigns"] == [victim]

    # fleet.api.best: the same choice, and the same default as the command line's.
    with pytest.raises(
        FleetError, match=rf"from 2 campaigns \(attacker, {victim}\); name those to draw on with campaigns="
    ):
        best(problem.id, t, store=fleet.store)
    [mine_best] = best(problem.id, t, store=fleet.store, campaigns=[victim])
    assert mine_best.campaign == victim and mine_best[0].objective == measured.objective
    [theirs] = best(problem.id, t, store=fleet.store, campaigns="all")
    assert theirs.campaign == "attacker" and theirs[0].objective == -1e308


def test_a_hostile_campaign_decides_no_tvm_lookup_or_records_that_name_another(fleet: Fleet, tmp_path: Path) -> None:
    """An attacker's campaign on a TVM dense problem a victim tuned claims 1e308 GFLOPS: the TVM lookups, tune's
    "tuned already" and the records export draw on the campaigns named only."""
    layer = Layer("fc", DENSE, check_problem(DENSE, {"m": 4, "n": 8, "k": 4}))
    problem = {"kind": DENSE, "params": layer.params}
    fleet.start_worker()
    fleet.cli("tune", str(command_spec(fleet, "victim", problem, "{'t': float(x)}", "max")), check=True, timeout=240)
    hostile = command_spec(fleet, "attacker", problem, "{'t': 1e308 if x == 3 else -1e308}", "max")
    fleet.cli("tune", str(hostile), check=True, timeout=240)
    t = fleet.target

    with pytest.raises(FleetError, match=r"\(attacker, victim\); name those to draw on with campaigns="):
        tvm_best((DENSE, layer.params), t, fleet.store)
    [(config, measurement)] = found = tvm_best((DENSE, layer.params), t, fleet.store, campaigns=["victim"])
    assert (config, measurement.objective, found[0].campaign) == ({"x": 3}, 3.0, "victim")
    [theirs] = tvm_best((DENSE, layer.params), t, fleet.store, campaigns="all")
    assert (theirs[1].objective, theirs.campaign) == (1e308, "attacker")

    def never(_: object) -> list:
        raise AssertionError("a layer tuned already in a campaign named was tuned again")

    # tune-model's "tuned already": named none, two campaigns measured it, so nothing is tuned and it says why.
    with pytest.raises(FleetError, match=r"\(attacker, victim\); name those to draw on with --from"):
        tune_layers(fleet.store, [layer], t, budget=1, drive=never)
    [skipped] = tune_layers(fleet.store, [layer], t, budget=1, drive=never, trusted=Trusted(("victim",)))
    assert (skipped.skipped, skipped.gflops, skipped.campaign) == (True, 3.0, "victim")

    records = tmp_path / "records.jsonl"
    one_line_error(
        fleet.cli("tvm", "export-records", "-o", str(records)),
        "the export of TVM records has results from 2 campaigns (attacker, victim)",
    )
    assert not records.exists()
    done = fleet.cli("tvm", "export-records", "-o", str(records), "--from", "victim", check=True)
    assert done.stdout.strip() == f"3 records written to {records} (from campaign victim)"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert {line["provenance"]["campaign"] for line in lines} == {"victim"}
    assert max(line["gflops"] for line in lines) == 3.0
