"""Dynamic searchers (anneal, local, genetic, optuna, auto), driven as the campaign driver drives them."""

from __future__ import annotations

import math
import random
import sys
from collections import deque
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.errors import SpecError
from fleet.search import STRATEGIES, WAIT, Run, Searcher, make_searcher
from fleet.search.anneal import accept, neighbour, temperature
from fleet.search.points import Grid
from fleet.space import Config, Space, canonical_json

DYNAMIC = ["anneal", "local", "genetic", "optuna", "auto"]
_EMPTY = object()

Objective = Callable[[Config], float | None]


def space(knobs: dict, constraints: list[str] | None = None) -> Space:
    return Space.from_dict({"knobs": knobs, "constraints": constraints or []})


def key(config: Config) -> str:
    return canonical_json(config)


def drive(searcher: Searcher, objective: Objective, *, window: int = 1, shuffle: int | None = None) -> list[Config]:
    """Play the campaign driver's protocol (its ``_Feed``) with ``window`` trials in flight; return the proposals.

    Runs go back one per ``send``; ``None`` is sent when the driver only wants another proposal. The oldest
    trial in flight finishes first, or a random one when ``shuffle`` seeds the order. An objective of None is
    a failed run.
    """
    gen = searcher.generate()
    inbox: deque[Run] = deque()
    state = {"pending": _EMPTY, "started": False, "done": False}

    def ask() -> Config | None:
        while not state["done"]:
            pending = state["pending"]
            if pending is not _EMPTY and pending is not WAIT:
                state["pending"] = _EMPTY
                return pending  # type: ignore[return-value]
            if pending is WAIT and not inbox:
                return None
            try:
                if not state["started"]:
                    state["started"] = True
                    state["pending"] = next(gen)
                else:
                    state["pending"] = gen.send(inbox.popleft() if inbox else None)
            except StopIteration:
                state["done"] = True
        return None

    order = random.Random(shuffle)
    in_flight: list[Config] = []
    proposals: list[Config] = []
    while True:
        while len(in_flight) < window:
            config = ask()
            if config is None:
                break
            proposals.append(config)
            in_flight.append(config)
        if not in_flight:
            break
        config = in_flight.pop(order.randrange(len(in_flight)) if shuffle is not None else 0)
        value = objective(config)
        inbox.append(Run(config, value, value is not None, {}, None if value is not None else "errored"))
    # A searcher that waits with nothing in flight would leave the driver idle forever: it must have finished.
    assert state["done"], "the searcher waits for runs while none is in flight"
    return proposals


CONVEX = {"a": list(range(10)), "b": list(range(10)), "c": ["x", "y", "z"]}
CONVEX_CONSTRAINTS = ["a + b <= 15"]


def convex(config: Config) -> float:
    """A bowl with its single minimum 1.0 at a=6, b=3, c='y'."""
    return (config["a"] - 6) ** 2 + (config["b"] - 3) ** 2 + {"x": 2, "y": 0, "z": 1}[config["c"]] + 1.0


# --- the landscape: each finds the optimum within its budget -------------------------------------------


@pytest.mark.parametrize("name", DYNAMIC)
@pytest.mark.parametrize(("window", "shuffle"), [(1, None), (4, None), (4, 7)])
def test_finds_the_optimum_of_a_convex_landscape_within_its_budget(name: str, window: int, shuffle: int | None) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    for seed in (1, 2):
        proposals = drive(make_searcher(name, s, budget=150, seed=seed), convex, window=window, shuffle=shuffle)
        assert len(proposals) <= 150
        assert min(map(convex, proposals)) == 1.0, f"seed {seed}"


@pytest.mark.parametrize("name", DYNAMIC)
def test_maximize_finds_the_largest_objective(name: str) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    proposals = drive(make_searcher(name, s, budget=150, seed=3, maximize=True), lambda c: -convex(c), window=2)
    assert max(-convex(c) for c in proposals) == -1.0


