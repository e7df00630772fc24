"""Recorded tuning spaces, the in-process simulator and the ``replay`` workload.

fleet/replay.py, fleet/workers/workloads/replay.py.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import SpecError
from fleet.replay import NOT_RECORDED, OVERHEAD_S, load_recorded, recorded_files, resolve_space, simulate
from fleet.search import WAIT, Proposals, Run, Searcher, make_searcher
from fleet.workers.workloads import Job
from fleet.workers.workloads.replay import ReplayWorkload
from tests.conftest import SPACES


def readme_table() -> dict[str, tuple[int, int, float, float]]:
    """The table of tests/data/tuning-spaces/README.md: configurations, valid ones, optimum (ms), median / optimum.

    Read from the folder itself, so that a space added with its row is checked without editing this file. The
    files are sub-spaces of the recorded spaces, and the table gives their own figures, counted from their JSON
    by scripts/cut-test-samples; the whole spaces' figures are in the development set's README, which
    `fleet bench search` reads.
    """
    rows = {}
    for line in (SPACES / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].endswith(".json.gz"):
            continue
        counts = re.fullmatch(r"(\d+) \((\d+)\)", cells[1])
        assert counts, line
        rows[cells[0]] = (int(counts[1]), int(counts[2]), float(cells[2]), float(cells[3]))
    return rows


README = readme_table()


def write_cache(path: Path, params: dict[str, list[Any]], cache: dict[tuple, Any]) -> Path:
    """A gzip'd Kernel Tuner cache file; ``cache`` maps value tuples to (time, compile ms, benchmark ms)."""
    records = {}
    for values, (time, compile_ms, benchmark_ms) in cache.items():
        record = dict(zip(params, values, strict=True))
        record.update(time=time, compile_time=compile_ms, benchmark_time=benchmark_ms, times=[time] * 3)
        records[",".join(str(v) for v in values)] = record
    data = {"tune_params_keys": list(params), "tune_params": params, "cache": records}
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    # x=3, y=1 is not recorded (the space's restrictions left it out); x=2, y=1 failed to compile.
    return write_cache(
        tmp_path / "tiny.json.gz",
        {"x": [1, 2, 3], "y": [0, 1]},
        {
            (1, 0): (5.0, 1000.0, 200.0),
            (1, 1): (4.0, 2000.0, 300.0),
            (2, 0): (3.0, 500.0, 100.0),
            (2, 1): ("CompilationFailedConfig", 700.0, 0.0),
            (3, 0): (1.0, 3000.0, 400.0),
        },
    )


