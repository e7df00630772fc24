"""Campaign specs (fleet/driving/campaign.py): parse_spec, load_spec, check_target, CampaignSpec, baseline_configs,
trial_keys. Nothing here touches a database or a broker."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from fleet.bundle import unpack
from fleet.driving.campaign import (
    CampaignSpec,
    ProblemSpec,
    baseline_configs,
    check_target,
    load_spec,
    parse_spec,
    trial_keys,
)
from fleet.errors import SpecError
from fleet.space import Space
from fleet.store import Campaign
from fleet.workers.gpus import cpu_target

SOURCE = b'#include <stdio.h>\nint main(void) { printf("{\\"score\\": %d}\\n", SIZE); return 0; }\n'

SPEC: dict[str, Any] = {
    "name": "tiny",
    "target": "cpu-x86_64",
    "problems": [{"kind": "command", "params": {"n": 64}, "tags": ["small"]}],
    "space": {"knobs": {"size": [1, 2, 4], "scale": [1, 3]}, "run_time": ["scale"], "constraints": ["size < 4"]},
    "strategy": {"name": "random", "budget": 3, "seed": 1},
    "workload": {
        "kind": "command",
        "sources": ["k.c"],
        "build": ["gcc", "-DSIZE={size}", "k.c", "-o", "k"],
        "artifacts": ["k"],
        "run": ["./k", "{scale}", "{n}"],
        "objective": {"name": "score", "goal": "max", "json": "score"},
    },
    "baseline": {"size": 1},
}


def make(**overrides: Any) -> dict[str, Any]:
    """The valid spec with top-level fields replaced (None removes one)."""
    data = copy.deepcopy(SPEC)
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def with_workload(**overrides: Any) -> dict[str, Any]:
    return make(workload={**SPEC["workload"], **overrides})


def with_space(**overrides: Any) -> dict[str, Any]:
    return make(space={**SPEC["space"], **overrides})


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A directory with the spec's source file in it."""
    (tmp_path / "k.c").write_bytes(SOURCE)
    return tmp_path


def write(base: Path, data: Any, name: str = "spec.json") -> Path:
    path = base / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- a valid spec ------------------------------------------------------------------------------------


def test_valid_spec_parses(base: Path) -> None:
    spec = parse_spec(make(), base)
    assert isinstance(spec, CampaignSpec)
    assert spec.name == "tiny"
    assert spec.target == "cpu-x86_64"
    assert spec.problems == [ProblemSpec("command", {"n": 64}, ("small",))]
    assert spec.space.names == ["size", "scale"]
    assert spec.space.run_knobs == ["scale"]
    assert spec.strategy == {"name": "random", "budget": 3, "seed": 1}
    assert spec.baseline == {"size": 1}
    assert spec.maximize  # the objective's goal is "max"


def test_valid_spec_bundles_its_sources_by_digest(base: Path, tmp_path: Path) -> None:
    spec = parse_spec(make(), base)
    digest = spec.workload["bundle"]
    assert "sources" not in spec.workload
    assert list(spec.files) == [digest]
    assert hashlib.sha256(spec.files[digest]).hexdigest() == digest
    out = tmp_path / "out"
    out.mkdir()
    assert unpack(spec.files[digest], out) == ["k.c"]
    assert (out / "k.c").read_bytes() == SOURCE


def test_strategy_defaults_to_grid_when_the_space_fits_and_auto_when_it_does_not(base: Path) -> None:
    assert parse_spec(make(strategy=None), base).strategy == {"name": "grid"}
    size = parse_spec(make(strategy=None), base).space.size
    assert parse_spec(make(strategy={"budget": size}), base).strategy == {"name": "grid", "budget": size}
    assert parse_spec(make(strategy={"budget": size - 1}), base).strategy == {"name": "auto", "budget": size - 1}


def test_target_defaults_to_this_cpu(base: Path) -> None:
    assert parse_spec(make(target=None), base).target == cpu_target()


def test_name_and_target_arguments_override_the_file(base: Path) -> None:
    spec = parse_spec(make(), base, name="other", target="sm_90")
    assert (spec.name, spec.target) == ("other", "sm_90")