@pytest.mark.parametrize("name", DYNAMIC)
def test_failed_runs_count_as_worst(name: str) -> None:
    # Half of the space fails; the optimum sits right next to the failing half.
    s = space(CONVEX, CONVEX_CONSTRAINTS)

    def objective(config: Config) -> float | None:
        return None if config["a"] >= 7 else convex(config)

    proposals = drive(make_searcher(name, s, budget=150, seed=5), objective, window=3)
    assert min(v for v in map(objective, proposals) if v is not None) == 1.0


# --- validity, repeats, budget, exhaustion -------------------------------------------------------------


@pytest.mark.parametrize("name", DYNAMIC)
def test_exhausts_a_small_space_once_each_then_stops(name: str) -> None:
    s = space({"a": [1, 2, 3, 4], "b": ["p", "q", "r"]}, ["not (a == 2 and b == 'q')"])
    proposals = drive(make_searcher(name, s, seed=2), lambda c: float(c["a"]), window=3)
    assert sorted(map(key, proposals)) == sorted(map(key, s))


@pytest.mark.parametrize("name", DYNAMIC)
def test_budget_is_respected_and_nothing_repeats(name: str) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    for window in (1, 5):
        proposals = drive(make_searcher(name, s, budget=40, seed=8), convex, window=window)
        assert len(proposals) == 40
        assert len({key(c) for c in proposals}) == 40
        assert all(s.is_valid(c) and s.check(c) == c for c in proposals)


@pytest.mark.parametrize("name", DYNAMIC)
def test_a_space_with_no_valid_configuration_yields_nothing(name: str) -> None:
    s = space({"a": [1, 2, 3]}, ["a > 5"])
    assert drive(make_searcher(name, s, budget=10), lambda c: 1.0) == []


@pytest.mark.parametrize("name", DYNAMIC)
def test_a_single_configuration_space(name: str) -> None:
    assert drive(make_searcher(name, space({"a": [1]}), budget=5), lambda c: 1.0, window=2) == [{"a": 1}]


# --- determinism ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DYNAMIC)
def test_same_seed_and_runs_give_the_same_sequence(name: str) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    for window, shuffle in ((1, None), (4, 3)):
        first = drive(make_searcher(name, s, budget=60, seed=11), convex, window=window, shuffle=shuffle)
        again = drive(make_searcher(name, s, budget=60, seed=11), convex, window=window, shuffle=shuffle)
        assert first == again


@pytest.mark.parametrize("name", DYNAMIC)
def test_another_seed_gives_another_sequence(name: str) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    first = drive(make_searcher(name, s, budget=30, seed=1), convex)
    other = drive(make_searcher(name, s, budget=30, seed=2), convex)
    assert first != other


@pytest.mark.parametrize("name", DYNAMIC)
def test_is_dynamic_and_documents_its_use_of_slots(name: str) -> None:
    cls = STRATEGIES[name]
    assert cls.is_dynamic
    assert "N evaluation slots" in (cls.__doc__ or "")


def test_every_strategy_documents_its_use_of_slots() -> None:
    for name, cls in STRATEGIES.items():
        assert "N evaluation slots" in (cls.__doc__ or ""), name


# --- properties --------------------------------------------------------------------------------------


@st.composite
def problems(draw: st.DrawFn) -> tuple[Space, Callable[[Config], float | None], int]:
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    knobs = {f"k{i}": list(range(size)) for i, size in enumerate(sizes)}
    limit = draw(st.integers(0, sum(sizes)))
    constraints = [f"{' + '.join(knobs)} <= {limit}"] if draw(st.booleans()) else []
    salt = draw(st.integers(0, 1000))

    def objective(config: Config) -> float | None:
        value = random.Random(f"{salt}:{key(config)}").random()
        return None if value < 0.2 else value

    return space(knobs, constraints), objective, draw(st.integers(1, 4))


