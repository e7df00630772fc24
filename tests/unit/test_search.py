"""Search strategies (fleet/search/): the grid, random sampling, and make_searcher."""

from __future__ import annotations

import contextlib
import itertools
import signal
import time
from collections.abc import Iterator

import pytest

from fleet.errors import SpecError
from fleet.search import STRATEGIES, CartesianProduct, RandomSearch, Run, Searcher, make_searcher
from fleet.space import Space, canonical_json


def space(knobs: dict, constraints: list[str] | None = None, run_time: list[str] | None = None) -> Space:
    return Space.from_dict({"knobs": knobs, "constraints": constraints or [], "run_time": run_time or []})


SMALL = {"tile": [8, 16], "unroll": [1, 2], "threads": [1, 2, 4]}
# The searchers that need no runs back. The others wait for runs, so "take everything without sending runs"
# is not their protocol: test_searchers_dynamic.py and test_searchers_mlperf.py drive them with runs.
STATIC = ["grid", "random"]


def take(searcher: Searcher, limit: int | None = None) -> list[dict]:
    return list(itertools.islice(searcher.generate(), limit))


def key(config: dict) -> str:
    return canonical_json(config)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail the block if it runs longer than ``seconds`` (SIGALRM: the tests run in the main thread)."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- grid ------------------------------------------------------------------------------------------


def test_grid_yields_every_valid_configuration_in_space_order() -> None:
    s = space({"a": [1, 2], "b": ["x", "y"]}, constraints=["not (a == 2 and b == 'x')"])
    assert take(CartesianProduct(s)) == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "y"}]


def test_grid_budget_cuts_the_sequence() -> None:
    s = space(SMALL)
    assert take(CartesianProduct(s, budget=5)) == list(s)[:5]


def test_grid_budget_larger_than_the_space_yields_the_whole_space() -> None:
    s = space(SMALL)
    assert take(CartesianProduct(s, budget=1000)) == list(s)


def test_grid_puts_each_build_key_in_one_consecutive_run() -> None:
    # threads is run-time: all its values for one (tile, unroll) are proposed together, so one build serves them.
    s = space(SMALL, run_time=["threads"])
    parts = [key(s.build_part(c)) for c in take(CartesianProduct(s))]
    runs = [k for k, _ in itertools.groupby(parts)]
    assert len(runs) == len(set(runs)) == 4
    assert [len(list(g)) for _, g in itertools.groupby(parts)] == [3, 3, 3, 3]


def test_grid_is_not_dynamic_and_named_grid() -> None:
    assert CartesianProduct.name == "grid"
    assert not CartesianProduct.is_dynamic


# --- random ----------------------------------------------------------------------------------------


def test_random_proposes_exactly_budget_distinct_valid_configurations() -> None:
    s = space({"a": list(range(10)), "b": list(range(10))}, constraints=["a + b < 15"])
    proposals = take(RandomSearch(s, budget=30, seed=3))
    assert len(proposals) == 30
    assert len({key(c) for c in proposals}) == 30
    assert all(s.is_valid(c) and s.check(c) == c for c in proposals)


def test_random_with_budget_above_the_valid_count_proposes_every_valid_configuration_once() -> None:
    s = space({"a": list(range(6)), "b": list(range(6))}, constraints=["a <= b"])
    proposals = take(RandomSearch(s, budget=1000, seed=1))
    assert sorted(map(key, proposals)) == sorted(map(key, s))


def test_random_without_budget_proposes_every_valid_configuration_once() -> None:
    s = space(SMALL)
    assert sorted(map(key, take(RandomSearch(s)))) == sorted(map(key, s))


def test_random_same_seed_gives_same_sequence() -> None:
    s = space({"a": list(range(20)), "b": list(range(20))})
    assert take(RandomSearch(s, budget=25, seed=7)) == take(RandomSearch(s, budget=25, seed=7))


def test_random_different_seed_gives_different_sequence() -> None:
    s = space({"a": list(range(20)), "b": list(range(20))})
    assert take(RandomSearch(s, budget=25, seed=7)) != take(RandomSearch(s, budget=25, seed=8))