def test_load_spec_reads_a_file_and_names_it_after_the_file(base: Path) -> None:
    spec = load_spec(write(base, make(name=None), "conv-sweep.json"))
    assert spec.name == "conv-sweep"
    assert load_spec(write(base, make())).name == "tiny"
    assert load_spec(write(base, make()), name="x").name == "x"


def test_load_spec_finds_sources_next_to_the_file(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative to the spec file, not to the current directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_spec(write(base, make())).workload["bundle"]


def test_spec_without_sources_has_no_bundle(base: Path) -> None:
    data = make()
    del data["workload"]["sources"]
    spec = parse_spec(data, base)
    assert "bundle" not in spec.workload and spec.files == {}


# --- one clear SpecError per mistake ---------------------------------------------------------------


def test_load_spec_not_json(base: Path) -> None:
    path = write(base, '{"name": "x",\n')
    with pytest.raises(SpecError, match=r"spec\.json: not valid JSON: .* at line \d"):
        load_spec(path)


def test_load_spec_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="No such file"):
        load_spec(tmp_path / "missing.json")


@pytest.mark.parametrize("data", ["[1, 2]", '"spec"', "3", "null"])
def test_load_spec_not_an_object(base: Path, data: str) -> None:
    with pytest.raises(SpecError, match=r"spec\.json: a spec is a JSON object"):
        load_spec(write(base, data))


def test_load_spec_errors_name_the_file(base: Path) -> None:
    with pytest.raises(SpecError, match=r"^.*spec\.json: the spec has an unknown field 'budget'$"):
        load_spec(write(base, make(budget=10)))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (make(budget=10), "the spec has an unknown field 'budget'"),
        (make(problems=None), "'problems' must be a non-empty list"),
        (make(problems=[]), "'problems' must be a non-empty list"),
        (make(problems={"kind": "command"}), "'problems' must be a non-empty list"),
        (make(problems=[{"params": {"n": 1}}]), "problem 0: needs a 'kind'"),
        (make(problems=[{"kind": "command"}, {"kind": ""}]), "problem 1: needs a 'kind'"),
        (make(problems=[{"kind": "command", "params": [1]}]), "problem 0: 'params' must be an object"),
        (make(problems=[{"kind": "command", "params": {"n": None}}]), "problem 0 parameter 'n'"),
        (make(problems=[{"kind": "command", "params": {"n": 1}, "tags": "small"}]), "'tags' must be a list"),
        (make(space=None), "the space must be an object"),
        (with_space(knobs={"size": [[1, 2]], "scale": [1]}), "knob 'size'.*not a bool, number or string"),
        (with_space(knobs={"size": [None], "scale": [1]}), "knob 'size'.*not a bool, number or string"),
        (with_space(knobs={"size": None, "scale": [1]}), "knob 'size': values must be a list"),
        (make(strategy={"name": "magic"}), r"unknown strategy 'magic' \(known: anneal, auto, "),
        (make(strategy={"name": "grid", "budgte": 3}), "strategy has an unknown field 'budgte'"),
        (make(strategy="random"), "'strategy' must be an object"),
        (make(strategy={"name": "random", "budget": 0}), "'budget' must be a positive integer"),
        (make(strategy={"name": "random", "budget": -5}), "'budget' must be a positive integer"),
        (make(strategy={"name": "random", "budget": "ten"}), "'budget' must be a positive integer"),
        (make(strategy={"name": "random", "budget": 2.5}), "'budget' must be a positive integer"),
        (make(strategy={"name": "random", "budget": True}), "'budget' must be a positive integer"),
        (make(target="gpu9000"), "unknown target 'gpu9000': expected sm_"),
        (make(workload=None), "the spec needs a 'workload' object"),
        (with_workload(kind="shell"), "unknown workload kind 'shell'"),
        (with_workload(sources="k.c"), "'sources' must be a list of file names"),
        (with_workload(sources=["k.c", "nope.c"]), r"workload source .*nope\.c: No such file or directory"),
        (with_workload(run=["./k", "{scale}", "{tile}"]), r"'run' uses \{tile\}, which is neither a knob"),
        (with_workload(build=["gcc", {"if": "fast", "then": ["-O3"]}, "k.c"]), r"'build' uses \{fast\}"),
        (with_workload(run="./k 1"), "shell string is not allowed"),
        (make(baseline={"size": 1, "tile": 8}), "baseline names 'tile', which is not a knob"),
        (make(baseline={"scale": 1}), "baseline lacks knob 'size'"),
        (make(baseline=[1]), "'baseline' must be an object"),
        (make(baseline={"size": [1]}), "baseline 'size'"),
        (make(options=[1]), "'options' must be an object"),
        (make(name=""), "the campaign needs a name"),
    ],
)
def test_each_mistake_gives_one_spec_error(base: Path, data: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(data, base)


def test_parse_spec_rejects_a_non_object(base: Path) -> None:
    with pytest.raises(SpecError, match="a spec is a JSON object"):
        parse_spec([SPEC], base)


def test_baseline_may_leave_run_time_knobs_open_and_lie_outside_the_space(base: Path) -> None:
    spec = parse_spec(make(baseline={"size": 16}), base)
    assert spec.baseline == {"size": 16}


def test_seed_that_is_not_an_integer_is_a_spec_error(base: Path) -> None:
    with pytest.raises(SpecError, match="seed"):
        parse_spec(make(strategy={"name": "random", "seed": "ten"}), base)


def test_strategy_name_that_is_not_a_string_is_a_spec_error(base: Path) -> None:
    with pytest.raises(SpecError, match="strategy"):
        parse_spec(make(strategy={"name": ["random"]}), base)


def test_source_outside_the_spec_directory_is_refused_on_the_users_side(base: Path) -> None:
    spec_dir = base / "specs"
    spec_dir.mkdir()
    with pytest.raises(SpecError, match="source"):
        parse_spec(with_workload(sources=["../k.c"]), spec_dir)


# --- targets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["sm_90", "sm_86", "sm_100", "sm_90a", "gfx90a:104", "gfx906:60", "gfx1100", "gfx942", "cpu-x86_64", "cpu-aarch64"],
)
def test_valid_targets(target: str) -> None:
    assert check_target(target) == target


