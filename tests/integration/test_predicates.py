"""Searchers see what the program printed: MLPerf's ``"result_validity": "VALID"`` decides Bisect and the best.

Real PostgreSQL, Redis and worker processes. The program serves up to 37 queries a second: asked for more, it
still prints the rate it was asked for, and says INVALID, as MLPerf's LoadGen does.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import Fleet, write_spec

SERVER = """import json, sys
qps = int(sys.argv[1])
print(json.dumps({"qps": qps, "result_validity": "VALID" if qps <= 37 else "INVALID", "ok": qps <= 37}))
"""

PYTHON_SPACE = """from fleet.search import Bisect

qps = list(range(1, 101))


def META_get_no_rebuild_params():
    return ["qps"]


def META_search_callback():
    return Bisect(search_param="qps", predicate=lambda r: r.stats["result_validity"] == "VALID")
"""


def spec(fleet: Fleet, form: str) -> dict:
    knobs = {"qps": {"values": list(range(1, 101)), "build": False}}
    strategies = {
        "json-string": {
            "name": "bisect",
            "options": {"knob": "qps", "valid_metric": "result_validity", "valid_value": "VALID"},
        },
        "json-bool": {"name": "bisect", "options": {"knob": "qps", "valid_metric": "ok"}},
    }
    if form == "python":
        (fleet.home / "space.py").write_text(PYTHON_SPACE)
        space: object = {"file": "space.py"}
        strategy = {"name": "grid"}
    else:
        space, strategy = {"knobs": knobs}, strategies[form]
    return {
        "name": f"server-{form}",
        "target": fleet.target,
        "problems": [{"kind": "server", "params": {}}],
        "space": space,
        "strategy": strategy,
        "workload": {
            "kind": "command",
            "run": [sys.executable, "-c", SERVER, "{qps}"],
            "objective": {"json": "qps", "goal": "max"},
        },
    }


@pytest.mark.integration
def test_bisect_finds_the_largest_valid_rate_and_the_best_passes_the_predicate(fleet: Fleet) -> None:
    fleet.start_worker()
    for form in ("json-string", "json-bool", "python"):
        path = write_spec(fleet.home, spec(fleet, form), name=f"{form}.json")

        done = fleet.cli("tune", str(path), "--json", check=True)

        problem = json.loads(done.stdout)["problems"][0]
        # Before, no run had the field, so none passed: bisect walked down to 2 and the best was 50, INVALID.
        assert problem["best"]["config"] == {"qps": 37}, (form, fleet.cli("trials", f"server-{form}").stdout)
        assert problem["best"]["qps"] == 37
        assert problem["best"]["metrics"]["result_validity"] == "VALID"
        assert sum(problem["trials"].values()) < 20  # a search of 100 values by sections, not a walk
        if form != "python":  # a space file's searcher is the submitter's code, which `fleet status` does not run
            status = json.loads(fleet.cli("status", f"server-{form}", "--json", check=True).stdout)
            assert [b["config"] for b in status["campaigns"][0]["best"]] == [{"qps": 37}]