class Scripted(Searcher):
    """Yields a fixed list of configurations, ignoring the runs, but records what it was sent."""

    name = "scripted"

    def __init__(self, space: Any, configs: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        self.configs = configs
        self.sent: list[Run | None] = []

    def generate(self) -> Proposals:
        for config in self.configs:
            self.sent.append((yield config))


class OneAtATime(Searcher):
    """Dynamic: proposes the next configuration only once the previous one's run came back."""

    name = "one-at-a-time"
    is_dynamic = True

    def __init__(self, space: Any, configs: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        self.configs = configs
        self.runs: list[Run] = []

    def generate(self) -> Proposals:
        for config in self.configs:
            run = yield config
            while run is None:
                run = yield WAIT
            self.runs.append(run)


# -- loading ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(README))
def test_each_recorded_space_matches_the_readme(name: str) -> None:
    configurations, valid, optimum, ratio = README[name]
    recorded = load_recorded(SPACES / name)
    assert recorded.size == configurations
    assert recorded.valid_count == valid
    assert recorded.optimum == pytest.approx(optimum, rel=5e-4)
    assert round(recorded.median / recorded.optimum, 2) == pytest.approx(ratio, abs=0.011)
    assert recorded.lookup(recorded.best).time_ms == recorded.optimum
    assert all(knob.build for knob in recorded.space.knobs)
    assert recorded.space.is_valid(recorded.best)


def test_every_file_in_the_folder_is_in_the_table() -> None:
    assert sorted(p.name for p in recorded_files()) == sorted(README)


def test_the_space_accepts_exactly_the_recorded_configurations() -> None:
    recorded = load_recorded(SPACES / "convolution_kt__RTX_2080_Ti.json.gz")
    space = recorded.space
    # Sampled from the product: a recorded configuration is valid, any other is not.
    for index in range(0, space.size, 97):
        config = space.decode(index)
        assert space.is_valid(config) == (recorded.lookup(config) is not None)
    # block_size_x * block_size_y >= 64 is one of its restrictions.
    small = {**recorded.best, "block_size_x": 1, "block_size_y": 1}
    assert recorded.lookup(small) is None and not space.is_valid(small)
    assert sum(1 for _ in space) == recorded.size


def test_an_error_string_is_a_recorded_but_invalid_configuration() -> None:
    recorded = load_recorded(SPACES / "pnpoly__RTX_2080_Ti.json.gz")
    failed = [recorded.config(k) for k, r in recorded.records.items() if r.time_ms is None]
    configurations, valid, *_ = README["pnpoly__RTX_2080_Ti.json.gz"]
    assert len(failed) == configurations - valid > 0
    record = recorded.lookup(failed[0])
    assert record is not None and record.error == "RuntimeFailedConfig" and not record.valid
    assert recorded.space.is_valid(failed[0])
    assert record.cost_s() == pytest.approx(record.compile_s + OVERHEAD_S)


def test_lookup_takes_the_values_of_any_numeric_type_and_tolerates_a_bad_config(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    assert recorded.lookup({"x": 2, "y": 0}).time_ms == 3.0
    assert recorded.lookup({"y": 0, "x": 2.0}).time_ms == 3.0
    assert recorded.lookup({"x": 2}) is None
    assert recorded.lookup({"x": [2], "y": 0}) is None
    record = recorded.lookup({"x": 1, "y": 1})
    assert (record.compile_s, record.benchmark_s, record.samples) == (2.0, 0.3, (4.0, 4.0, 4.0))
    assert recorded.valid_times == (1.0, 3.0, 4.0, 5.0)
    assert (recorded.optimum, recorded.median, recorded.best) == (1.0, 3.5, {"x": 3, "y": 0})


def test_a_file_that_is_not_a_cache_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(b'{"cache": {"1": {}}}'))
    with pytest.raises(SpecError, match="tune_params"):
        load_recorded(tmp_path / "bad.json.gz")
    (tmp_path / "text.json.gz").write_text("not json")
    with pytest.raises(SpecError, match="not a Kernel Tuner cache file"):
        load_recorded(tmp_path / "text.json.gz")
    bad_key = write_cache(tmp_path / "key.json.gz", {"x": [1, 2]}, {(3,): (1.0, 0, 0)})
    with pytest.raises(SpecError, match="cache key '3'"):
        load_recorded(bad_key)
    with pytest.raises(SpecError, match="No such file"):
        load_recorded(tmp_path / "missing.json.gz")


def test_a_space_is_found_by_name_with_or_without_its_suffix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_space("pnpoly__RTX_2080_Ti") == SPACES / "pnpoly__RTX_2080_Ti.json.gz"
    assert resolve_space(SPACES / "pnpoly__RTX_2080_Ti.json.gz") == SPACES / "pnpoly__RTX_2080_Ti.json.gz"
    with pytest.raises(SpecError, match=r"recorded space 'nope' not found .*known: convolution_kt"):
        resolve_space("nope")
    monkeypatch.setenv("FLEET_TUNING_SPACES", str(tmp_path))
    write_cache(tmp_path / "mine.json.gz", {"x": [1]}, {(1,): (1.0, 0, 0)})
    assert resolve_space("mine") == tmp_path / "mine.json.gz"
    # Relative to the working directory only where asked (the command line), never on a worker.
    (tmp_path / "work" / "here").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    write_cache(tmp_path / "work" / "here" / "local.json.gz", {"x": [1]}, {(1,): (1.0, 0, 0)})
    assert resolve_space("here/local.json.gz", here_first=True) == Path("here/local.json.gz")
    with pytest.raises(SpecError):
        resolve_space("here/local.json.gz")


# -- the simulator ---------------------------------------------------------------------------------------------


def test_one_slot_charges_each_evaluation_in_turn(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    trace = simulate(recorded, make_searcher("grid", recorded.space))
    costs = {(1, 0): 1.2, (1, 1): 2.3, (2, 0): 0.6, (2, 1): 0.7, (3, 0): 3.4}
    assert [tuple(e.config.values()) for e in trace] == list(costs)
    clock = 0.0
    for evaluation in trace:
        clock += costs[tuple(evaluation.config.values())] + OVERHEAD_S
        assert evaluation.clock_s == pytest.approx(clock)
    assert [e.time_ms for e in trace] == [5.0, 4.0, 3.0, None, 1.0]
    assert trace[3].reason == "recorded as CompilationFailedConfig"


def test_slots_run_in_parallel_and_finish_in_clock_order(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    configs = [{"x": 3, "y": 0}, {"x": 1, "y": 0}, {"x": 2, "y": 0}, {"x": 1, "y": 1}]
    trace = simulate(recorded, Scripted(recorded.space, configs), slots=2, overhead_s=0.0)
    # Slot 1: x3y0 (0 -> 3.4). Slot 2: x1y0 (0 -> 1.2), then x2y0 (1.2 -> 1.8), then x1y1 (1.8 -> 4.1).
    assert [(tuple(e.config.values()), round(e.clock_s, 9)) for e in trace] == [
        ((1, 0), 1.2),
        ((2, 0), 1.8),
        ((3, 0), 3.4),
        ((1, 1), 4.1),
    ]


def test_runs_go_back_one_per_send_and_a_repeat_is_not_measured_again(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    a, outside, failed = {"x": 1, "y": 0}, {"x": 3, "y": 1}, {"x": 2, "y": 1}
    searcher = Scripted(recorded.space, [a, a, outside, failed, a])
    trace = simulate(recorded, searcher, overhead_s=0.0)
    # One slot: the repeat of a comes after its run, and is answered at once; x3y1 is not recorded: no cost.
    assert [(tuple(e.config.values()), e.clock_s) for e in trace] == [
        ((1, 0), pytest.approx(1.2)),
        ((3, 1), pytest.approx(1.2)),
        ((2, 1), pytest.approx(1.9)),
    ]
    assert trace[1].reason == NOT_RECORDED and trace[1].cost_s == 0.0
    assert [(tuple(r.config.values()), r.objective, r.valid) for r in searcher.sent] == [
        ((1, 0), 5.0, True),
        ((1, 0), 5.0, True),
        ((3, 1), None, False),
        ((2, 1), None, False),
        ((1, 0), 5.0, True),
    ]
    assert searcher.sent[0].metrics == {"compile_s": 1.0, "benchmark_s": 0.2, "simulated_s": pytest.approx(1.2)}
    assert searcher.sent[3].reason == "recorded as CompilationFailedConfig"


def test_a_repeat_of_a_configuration_in_flight_shares_its_evaluation(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    a = {"x": 1, "y": 0}
    searcher = Scripted(
        recorded.space, [a, a, {"x": 3, "y": 1}, {"x": 2, "y": 1}, a, {"x": 2, "y": 0}, {"x": 1, "y": 1}]
    )
    trace = simulate(recorded, searcher, slots=2, overhead_s=0.0)
    assert [(tuple(e.config.values()), e.clock_s) for e in trace] == [
        ((3, 1), 0.0),
        ((2, 1), pytest.approx(0.7)),
        ((1, 0), pytest.approx(1.2)),
        ((2, 0), pytest.approx(1.3)),
        ((1, 1), pytest.approx(3.5)),
    ]
    # As the driver's _Feed does: no run while slots are free, then one per send, in finishing order; a's run
    # goes back once per time it was asked for (the generator ended before taking the third).
    sent = [None if r is None else (tuple(r.config.values()), r.objective) for r in searcher.sent]
    assert sent == [None, None, ((3, 1), None), ((2, 1), None), None, ((1, 0), 5.0), ((1, 0), 5.0)]


def test_a_dynamic_searcher_waits_for_its_runs(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    configs = [{"x": 1, "y": 0}, {"x": 2, "y": 1}, {"x": 3, "y": 0}]
    searcher = OneAtATime(recorded.space, configs)
    trace = simulate(recorded, searcher, slots=4)
    # Four slots, but each proposal waits for the previous run: the clock adds up as with one slot.
    assert [e.clock_s for e in trace] == pytest.approx([1.21, 1.92, 5.33])
    assert [(r.objective, r.reason) for r in searcher.runs] == [
        (5.0, None),
        (None, "recorded as CompilationFailedConfig"),
        (1.0, None),
    ]


def test_the_horizon_and_the_evaluation_limit_stop_a_run(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    assert len(simulate(recorded, make_searcher("grid", recorded.space), horizon_s=3.0)) == 2
    assert len(simulate(recorded, make_searcher("grid", recorded.space), max_evals=3)) == 3
    stopped = simulate(recorded, make_searcher("grid", recorded.space), stop=lambda e: e.time_ms == 3.0)
    assert [e.time_ms for e in stopped] == [5.0, 4.0, 3.0]


def test_a_searcher_that_only_repeats_itself_ends(tiny: Path) -> None:
    recorded = load_recorded(tiny)
    trace = simulate(recorded, Scripted(recorded.space, [{"x": 1, "y": 0}] * 100_000))
    assert len(trace) == 1


def test_random_search_on_a_real_space_visits_only_recorded_configurations() -> None:
    recorded = load_recorded(SPACES / "convolution_milo__A100.json.gz")
    trace = simulate(recorded, make_searcher("random", recorded.space, seed=3), slots=8, max_evals=500)
    assert len(trace) == 500
    assert len({tuple(e.config.values()) for e in trace}) == 500
    assert all(recorded.lookup(e.config) is not None for e in trace)
    assert all(a.clock_s <= b.clock_s for a, b in itertools.pairwise(trace))
    # Eight slots: about eight times as fast as the sum of the costs.
    assert trace[-1].clock_s < sum(e.cost_s for e in trace) / 4


# -- the workload ----------------------------------------------------------------------------------------------


def job(config: dict[str, Any], tmp_path: Path) -> Job:
    return Job(config, {}, tmp_path, lambda _: b"")


def test_the_replay_workload_answers_recorded_times(tmp_path: Path) -> None:
    workload = ReplayWorkload({"kind": "replay", "space": "pnpoly__RTX_2080_Ti.json.gz"})
    assert (workload.objective_name, workload.maximize) == ("time_ms", False)
    recorded = load_recorded(SPACES / "pnpoly__RTX_2080_Ti.json.gz")
    built = workload.build(job(recorded.best, tmp_path))
    assert built.data is not None and json.loads(built.data) == recorded.best
    measured = workload.evaluate(job(recorded.best, tmp_path), built.data)
    record = recorded.lookup(recorded.best)
    assert measured.state == "evaluated" and measured.objective == recorded.optimum == pytest.approx(8.024, rel=1e-3)
    assert measured.samples == list(record.samples) and len(measured.samples) > 1
    assert measured.metrics == {
        "compile_s": record.compile_s,
        "benchmark_s": record.benchmark_s,
        "simulated_s": record.compile_s + record.benchmark_s + OVERHEAD_S,
    }
    failed = next(recorded.config(k) for k, r in recorded.records.items() if r.time_ms is None)
    invalid = workload.evaluate(job(failed, tmp_path), b"")
    assert (invalid.state, invalid.objective, invalid.reason) == ("invalid", None, "recorded as RuntimeFailedConfig")
    assert set(invalid.metrics) == {"compile_s", "benchmark_s", "simulated_s"}
    workload.check(recorded.names, {})


def test_the_replay_workload_calls_a_configuration_outside_the_space_invalid(tmp_path: Path) -> None:
    workload = ReplayWorkload({"kind": "replay", "space": "convolution_kt__RTX_2080_Ti"})
    recorded = workload.recorded
    outside = {**recorded.best, "block_size_x": 1, "block_size_y": 1}
    measured = workload.evaluate(job(outside, tmp_path), b"")
    assert (measured.state, measured.reason) == ("invalid", NOT_RECORDED)


def test_a_replay_workload_that_names_no_known_space_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match=r"recorded space 'nope\.json\.gz' not found"):
        ReplayWorkload({"kind": "replay", "space": "nope.json.gz"})
    with pytest.raises(SpecError, match="needs 'space'"):
        ReplayWorkload({"kind": "replay"})
    with pytest.raises(SpecError, match="unknown field 'objective'"):
        ReplayWorkload({"kind": "replay", "space": "pnpoly__RTX_2080_Ti", "objective": {}})
    workload = ReplayWorkload({"kind": "replay", "space": "pnpoly__RTX_2080_Ti"})
    with pytest.raises(SpecError, match="knob 'tile' is not a knob of recorded space"):
        workload.check(["tile"], {})
    with pytest.raises(SpecError, match="lacks knob 'use_method'"):
        workload.check(["between_method", "block_size_x", "tile_size"], {})


def test_a_campaign_spec_can_replay_a_recorded_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.driving.campaign import parse_spec
    from fleet.workers.workloads import WORKLOADS

    monkeypatch.setitem(WORKLOADS, "replay", ReplayWorkload)
    recorded = load_recorded(SPACES / "pnpoly__RTX_2080_Ti.json.gz")
    data = {
        "name": "replay-pnpoly",
        "target": "sm_75",
        "problems": [{"kind": "pnpoly", "params": {}}],
        "space": recorded.to_dict(),
        "strategy": {"name": "random", "budget": 20, "seed": 1},
        "workload": {"kind": "replay", "space": "pnpoly__RTX_2080_Ti"},
    }
    spec = parse_spec(data, tmp_path)
    assert spec.maximize is False and spec.space.names == recorded.names
    with pytest.raises(SpecError, match="lacks knob 'use_method'"):
        parse_spec(
            {**data, "space": {"knobs": {k: v for k, v in data["space"]["knobs"].items() if k != "use_method"}}},
            tmp_path,
        )