@pytest.mark.parametrize("name", DYNAMIC)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), seed=st.integers(0, 2**16), budget=st.one_of(st.none(), st.integers(1, 30)))
def test_every_proposal_is_valid_new_and_within_budget(
    name: str, problem: tuple[Space, Objective, int], seed: int, budget: int | None
) -> None:
    s, objective, window = problem
    proposals = drive(make_searcher(name, s, budget=budget, seed=seed), objective, window=window, shuffle=seed)
    keys = [key(c) for c in proposals]
    assert len(set(keys)) == len(keys)
    assert all(s.is_valid(c) and s.check(c) == c for c in proposals)
    valid = sorted(map(key, s))
    assert len(proposals) == (len(valid) if budget is None else min(budget, len(valid)))


# --- annealing's pure functions, as the anneal_step task uses them -----------------------------------------


def test_neighbour_changes_one_knob_to_a_valid_configuration() -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    rng = random.Random(0)
    config = {"a": 9, "b": 6, "c": "x"}
    for _ in range(200):
        moved = neighbour(s, config, rng)
        assert s.is_valid(moved)
        assert sum(moved[k] != config[k] for k in config) == 1


def test_neighbour_is_a_function_of_its_random_generator() -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    config = {"a": 3, "b": 3, "c": "y"}
    assert neighbour(s, config, random.Random("7:3")) == neighbour(s, config, random.Random("7:3"))


def test_neighbour_with_no_valid_move_jumps_or_stays() -> None:
    # Every one-knob move of (1, 1) breaks the constraint; (2, 2) is the only other valid configuration.
    s = space({"a": [1, 2], "b": [1, 2]}, ["a == b"])
    assert neighbour(s, {"a": 1, "b": 1}, random.Random(0)) == {"a": 2, "b": 2}
    assert neighbour(space({"a": [1]}), {"a": 1}, random.Random(0)) == {"a": 1}


def test_neighbour_of_a_configuration_outside_the_space_is_an_error() -> None:
    with pytest.raises(SpecError):
        neighbour(space({"a": [1, 2]}), {"a": 3}, random.Random(0))


def test_accept_takes_better_and_refuses_failed() -> None:
    rng = random.Random(0)
    assert accept(2.0, 1.0, 0.0, rng)
    assert accept(2.0, 2.0, 0.0, rng)
    assert accept(1.0, 2.0, 0.0, rng, maximize=True)
    assert not accept(1.0, None, 10.0, rng)
    assert accept(None, 5.0, 0.0, rng)
    assert accept(None, None, 0.0, rng)
    assert not accept(1.0, 2.0, 0.0, rng)


def test_accept_takes_worse_with_the_boltzmann_probability() -> None:
    rng = random.Random(1)
    # 10% worse at temperature 0.1: p = exp(-1).
    taken = sum(accept(10.0, 11.0, 0.1, rng) for _ in range(20000)) / 20000
    assert taken == pytest.approx(math.exp(-1), abs=0.02)
    taken = sum(accept(10.0, 9.0, 0.1, rng, maximize=True) for _ in range(20000)) / 20000
    assert taken == pytest.approx(math.exp(-1), abs=0.02)


def test_temperature_cools_geometrically() -> None:
    assert temperature(0, 2.0, 0.5) == 2.0
    assert temperature(3, 2.0, 0.5) == 0.25


def test_anneal_keeps_one_chain_per_slot() -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    searcher = make_searcher("anneal", s, budget=40, seed=1)
    drive(searcher, convex, window=3)
    fixed = make_searcher("anneal", s, budget=40, seed=1, options={"chains": 2})
    assert len(drive(fixed, convex, window=5)) == 40


def test_anneal_accepts_the_fleet_options() -> None:
    s = space(CONVEX)
    searcher = make_searcher(
        "anneal", s, options={"on_fleet": True, "chains": 4, "temperature": 0.5, "cooling": 0.9, "restart": 10}
    )
    assert searcher.chains == 4  # type: ignore[attr-defined]


