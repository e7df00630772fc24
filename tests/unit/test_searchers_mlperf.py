"""MLPerf's searchers: Step, Bisect and Composer, with their exact sequences."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import SpecError
from fleet.search import WAIT, Bisect, Composer, Run, Searcher, Step, make_searcher
from fleet.space import Config, Space
from tests.unit.test_searchers_dynamic import drive


def space(knobs: dict, constraints: list[str] | None = None, run_time: list[str] | None = None) -> Space:
    return Space.from_dict({"knobs": knobs, "constraints": constraints or [], "run_time": run_time or []})


def terms(searcher: Searcher, result: Callable[[dict], Run | None] = lambda term: None) -> list[dict]:
    """Every term of ``searcher``, sending back ``result(term)`` after each (one slot, as MLPerf's grid.py)."""
    gen = searcher.terms()
    got = []
    try:
        term = next(gen)
        while True:
            got.append(term)
            term = gen.send(result(term))
    except StopIteration:
        return got


def valid_below(knob: str, limit: float) -> Callable[[Config], float | None]:
    """A run that is valid (objective 1.0) when ``knob`` is at most ``limit``, invalid otherwise."""
    return lambda config: 1.0 if config[knob] <= limit else None


# --- Step ---------------------------------------------------------------------------------------------


def test_step_walks_the_knob_values_in_order_with_the_other_knobs_at_their_base() -> None:
    s = space({"x": [1, 2, 4, 8, 16], "y": ["a", "b"]})
    assert [c["x"] for c in drive(Step(s, knob="x"), lambda c: 1.0)] == [1, 2, 4, 8, 16]
    assert all(c["y"] == "a" for c in drive(Step(s, knob="x"), lambda c: 1.0))
    walked = drive(Step(s, knob="x", start=2, end=16, base={"y": "b"}), lambda c: 1.0)
    assert walked == [{"x": 2, "y": "b"}, {"x": 4, "y": "b"}, {"x": 8, "y": "b"}]


def test_step_with_update_is_mlperfs_step() -> None:
    # MLPerf: Step(search_param, start, end, update) yields start, update(start), ... up to end, not included.
    assert terms(Step(search_param="streams", start=1, end=4, update=lambda x: x + 1)) == [
        {"streams": 1},
        {"streams": 2},
        {"streams": 3},
    ]
    assert terms(Step(search_param="bs", start=200, end=100, update=lambda x: x - 50)) == [{"bs": 200}, {"bs": 150}]
    assert not Step(search_param="bs", start=200, end=100, update=lambda x: x - 50).is_dynamic


def test_step_stops_at_the_first_run_that_fails_its_predicate() -> None:
    s = space({"x": list(range(1, 11))})
    step = Step(s, knob="x", predicate=lambda run: run.valid)
    assert step.is_dynamic
    assert [c["x"] for c in drive(step, valid_below("x", 3))] == [1, 2, 3, 4]


def test_step_with_three_slots_runs_ahead_speculatively() -> None:
    # Three in flight: 1, 2, 3; each run that passes lets one more go; the failure of 4 ends the walk.
    s = space({"x": list(range(1, 11))})
    step = Step(s, knob="x", predicate=lambda run: run.valid)
    assert [c["x"] for c in drive(step, valid_below("x", 3), window=3)] == [1, 2, 3, 4, 5, 6]


def test_step_skips_values_the_space_rules_out_and_keeps_its_budget() -> None:
    s = space({"x": [1, 2, 3, 4, 5], "y": [0, 1]}, ["x != 3"])
    assert [c["x"] for c in drive(Step(s, knob="x"), lambda c: 1.0)] == [1, 2, 4, 5]
    assert [c["x"] for c in drive(Step(s, knob="x", budget=2), lambda c: 1.0)] == [1, 2]


def test_step_from_json_options() -> None:
    s = space({"x": [1, 2, 4, 8], "y": [0, 1]})
    searcher = make_searcher("step", s, options={"knob": "x", "start": 2, "valid_metric": "ok", "base": {"y": 1}})
    assert isinstance(searcher, Step)

    def objective(config: Config) -> float:
        return 1.0

    gen = searcher.generate()
    assert next(gen) == {"x": 2, "y": 1}
    assert gen.send(Run({"x": 2, "y": 1}, 1.0, True, {"ok": True})) == {"x": 4, "y": 1}
    with pytest.raises(StopIteration):
        gen.send(Run({"x": 4, "y": 1}, 1.0, True, {"ok": False}))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs the knob"),
        ({"knob": "z"}, "not a knob"),
        ({"knob": "x", "start": 3}, "start 3 is not a value"),
        ({"knob": "x", "update": "x+1", "start": 1, "end": 4}, "must be a function"),
        ({"knob": "x", "search_param": "y"}, "not both"),
    ],
)
def test_step_option_errors(options: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_searcher("step", space({"x": [1, 2], "y": [0]}), options=options)


# --- Bisect -------------------------------------------------------------------------------------------


def test_bisect_is_mlperfs_binary_search_for_the_largest_passing_value() -> None:
    # range(3000, 4650, 50): 33 candidates; 3000 is taken as passing; valid up to 3725.
    s = space({"qps": list(range(3000, 4650, 50))}, run_time=["qps"])
    bisect = Bisect(s, search_param="qps", lower_bound=3000, upper_bound=4650, step_size=50)
    proposals = drive(bisect, valid_below("qps", 3725))
    assert [c["qps"] for c in proposals] == [3800, 3400, 3600, 3700, 3750]
    assert bisect.best == bisect.get_best() == {"qps": 3700}


def test_bisect_over_the_knob_values_with_bounds_and_a_tolerance() -> None:
    s = space({"qps": [100, 200, 300, 400, 500, 600, 700, 800, 900]})
    proposals = drive(Bisect(s, knob="qps", lower_bound=200), valid_below("qps", 640))
    assert [c["qps"] for c in proposals] == [600, 800, 700]
    # Stop once the passing and failing values are within 200 of each other.
    bisect = Bisect(s, knob="qps", lower_bound=200, tolerance=200)
    assert [c["qps"] for c in drive(bisect, valid_below("qps", 640))] == [600, 800]
    assert bisect.best == {"qps": 600}


def test_bisect_with_three_slots_searches_four_ways() -> None:
    # 17 candidates 0..16, 0 taken as passing; valid up to 11; runs come back oldest first. Each proposal is the
    # middle of the largest interval left between the known bounds and the candidates in flight:
    #   8 (0..17), 12 (8..17), 4 (0..8) in flight; 8 passes: 14 (12..17); 12 fails: 10 (8..12);
    #   4 is stale: 9 (8..10); 14 is stale: 11 (10..12); 10 passes, 9 is stale, 11 passes: 11 is the answer.
    s = space({"v": list(range(17))})
    bisect = Bisect(s, knob="v")
    assert [c["v"] for c in drive(bisect, valid_below("v", 11), window=3)] == [8, 12, 4, 14, 10, 9, 11]
    assert bisect.best == {"v": 11}
    # One slot: plain binary search.
    assert [c["v"] for c in drive(Bisect(s, knob="v"), valid_below("v", 11))] == [8, 12, 10, 11]


def test_bisect_counts_ruled_out_and_errored_runs_as_failing_without_asking_the_predicate() -> None:
    s = space({"qps": [0, 10, 20, 30, 40, 50, 60, 70, 80]}, ["qps != 40"])
    # A predicate on MLPerf's stats: it would raise on a run with none.
    bisect = Bisect(s, knob="qps", predicate=lambda r: r.stats["result_validity"] == "VALID")

    def run_of(config: Config) -> Run:
        if config["qps"] >= 70:
            return Run(config, None, False, reason="timed out")
        return Run(config, 1.0, True, {"result_validity": "VALID"})

    gen = bisect.generate()
    proposed = [next(gen)]
    try:
        while True:
            proposed.append(gen.send(run_of(proposed[-1])))
    except StopIteration:
        pass
    # 40 (ruled out) fails unrun; 20 passes; 30 passes; end: best 30.
    assert [c["qps"] for c in proposed] == [20, 30]
    assert bisect.best == {"qps": 30}


def test_bisect_errors() -> None:
    s = space({"x": [1, 2, 3], "mode": ["a", "b", "c"]})
    with pytest.raises(SpecError, match="not numeric"):
        drive(Bisect(s, knob="mode"), lambda c: 1.0)
    with pytest.raises(SpecError, match="fewer than two"):
        drive(Bisect(s, knob="x", lower_bound=3), lambda c: 1.0)
    with pytest.raises(SpecError, match="needs 'lower_bound'"):
        Bisect(s, knob="x", step_size=1)


# --- Composer -------------------------------------------------------------------------------------------

MLPERF_KNOBS = {
    "server_target_qps": list(range(3000, 4650, 50)),
    "gpu_inference_streams": [1, 2, 3],
    "gpu_batch_size": [100, 150, 200],
}


def mlperf_example(timeout: int = 10) -> Composer:
    """The example of MLPerf's autotuner documentation ("Somewhat intelligent server tuning"), as written there."""
    return Composer(
        [
            Bisect(
                search_param="server_target_qps",
                lower_bound=3000,
                upper_bound=4650,
                step_size=50,
                predicate=lambda r: r.stats["result_validity"] == "VALID",
            ),  # Composer will use Bisect's predicate
            (
                Step(search_param="gpu_inference_streams", start=1, end=4, update=lambda x: x + 1),
                lambda x: True,
            ),  # Redundant, but demonstrates how we can have an arbitrary predicate for Composer's logic
            Step(search_param="gpu_batch_size", start=200, end=100, update=lambda x: x - 50),
        ],  # By default, we always return True.
        timeout=timeout,
    )


def server(config: Config) -> Run:
    """A server whose capacity grows with inference streams and shrinks with smaller batches."""
    capacity = 3500 + 100 * config["gpu_inference_streams"] - 2 * (200 - config["gpu_batch_size"])
    validity = "VALID" if config["server_target_qps"] <= capacity else "INVALID"
    return Run(config, float(config["server_target_qps"]), True, {"result_validity": validity})


def run_serially(searcher: Searcher) -> list[tuple[int, int, int]]:
    gen = searcher.generate()
    got: list[Config] = []
    try:
        config = next(gen)
        while True:
            got.append(config)
            config = gen.send(server(config))
    except StopIteration:
        pass
    return [(c["server_target_qps"], c["gpu_inference_streams"], c["gpu_batch_size"]) for c in got]


def test_composer_reproduces_the_mlperf_documentation_example() -> None:
    composer = mlperf_example().bind(space(MLPERF_KNOBS, run_time=list(MLPERF_KNOBS)))
    # (qps, streams, batch), and why each comes next:
    assert run_serially(composer) == [
        (3800, 1, 200),  # every searcher's first term; capacity 3600: INVALID
        (3800, 2, 200),  # Bisect does not want to go (INVALID): the streams Step goes; INVALID
        (3800, 3, 200),  # the streams Step again; capacity 3800: VALID
        (4200, 3, 200),  # Bisect wants to go (VALID): up, to the middle of 3800..4650; INVALID
        (4200, 3, 150),  # streams exhausted (4 is its end): the batch Step goes; INVALID
        (4000, 3, 150),  # both Steps exhausted; forced backwards, Bisect takes the failure: down; INVALID
        (3900, 3, 150),  # forced again; INVALID
        (3850, 3, 150),  # forced again; INVALID; then 3800 and 3850 are neighbours: Bisect ends, and so do we
    ]


def test_composer_stops_after_its_timeout() -> None:
    composer = mlperf_example(timeout=5).bind(space(MLPERF_KNOBS))
    assert run_serially(composer) == [(3800, 1, 200), (3800, 2, 200), (3800, 3, 200), (4200, 3, 200), (4200, 3, 150)]


def test_composer_keeps_one_configuration_in_flight() -> None:
    # A driver with more slots asks again while the run is out: WAIT each time, and the sequence is unchanged.
    gen = mlperf_example().bind(space(MLPERF_KNOBS)).generate()
    got: list[Config] = []
    try:
        config = next(gen)
        while True:
            got.append(config)
            assert gen.send(None) is WAIT
            assert gen.send(None) is WAIT
            config = gen.send(server(config))
    except StopIteration:
        pass
    serial = run_serially(mlperf_example().bind(space(MLPERF_KNOBS)))
    assert [(c["server_target_qps"], c["gpu_inference_streams"], c["gpu_batch_size"]) for c in got] == serial


def test_composer_from_json_options_uses_each_searchers_own_predicate() -> None:
    s = space({"qps": list(range(0, 1000, 100)), "streams": [1, 2, 3]})
    options = {
        "searchers": [
            {"name": "bisect", "options": {"knob": "qps", "valid_metric": "result_validity", "valid_value": "VALID"}},
            {"name": "step", "options": {"knob": "streams"}},
        ],
        "timeout": 20,
    }
    composer = make_searcher("composer", s, options=options)

    def run(config: Config) -> Run:
        ok = config["qps"] <= 250 * config["streams"]
        return Run(config, 1.0, True, {"result_validity": "VALID" if ok else "INVALID"})

    gen = composer.generate()
    got = [next(gen)]
    try:
        while True:
            got.append(gen.send(run(got[-1])))
    except StopIteration:
        pass
    assert [(c["qps"], c["streams"]) for c in got] == [(500, 1), (500, 2), (700, 2), (700, 3), (800, 3)]


def test_composer_treats_a_ruled_out_configuration_as_a_failed_run() -> None:
    s = space({"x": [1, 2, 3, 4], "y": [1, 2, 3]}, ["x + y <= 5"])
    composer = Composer([Step(s, knob="x"), Step(s, knob="y")], space=s)
    got = [(c["x"], c["y"]) for c in drive(composer, lambda c: 1.0)]
    # Both Steps want to go on every run (no predicates): x walks first, then y; (4, 2) and (4, 3) are ruled
    # out, so they go to the searchers as failures without running, and then both Steps are exhausted.
    assert got == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_composer_errors() -> None:
    s = space({"x": [1, 2]})
    with pytest.raises(SpecError, match="needs searchers"):
        make_searcher("composer", s)
    with pytest.raises(SpecError, match="timeout"):
        Composer([Step(s, knob="x")], timeout=0, space=s)
    with pytest.raises(SpecError, match="unknown strategy"):
        make_searcher("composer", s, options={"searchers": [{"name": "simplex"}]})
    with pytest.raises(SpecError, match="item 0"):
        Composer([(Step(s, knob="x"), 3)], space=s)  # type: ignore[list-item]


def test_a_searcher_without_a_space_says_so_until_bound() -> None:
    composer = mlperf_example()
    with pytest.raises(SpecError, match="bind"):
        next(composer.generate())


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(0, 50), min_size=2, max_size=12, unique=True),
    limit=st.integers(0, 50),
    ruled_out=st.integers(0, 50),
    window=st.integers(1, 4),
)
def test_step_and_bisect_only_propose_valid_configurations_of_the_space(
    values: list[int], limit: int, ruled_out: int, window: int
) -> None:
    s = space({"x": values, "y": [0, 1]}, [f"x != {ruled_out}"])
    for searcher in (Step(s, knob="x", predicate=lambda r: r.valid), Bisect(s, knob="x")):
        proposals = drive(searcher, valid_below("x", limit), window=window)
        assert all(s.is_valid(c) and s.check(c) == c for c in proposals)
        assert len({c["x"] for c in proposals}) == len(proposals)