@pytest.mark.parametrize(
    "target",
    [
        "gpu9000",
        "sm90",
        "sm_9",
        "SM_90",
        "sm_90 ",
        " sm_90",
        "gfx90a:",
        "gfx90a:0",
        "gfx90a:104:1",
        "gfx9",
        "cpu-",
        "cpu",
        "cpu-x86 64",
        "",
        "cuda",
        90,
        None,
        ["sm_90"],
    ],
)
def test_invalid_targets(target: object) -> None:
    with pytest.raises(SpecError, match="unknown target"):
        check_target(target)


def test_target_with_a_trailing_newline_is_invalid() -> None:
    # "sm_90\n" would name queues build.sm_90\n and eval.sm_90\n that no worker listens on.
    with pytest.raises(SpecError, match="unknown target"):
        check_target("sm_90\n")


# --- CampaignSpec directly -----------------------------------------------------------------------------


def _campaign_spec(**overrides: Any) -> CampaignSpec:
    fields: dict[str, Any] = {
        "name": "c",
        "problems": [ProblemSpec("command", {"n": 1})],
        "target": "cpu-x86_64",
        "space": Space.from_dict({"knobs": {"size": [1, 2]}}),
        "strategy": {"name": "grid"},
        "workload": {"kind": "noop"},
    }
    fields.update(overrides)
    return CampaignSpec(**fields)


def test_campaign_spec_validates_on_construction() -> None:
    assert _campaign_spec().name == "c"
    with pytest.raises(SpecError, match="needs a name"):
        _campaign_spec(name="")
    with pytest.raises(SpecError, match="no problems"):
        _campaign_spec(problems=[])
    with pytest.raises(SpecError, match="unknown target"):
        _campaign_spec(target="sm90")
    with pytest.raises(SpecError, match="unknown strategy"):
        _campaign_spec(strategy={"name": "magic"})