# --- options and errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("anneal", {"chains": 0}),
        ("anneal", {"cooling": 1.5}),
        ("anneal", {"temperature": -1}),
        ("genetic", {"population": 1}),
        ("genetic", {"mutation": 2}),
        ("genetic", {"tournament": 0}),
        ("optuna", {"sampler": "simplex"}),
        ("optuna", {"startup": 0}),
        ("auto", {"techniques": ["simplex"]}),
        ("auto", {"techniques": []}),
        ("auto", {"seed_configs": "a=1"}),
        ("local", {"neighbours": 3}),
    ],
)
def test_bad_options_are_spec_errors(name: str, options: dict) -> None:
    with pytest.raises(SpecError, match=f"strategy '{name}'"):
        make_searcher(name, space(CONVEX), options=options)


def test_optuna_missing_is_a_clear_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # makes `import optuna` raise ImportError
    with pytest.raises(SpecError, match=r"needs Optuna, which is not installed: pip install 'fleet-tune\[search\]'"):
        make_searcher("optuna", space(CONVEX))
    # The default strategy does without it.
    searcher = make_searcher("auto", space(CONVEX), budget=20)
    assert "optuna" not in searcher.techniques  # type: ignore[attr-defined]
    assert len(drive(searcher, convex)) == 20


def test_optuna_sampler_missing_its_package_is_a_clear_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SpecError, match=r"sampler 'gp' needs torch"):
        make_searcher("optuna", space(CONVEX), options={"sampler": "gp"})


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_optuna_samplers_propose_valid_new_configurations(sampler: str) -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    proposals = drive(make_searcher("optuna", s, budget=25, seed=1, options={"sampler": sampler}), convex, window=3)
    assert len({key(c) for c in proposals}) == 25
    assert all(s.is_valid(c) for c in proposals)


def test_auto_measures_the_seed_configurations_first() -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    seeds = [{"a": 6, "b": 3, "c": "y"}, {"a": 99, "b": 0, "c": "x"}, {"a": 9, "b": 9, "c": "x"}, {"a": 1, "b": 1}]
    proposals = drive(make_searcher("auto", s, budget=10, options={"seed_configs": seeds}), convex, window=2)
    # Not in the space (a=99), ruled out (a + b > 15), or incomplete: skipped.
    assert proposals[0] == {"a": 6, "b": 3, "c": "y"}
    assert len({key(c) for c in proposals}) == 10


def test_auto_with_one_technique_is_that_technique_over_a_shared_history() -> None:
    s = space(CONVEX, CONVEX_CONSTRAINTS)
    proposals = drive(make_searcher("auto", s, budget=50, seed=4, options={"techniques": ["local"]}), convex)
    assert min(map(convex, proposals)) == 1.0


@pytest.mark.parametrize("name", DYNAMIC)
def test_a_huge_sparse_space_is_sampled_not_listed(name: str) -> None:
    # 10^12 configurations, 1% of them valid: drawing finds them; listing the space would never end.
    s = space({f"k{i}": list(range(10)) for i in range(12)}, ["k0 == 1 and k1 == 2"])
    proposals = drive(make_searcher(name, s, budget=30, seed=1), lambda c: float(sum(c.values())), window=3)
    assert len({key(c) for c in proposals}) == 30
    assert all(c["k0"] == 1 and c["k1"] == 2 for c in proposals)


def test_runs_are_matched_to_proposals_through_json_round_trips() -> None:
    # The store may give a 2 back as 2.0; a bool is never taken for a number.
    grid = Grid(space({"a": [1, 2, 3], "flag": [True, False], "mode": ["x", 1]}))
    assert grid.encode({"a": 2.0, "flag": False, "mode": 1}) == (1, 1, 1)
    assert grid.encode({"a": True, "flag": False, "mode": "x"}) is None
    assert grid.encode({"a": 4, "flag": False, "mode": "x"}) is None
    assert grid.encode({"a": 1, "flag": False}) is None
    assert grid.encode({"a": [1], "flag": False, "mode": "x"}) is None
