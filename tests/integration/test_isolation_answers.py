"""Answers that combine campaigns draw only on the campaigns their asker names (issue 44, item 5; fleet.trust), tried
as an attacker who submits to a shared fleet would: a campaign whose workload prints -1e308 for a problem another
campaign tunes. Real PostgreSQL, Redis and worker processes in the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleet.store import Store
from tests.conftest import Fleet, write_spec

# The problem both campaigns tune, and its knob: the victim's time is x; the attacker's is -1e308 at x=3.
PROBLEM = {"kind": "kernel", "params": {"n": 64}}


def timed_spec(fleet: Fleet, name: str, program: str, **extra: object) -> Path:
    """A campaign of PROBLEM on this fleet's target whose run prints ``program``'s time for knob x."""
    spec = {
        "name": name,
        "target": fleet.target,
        "problems": [PROBLEM],
        "space": {"knobs": {"x": {"values": [1, 2, 3], "build": False}}},
        "workload": {
            "kind": "command",
            "run": [
                "python3",
                "-c",
                f"import json, sys; x = int(sys.argv[1]); print(json.dumps({{'t': {program}}}))",
                "{x}",
            ],
            "objective": {"json": "t"},
        },
        **extra,
    }
    return write_spec(fleet.home, spec, f"{name}.json")


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