def test_campaign_spec_checks_the_workload_against_every_problem() -> None:
    workload = {"kind": "command", "run": ["./k", "{m}"], "objective": {"json": "t"}}
    with pytest.raises(SpecError, match=r"uses \{m\}"):
        _campaign_spec(problems=[ProblemSpec("command", {"m": 1}), ProblemSpec("command", {"n": 1})], workload=workload)


# --- baseline_configs ----------------------------------------------------------------------------------


def test_baseline_configs_once_per_combination_of_open_run_time_knobs() -> None:
    space = Space.from_dict(
        {"knobs": {"size": [1, 2], "scale": [1, 3], "threads": [1, 2, 4]}, "run_time": ["scale", "threads"]}
    )
    configs = baseline_configs(space, {"size": 7, "threads": 2})
    assert configs == [{"size": 7, "scale": 1, "threads": 2}, {"size": 7, "scale": 3, "threads": 2}]
    assert all(list(c) == space.names for c in configs)


def test_baseline_configs_of_a_complete_baseline_is_that_configuration() -> None:
    space = Space.from_dict({"knobs": {"size": [1, 2], "scale": [1, 3]}, "run_time": ["scale"]})
    assert baseline_configs(space, {"scale": 3, "size": 2}) == [{"size": 2, "scale": 3}]


def test_baseline_configs_cover_the_product_of_several_open_knobs() -> None:
    space = Space.from_dict({"knobs": {"size": [1], "a": [1, 2], "b": ["x", "y", "z"]}, "run_time": ["a", "b"]})
    configs = baseline_configs(space, {"size": 9})
    assert len(configs) == 6
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 6


# --- trial_keys ----------------------------------------------------------------------------------------


def _campaign(**overrides: Any) -> Campaign:
    fields: dict[str, Any] = {
        "target": "cpu-x86_64",
        "workload": {
            "kind": "command",
            "bundle": "abc",
            "build": ["gcc", "-DSIZE={size}", "k.c"],
            "run": ["./k", "{scale}"],
            "objective": {"json": "score"},
            "repeats": 3,
        },
        "provenance": {"toolchain": "gcc (Debian 12.2.0-14) 12.2.0"},
    }
    fields.update(overrides)
    return Campaign(**fields)


SPACE = Space.from_dict({"knobs": {"size": [1, 2], "scale": [1, 3]}, "run_time": ["scale"]})


def test_trial_keys_are_hex_digests() -> None:
    build_key, measure_key = trial_keys(_campaign(), 1, {"size": 1, "scale": 1}, SPACE)
    assert len(build_key) == len(measure_key) == 64
    assert set(build_key + measure_key) <= set("0123456789abcdef")


def test_configs_differing_in_a_run_time_knob_share_the_build_key_only() -> None:
    b1, m1 = trial_keys(_campaign(), 1, {"size": 1, "scale": 1}, SPACE)
    b2, m2 = trial_keys(_campaign(), 1, {"size": 1, "scale": 3}, SPACE)
    assert b1 == b2
    assert m1 != m2


def test_configs_differing_in_a_build_time_knob_differ_in_both_keys() -> None:
    b1, m1 = trial_keys(_campaign(), 1, {"size": 1, "scale": 1}, SPACE)
    b2, m2 = trial_keys(_campaign(), 1, {"size": 2, "scale": 1}, SPACE)
    assert b1 != b2 and m1 != m2


def test_trial_keys_do_not_depend_on_config_key_order() -> None:
    assert trial_keys(_campaign(), 1, {"size": 1, "scale": 3}, SPACE) == trial_keys(
        _campaign(), 1, {"scale": 3, "size": 1}, SPACE
    )


