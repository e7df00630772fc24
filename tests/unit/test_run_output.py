"""What a program printed reaches the searchers: non-numeric JSON fields, and predicates that decide the best."""

from __future__ import annotations

import pytest

from fleet.search import Bisect, Composer, Run, Step, make_searcher
from fleet.space import Space
from fleet.workers.workloads.base import Measured


def test_bools_and_strings_of_a_runs_json_are_kept_as_metrics() -> None:
    repeats = [
        {"qps": 10.0, "result_validity": "VALID", "ok": True, "note": [1], "nothing": None},
        {"qps": 12.0, "result_validity": "VALID", "ok": True, "note": [2], "nothing": None},
    ]
    measured = Measured.from_samples([10.0, 12.0], repeats)
    assert measured.metrics == {"qps": 11.0, "result_validity": "VALID", "ok": True}


def test_a_field_the_repeats_disagree_on_passes_no_test_of_one_value() -> None:
    repeats = [{"result_validity": "VALID", "ok": True}, {"result_validity": "INVALID", "ok": False}]
    metrics = Measured.from_samples([1.0, 1.0], repeats).metrics
    assert metrics["ok"] is False  # true only when every repeat said so
    assert metrics["result_validity"] == ["VALID", "INVALID"]
    bisect = make_searcher(
        "bisect",
        Space.from_dict({"knobs": {"x": [1, 2, 3]}}),
        options={"knob": "x", "valid_metric": "result_validity", "valid_value": "VALID"},
    )
    assert not bisect.accepts(Run({"x": 2}, 1.0, True, metrics))


def space() -> Space:
    return Space.from_dict({"knobs": {"x": list(range(1, 101))}})


def verdict(validity: str) -> Run:
    return Run({"x": 50}, 50.0, True, {"result_validity": validity})


@pytest.mark.parametrize(
    "searcher",
    [
        Bisect(space(), knob="x", predicate=lambda r: r.stats["result_validity"] == "VALID"),
        Bisect(space(), knob="x", valid_metric="result_validity", valid_value="VALID"),
        Step(space(), knob="x", valid_metric="result_validity", valid_value="VALID"),
        Composer([Bisect(knob="x", predicate=lambda r: r.stats["result_validity"] == "VALID")], space=space()),
    ],
    ids=["bisect-python", "bisect-json", "step-json", "composer"],
)
def test_a_run_counts_only_when_it_passes_the_searchers_predicate(searcher) -> None:
    assert searcher.accepts(verdict("VALID"))
    assert not searcher.accepts(verdict("INVALID"))
    assert not searcher.accepts(Run({"x": 50}, None, False, {"result_validity": "VALID"}))
    assert not searcher.accepts(Run({"x": 50}, 50.0, True, {}))  # the predicate raises KeyError: it fails


def test_a_searcher_without_a_predicate_accepts_every_valid_run() -> None:
    grid = make_searcher("grid", space())
    assert grid.tests() == []
    assert grid.accepts(verdict("INVALID"))
    assert not grid.accepts(Run({"x": 1}, 1.0, False))


def test_a_cost_metric_that_is_not_a_number_is_no_cost() -> None:
    from fleet.search.points import cost

    assert cost(Run({"x": 1}, 1.0, True, {"compile_s": "fast", "benchmark_s": 2.0})) == 2.0
    assert cost(Run({"x": 1}, 1.0, True, {"compile_s": True})) is None
