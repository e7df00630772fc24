"""History transfer: ranking related sources' best configurations, partial transfer, ``auto`` with history, and a
campaign whose history is wrong.

fleet/search/history.py, fleet/search/auto.py (its ``history`` option), fleet/bench/transfer.py.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.replay import OVERHEAD_S, Record, RecordedSpace, simulate
from fleet.search import make_searcher
from fleet.search.history import Source, Transferred, check_history, first_count, from_options, to_options, transfer
from fleet.space import Space


def space(knobs: dict, constraints: list[str] | None = None) -> Space:
    return Space.from_dict({"knobs": knobs, "constraints": constraints or []})


def runs(*pairs: tuple[dict, float]) -> tuple[tuple[dict, float], ...]:
    return tuple(pairs)


# -- ranking -----------------------------------------------------------------------------------------------------


def test_configurations_rank_by_quality_relative_to_each_source_so_a_slow_gpu_counts_as_a_fast_one() -> None:
    here = space({"a": [1, 2, 3, 4], "b": [1, 2]})
    # The slow GPU's milliseconds are ten times the fast one's: each source's best is 1 relative to itself.
    fast = Source("fast", runs(({"a": 1, "b": 1}, 1.0), ({"a": 2, "b": 1}, 2.0), ({"a": 3, "b": 2}, 4.0)))
    slow = Source("slow", runs(({"a": 1, "b": 1}, 10.0), ({"a": 3, "b": 2}, 11.0), ({"a": 2, "b": 1}, 40.0)))

    ranked = transfer(here, [fast, slow])

    assert [t.config for t in ranked] == [{"a": 1, "b": 1}, {"a": 3, "b": 2}, {"a": 2, "b": 1}]
    assert ranked[0].score == pytest.approx(1.0) and ranked[0].sources == ("fast", "slow")
    assert ranked[1].score == pytest.approx((1 / 4 + 10 / 11) / 2)


def test_rates_rank_larger_first() -> None:
    here = space({"a": [1, 2, 3]})
    gflops = Source("g", runs(({"a": 1}, 10.0), ({"a": 3}, 100.0), ({"a": 2}, 50.0)), maximize=True)
    assert [t.config["a"] for t in transfer(here, [gflops])] == [3, 2, 1]
    assert transfer(here, [gflops])[1].score == pytest.approx(0.5)


def test_only_the_best_runs_of_each_source_count() -> None:
    here = space({"a": list(range(30))})
    source = Source("s", tuple(({"a": a}, float(a + 1)) for a in range(30)))
    assert [t.config["a"] for t in transfer(here, [source], top=5)] == [0, 1, 2, 3, 4]


def test_a_configuration_the_space_rules_out_is_left_out_and_unknown_values_too() -> None:
    here = space({"x": [1, 2, 4, 8], "y": [1, 2, 4, 8]}, ["x * y <= 16"])
    source = Source("s", runs(({"x": 8, "y": 8}, 1.0), ({"x": 16, "y": 1}, 1.5), ({"x": 4, "y": 4}, 2.0)))
    assert [t.config for t in transfer(here, [source])] == [{"x": 4, "y": 4}]


def test_partial_transfer_keeps_the_common_knobs_and_fills_the_others_as_full_sources_prefer() -> None:
    here = space({"a": [1, 2, 3, 4], "b": [1, 2, 3, 4], "shmem": [0, 1]})
    full = Source("full", runs(({"a": 2, "b": 2, "shmem": 1}, 1.0), ({"a": 1, "b": 1, "shmem": 1}, 1.2)))
    # An older space without the shmem knob: its configurations name only a and b.
    old = Source("old", runs(({"a": 3, "b": 4}, 5.0), ({"a": 2, "b": 2}, 5.5)))

    ranked = transfer(here, [full, old])

    by_config = {tuple(sorted(t.config.items())): t for t in ranked}
    assert all(set(t.config) == {"a", "b", "shmem"} for t in ranked)
    # a=2, b=2 is near the best of both: first. a=3, b=4 came from the old space only, completed with shmem=1.
    assert ranked[0].config == {"a": 2, "b": 2, "shmem": 1} and set(ranked[0].sources) == {"full", "old"}
    assert (("a", 3), ("b", 4), ("shmem", 1)) in by_config


def test_partial_transfer_with_no_full_source_takes_the_first_values_the_space_accepts() -> None:
    here = space({"a": [1, 2], "c": [5, 6, 7]}, ["a != 1 or c != 5"])
    old = Source(
        "old",
        runs(
            ({"a": 1}, 1.0),
        ),
    )
    assert transfer(here, [old])[0].config == {"a": 1, "c": 6}


def test_a_source_that_shares_too_few_knobs_transfers_nothing() -> None:
    assert transfer(space({"a": [1, 2]}), [Source("s", (({"z": 1}, 1.0),))]) == []
    assert transfer(space({"a": [1, 2]}), []) == []
    # Another kernel with a block size in common: one knob of four on each side.
    here = space({"block": [1, 2], "b": [1], "c": [1], "d": [1]})
    other = Source("other", (({"block": 2, "x": 1, "y": 1, "z": 1}, 1.0),))
    assert transfer(here, [other]) == []


def test_how_many_go_first_follows_how_much_the_sources_agree() -> None:
    here = space({"a": list(range(20))})
    agree = [Source(f"s{i}", tuple(({"a": a}, float(a + 1)) for a in range(10))) for i in range(3)]
    disagree = [Source(f"s{i}", tuple(({"a": a}, float(abs(a - 6 * i) + 1)) for a in range(20))) for i in range(3)]
    assert first_count(transfer(here, agree)) == 3
    assert first_count(transfer(here, disagree)) == 9
    assert first_count([]) == 0


def test_history_options_round_trip_as_json_and_malformed_ones_are_spec_errors() -> None:
    items = [Transferred({"a": 1}, 0.9, ("s",))]
    assert from_options(to_options(items, 1)) == (items, 1)
    for bad in (
        [1],
        {"configs": [{"score": 1}]},
        {"configs": [], "first": -1},
        {"configs": [{"config": {}, "score": "x"}]},
    ):
        with pytest.raises(SpecError):
            from_options(bad)


def test_the_spec_field_is_true_false_or_targets_and_tags() -> None:
    assert check_history(False) is False
    assert check_history({"targets": ["sm_80"], "tags": ["prod"]}) == {"targets": ["sm_80"], "tags": ["prod"]}
    for bad in ("yes", {"gpus": []}, {"targets": "sm_80"}, {"tags": [""]}):
        with pytest.raises(SpecError):
            check_history(bad)


# -- auto with history -------------------------------------------------------------------------------------------


def recorded(name: str, times: dict[tuple[int, int], float], knobs: Space) -> RecordedSpace:
    records = {key: Record(value, 0.5, 0.5) for key, value in times.items()}
    allowed = set(records)
    guarded = Space(knobs.knobs, predicate=lambda config: (config["x"], config["y"]) in allowed)
    return RecordedSpace(name, guarded, records, valid_times=tuple(sorted(times.values())))


GRID = space({"x": list(range(16)), "y": list(range(16))})
# Here the optimum is at (12, 12); the "wrong" history's best is (0, 0), the worst corner here.
HERE = recorded("here", {(x, y): 1.0 + (x - 12) ** 2 + (y - 12) ** 2 for x in range(16) for y in range(16)}, GRID)
WRONG = Source("wrong", tuple(({"x": x, "y": y}, 1.0 + x * x + y * y) for x in range(16) for y in range(16)))
RIGHT = Source(
    "right",
    tuple(({"x": x, "y": y}, 2.0 * (1.0 + (x - 12) ** 2 + (y - 12) ** 2)) for x in range(16) for y in range(16)),
)


def history_of(*sources: Source) -> dict:
    items = transfer(HERE.space, list(sources))
    return to_options(items, first_count(items))


def test_auto_spends_its_first_trials_on_history_and_says_which() -> None:
    history = history_of(RIGHT)
    searcher = make_searcher("auto", HERE.space, seed=1, options={"history": history})
    trace = simulate(HERE, searcher, max_evals=12)
    first = [e.config for e in trace[: history["first"]]]
    assert first == [item["config"] for item in history["configs"][: history["first"]]]
    assert searcher.origin(first[0]) == {"rank": 1, "score": 1.0, "sources": ["right"]}  # type: ignore[attr-defined]
    # A design point is not from history.
    others = [e.config for e in trace if searcher.origin(e.config) is None]  # type: ignore[attr-defined]
    assert others and all(c not in first for c in others)


def test_auto_with_no_history_is_auto() -> None:
    plain = simulate(HERE, make_searcher("auto", HERE.space, seed=3), max_evals=40)
    empty = simulate(HERE, make_searcher("auto", HERE.space, seed=3, options={"history": to_options([])}), max_evals=40)
    assert [e.config for e in plain] == [e.config for e in empty]


def cost_to_optimum(history: dict | None, seed: int) -> tuple[float, float]:
    """Simulated seconds until the optimum, and what the trials proposed from history cost."""
    options = {"history": history} if history else {}
    searcher = make_searcher("auto", HERE.space, seed=seed, options=options)
    trace = simulate(HERE, searcher, stop=lambda e: e.time_ms == HERE.optimum)
    spent = sum(e.cost_s for e in trace if searcher.origin(e.config) is not None)  # type: ignore[attr-defined]
    return trace[-1].clock_s, spent


def test_a_wrong_history_loses_at_most_what_its_history_trials_cost() -> None:
    seeds = range(12)
    without = [cost_to_optimum(None, seed)[0] for seed in seeds]
    wrong = [cost_to_optimum(history_of(WRONG), seed) for seed in seeds]
    spent = statistics.fmean(s for _, s in wrong)
    assert spent > 0
    # History's best (the worst corner here) loses to the first design's best: no climb from it, and after the
    # history trials the search is today's. Averaged over seeds: no worse than without history plus those trials.
    assert statistics.fmean(t for t, _ in wrong) <= statistics.fmean(without) + spent + 1e-9


def test_a_climb_from_history_best_follows_the_design_only_when_history_beat_it() -> None:
    from fleet.search.auto import INIT

    def after_design(history: dict) -> list[dict]:
        trace = simulate(HERE, make_searcher("auto", HERE.space, seed=2, options={"history": history}), max_evals=40)
        return [e.config for e in trace[history["first"] + INIT :][:3]]

    def moves(config: dict, start: dict) -> int:
        return sum(config[k] != start[k] for k in start)

    # Right: history's best (the optimum here) beat every design point; the climb goes from it, one knob at a time.
    right = history_of(RIGHT)
    best = right["configs"][0]["config"]
    assert all(moves(config, best) == 1 for config in after_design(right))
    # Wrong: history's best is the worst corner; no climb from it, the search goes on as without history.
    wrong = history_of(WRONG)
    corner = wrong["configs"][0]["config"]
    assert not any(moves(config, corner) == 1 for config in after_design(wrong))


def test_the_climb_hands_the_techniques_its_best_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.search import auto

    made = []
    original = auto.Auto.technique

    def keep(self: auto.Auto, grid: auto.Grid, history: auto.History) -> auto.Technique:
        made.append(original(self, grid, history))
        return made[-1]

    monkeypatch.setattr(auto.Auto, "technique", keep)
    # History's best, (10, 11), is near the optimum (12, 12): with seed 1 it beats every design point.
    cells = [(x, y) for x in range(16) for y in range(16)]
    near = Source("near", tuple(({"x": x, "y": y}, 1.0 + (x - 10) ** 2 + (y - 11) ** 2) for x, y in cells))
    simulate(HERE, make_searcher("auto", HERE.space, seed=1, options={"history": history_of(near)}), max_evals=80)
    [bandit] = made
    optimum = bandit.grid.encode({"x": 12, "y": 12})
    assert bandit.trusted and bandit.handed and optimum in bandit.lead_points
    # The techniques' own history holds the climb's best (the optimum), none of its other runs, none of history's.
    seen = set(bandit.history.losses)
    assert bandit.lead_points & seen == {optimum}
    assert not bandit.hidden & seen


def test_a_right_history_reaches_the_optimum_sooner() -> None:
    seeds = range(12)
    without = statistics.fmean(cost_to_optimum(None, seed)[0] for seed in seeds)
    right = statistics.fmean(cost_to_optimum(history_of(RIGHT), seed)[0] for seed in seeds)
    assert right < without / 2
    assert OVERHEAD_S > 0


# -- fleet bench search --history ------------------------------------------------------------------------------------


def test_a_recorded_space_history_is_the_other_spaces_of_its_kernel_never_itself(tmp_path: Path) -> None:
    from fleet.bench.transfer import histories
    from fleet.replay import tuning_spaces_dir

    names = ["convolution_milo__MI50", "convolution_milo__MI250X", "pnpoly__RTX_2080_Ti"]
    for name in names:
        (tmp_path / f"{name}.json.gz").symlink_to(tuning_spaces_dir() / f"{name}.json.gz")
    found = histories([tmp_path / f"{name}.json.gz" for name in names], tmp_path)
    # pnpoly has no relative; each convolution space has the other, transferred over the knobs they share.
    assert set(found) == {"convolution_milo__MI50", "convolution_milo__MI250X"}
    assert found["convolution_milo__MI50"]["related"] == ["convolution_milo__MI250X"]
    assert found["convolution_milo__MI250X"]["related"] == ["convolution_milo__MI50"]
    assert set(found["convolution_milo__MI250X"]["configs"][0]["config"]) >= {"use_shmem", "use_cmem"}
    assert 1 <= found["convolution_milo__MI50"]["first"] <= 3