@pytest.mark.parametrize(
    "change",
    [
        {"problem_id": 2},
        {"target": "cpu-aarch64"},
        {"provenance": {"toolchain": "gcc 13"}},
        {"build": ["gcc", "-O3", "-DSIZE={size}", "k.c"]},
        {"bundle": "def"},
    ],
)
def test_what_decides_the_artifact_changes_both_keys(change: dict) -> None:
    before = trial_keys(_campaign(), 1, {"size": 1, "scale": 1}, SPACE)
    campaign = _campaign(
        target=change.get("target", "cpu-x86_64"),
        provenance=change.get("provenance", {"toolchain": "gcc (Debian 12.2.0-14) 12.2.0"}),
        workload={**_campaign().workload, **{k: v for k, v in change.items() if k in ("build", "bundle")}},
    )
    after = trial_keys(campaign, change.get("problem_id", 1), {"size": 1, "scale": 1}, SPACE)
    assert before[0] != after[0]
    assert before[1] != after[1]


@pytest.mark.parametrize(
    "change", [{"run": ["./k", "{scale}", "-v"]}, {"repeats": 5}, {"warmup": 2}, {"objective": {"json": "t"}}]
)
def test_how_it_is_measured_changes_only_the_measure_key(change: dict) -> None:
    before = trial_keys(_campaign(), 1, {"size": 1, "scale": 1}, SPACE)
    after = trial_keys(_campaign(workload={**_campaign().workload, **change}), 1, {"size": 1, "scale": 1}, SPACE)
    assert before[0] == after[0]
    assert before[1] != after[1]


def test_an_objective_observer_is_a_reading_of_the_gpu_observer_and_typos_are_named() -> None:
    from fleet.spec.workloads.command import OBSERVED, CommandSpec

    good = {"kind": "command", "run": ["./k"], "objective": {"json": "gflops", "observer": "energy", "goal": "min"}}
    CommandSpec(good)
    with pytest.raises(SpecError, match=r"'enrgy' is no reading of a GPU observer \(did you mean 'energy'\?\)"):
        CommandSpec({**good, "objective": {"json": "gflops", "observer": "enrgy"}})
    with pytest.raises(SpecError, match=r"unknown field 'gaol' \(did you mean 'goal'\?\)"):
        CommandSpec({**good, "objective": {"json": "gflops", "gaol": "max"}})
    with pytest.raises(SpecError, match=r"unknown field 'artifact' \(did you mean 'artifacts'\?\)"):
        CommandSpec({**good, "artifact": ["k"]})
    # The readings the spec accepts are the ones the observers give.
    from fleet.workers.observers import Sample, summarize

    given = summarize([Sample(0.0, 1000.0, 800.0, 100.0, 50.0), Sample(1.0, 900.0, 800.0, 120.0, 60.0)], 1.0)
    assert set(OBSERVED) <= set(given)


@pytest.mark.parametrize(
    ("clocks", "message"),
    [
        ({"memory": "mem_clock"}, r"'clocks' must be \{'sm': KNOB\}"),
        ({"sm": "sm_clock", "gpu": "x"}, r"'clocks' must be \{'sm': KNOB\}"),
        ("sm_clock", r"'clocks' must be \{'sm': KNOB\}"),
        ({"sm": 1980}, r"'clocks' 'sm' must name a knob"),
        ({"sm": "smclock"}, r"'clocks' 'sm' names 'smclock', which is neither a knob nor a problem parameter"),
    ],
)
def test_clocks_name_knobs_that_hold_them(clocks: Any, message: str, tmp_path: Path) -> None:
    """The GPU's clocks as knobs: the spec names run-time knobs; anything else is one line when it is loaded."""
    spec = {
        "name": "clocks",
        "target": "sm_90",
        "problems": [{"kind": "k", "params": {"n": 8}}],
        "space": {"knobs": {"sm_clock": {"values": [1410, 1980], "build": False}, "mem_clock": [2619]}},
        "workload": {
            "kind": "command",
            "run": ["./k", "{n}"],
            "objective": {"json": "ms"},
            "clocks": {"sm": "sm_clock"},
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert load_spec(path).workload["clocks"] == {"sm": "sm_clock"}
    path.write_text(json.dumps({**spec, "workload": {**spec["workload"], "clocks": clocks}}))
    with pytest.raises(SpecError, match=message) as caught:
        load_spec(path)
    assert "\n" not in str(caught.value)