def test_random_is_not_simply_the_grid_order() -> None:
    s = space({"a": list(range(20)), "b": list(range(20))})
    assert take(RandomSearch(s, budget=25)) != list(s)[:25]


def test_random_on_a_huge_space_is_fast() -> None:
    # 10^12 configurations: sampling must draw indices, never list the space.
    s = space({f"k{i}": list(range(10)) for i in range(12)}, constraints=["k0 != 3"])
    assert s.size == 10**12
    start = time.monotonic()
    with deadline(10):
        proposals = take(RandomSearch(s, budget=50, seed=0), 50)
    assert time.monotonic() - start < 5
    assert len({key(c) for c in proposals}) == 50
    assert all(c["k0"] != 3 for c in proposals)


def test_random_on_a_huge_space_stops_after_its_budget() -> None:
    # The driver asks once more after the last proposal to see StopIteration; on a 10^12 space
    # generate() then builds `rest = [i for i in range(size) ...]` and never returns.
    s = space({f"k{i}": list(range(10)) for i in range(12)})
    with deadline(1):
        proposals = list(RandomSearch(s, budget=50, seed=0).generate())
    assert len(proposals) == 50


def test_random_finds_the_few_valid_configurations_of_a_sparse_space() -> None:
    s = space({"a": list(range(20)), "b": list(range(20))}, constraints=["a * b == 12"])
    expected = sorted(map(key, s))
    assert len(expected) == 6
    proposals = take(RandomSearch(s, budget=50, seed=5))
    assert sorted(map(key, proposals)) == expected


def test_random_on_a_space_with_no_valid_configuration_proposes_nothing() -> None:
    s = space({"a": [1, 2, 3]}, constraints=["a > 5"])
    assert take(RandomSearch(s, budget=10)) == []


def test_random_on_a_single_configuration_space() -> None:
    assert take(RandomSearch(space({"a": [1]}), budget=5)) == [{"a": 1}]


# --- the generator protocol --------------------------------------------------------------------------


@pytest.mark.parametrize("name", STATIC)
def test_send_none_and_send_run_both_return_the_next_proposal(name: str) -> None:
    s = space(SMALL)
    expected = take(make_searcher(name, s, seed=4))
    gen = make_searcher(name, s, seed=4).generate()
    got = [next(gen)]
    got.append(gen.send(None))
    got.append(gen.send(Run(got[0], 1.5, True, {"gflops": 2.0})))
    got.append(gen.send(Run(got[1], None, False, reason="errored")))
    got.extend(gen)
    assert got == expected


@pytest.mark.parametrize("name", STATIC)
def test_generator_ends_with_stop_iteration_after_the_budget(name: str) -> None:
    gen = make_searcher(name, space(SMALL), budget=2).generate()
    next(gen)
    gen.send(None)
    with pytest.raises(StopIteration):
        gen.send(None)


# --- make_searcher -----------------------------------------------------------------------------------


def test_make_searcher_builds_each_known_strategy() -> None:
    s = space(SMALL)
    assert isinstance(make_searcher("grid", s), CartesianProduct)
    searcher = make_searcher("random", s, budget=3, maximize=True, seed=9)
    assert isinstance(searcher, RandomSearch)
    assert (searcher.budget, searcher.maximize, searcher.seed) == (3, True, 9)


def test_make_searcher_unknown_name_lists_the_known_ones() -> None:
    known = ", ".join(sorted(STRATEGIES))
    with pytest.raises(SpecError, match=rf"unknown strategy 'magic' \(known: {known}\)"):
        make_searcher("magic", space(SMALL))


def test_make_searcher_unknown_option_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="strategy 'grid'"):
        make_searcher("grid", space(SMALL), options={"temperature": 3})


def test_better_respects_the_goal() -> None:
    s = space(SMALL)
    assert make_searcher("grid", s).better(1.0, 2.0)
    assert make_searcher("grid", s, maximize=True).better(2.0, 1.0)
