"""History on a real fleet (PostgreSQL, Redis, worker processes): a campaign of one kernel on one target seeds the
same kernel's campaign on another target.

The two targets replay two recorded spaces of one kernel (convolution_milo on an RTX A6000, then on an RTX A4000),
over a part of their knobs' values so that the first campaign can measure all of it.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import uuid
from pathlib import Path

from fleet.store import NewTrial, Store
from tests.conftest import SPACES, Fleet, write_spec

KNOBS = {
    "block_size_x": [128, 256],
    "block_size_y": [1, 2],
    "tile_size_x": [1, 2, 4],
    "tile_size_y": [2, 4],
    "read_only": [0, 1],
    "use_padding": [0],
    "use_shmem": [0, 1],
    "use_cmem": [1],
    "filter_height": [15],
    "filter_width": [15],
}


def recorded(name: str) -> dict[tuple, float]:
    with gzip.open(SPACES / f"{name}.json.gz") as handle:
        data = json.loads(handle.read())
    keys = data["tune_params_keys"]
    times = {}
    for text, record in data["cache"].items():
        config = dict(zip(keys, (int(v) for v in text.split(",")), strict=True))
        if all(config[k] in values for k, values in KNOBS.items()) and isinstance(record["time"], int | float):
            times[tuple(config[k] for k in KNOBS)] = float(record["time"])
    return times


def spec(name: str, target: str, space: str, strategy: dict, **extra: object) -> dict:
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "convolution_milo", "params": {"image": 4096}}],
        "space": {"knobs": KNOBS},
        "strategy": strategy,
        "workload": {"kind": "replay", "space": f"{space}.json.gz"},
        **extra,
    }


def trials_in_order(store: Store, name: str) -> list:
    campaign = store.campaign(name)
    return sorted(store.trials(campaign.id), key=lambda t: t.seq)


def test_a_campaign_on_one_target_seeds_the_same_kernel_on_another(fleet: Fleet) -> None:
    first_target, second_target = fleet.target, f"cpu-t{uuid.uuid4().hex[:8]}"
    here = recorded("convolution_milo__A4000")
    there = recorded("convolution_milo__A6000")
    optimum = min(here.values())
    worker = fleet.start_worker()
    # The first campaign measures every configuration of the kernel on the first target.
    path = write_spec(fleet.home, spec("a6000", first_target, "convolution_milo__A6000", {"name": "grid"}), "a.json")
    fleet.cli("tune", str(path), "--json", check=True, timeout=300)
    # The other target's workers have the same names (host and device): they start once these are gone.
    fleet.stop(worker)
    fleet.wait_for(lambda: not fleet.store.workers(within=2), what="the first target's workers to go")
    fleet.target = second_target
    fleet.start_worker(log="worker2.log")
    auto = {"name": "auto", "budget": 16, "seed": 0}
    seeded_from = {"from": ["a6000"]}  # history draws on the campaigns a spec names (fleet.trust)
    path = write_spec(
        fleet.home, spec("a4000", second_target, "convolution_milo__A4000", auto, history=seeded_from), "b.json"
    )
    fleet.cli("tune", str(path), "--json", check=True, timeout=300)
    path = write_spec(
        fleet.home, spec("plain", second_target, "convolution_milo__A4000", auto, history=False), "c.json"
    )
    fleet.cli("tune", str(path), "--json", check=True, timeout=300)

    seeded = trials_in_order(fleet.store, "a4000")
    best_there = sorted(there, key=there.get)
    from_history = [t for t in seeded if t.history]
    first = next((i for i, t in enumerate(seeded) if not t.history), len(seeded))
    # Its first trials are the first campaign's best, in order, each marked as from history with its source: one
    # source, so its three best (fleet.search.history.LEADERS).
    assert first == 3
    assert [tuple(t.config[k] for k in KNOBS) for t in seeded[:first]] == best_there[:first]
    assert seeded[0].history["rank"] == 1 and f"on {first_target}" in seeded[0].history["sources"][0]
    plain = trials_in_order(fleet.store, "plain")
    assert not any(t.history for t in plain)

    def trials_to_optimum(trials: list) -> int:
        for index, trial in enumerate(trials, 1):
            if here.get(tuple(trial.config[k] for k in KNOBS)) == optimum:
                return index
        return len(trials) + 1

    assert trials_to_optimum(seeded) <= first < trials_to_optimum(plain)
    # fleet trial and the report say so.
    shown = fleet.cli("trial", str(seeded[0].id), check=True).stdout
    assert "proposed from history: rank 1" in shown and first_target in shown
    # So does fleet trials: the table after the configuration, --json and --csv in fields of their own.
    table = fleet.cli("trials", "a4000", check=True).stdout.splitlines()
    marked = [line.split()[0] for line in table[1:] if "(history #" in line]
    assert marked == [str(t.id) for t in from_history]
    assert "(history #1)" in next(line for line in table if line.startswith(f"{seeded[0].id} "))
    listed = json.loads(fleet.cli("trials", "a4000", "--json", check=True).stdout)["trials"]
    assert {t["id"]: t["history"] for t in listed} == {t.id: t.history for t in seeded}
    rows = list(csv.DictReader(io.StringIO(fleet.cli("trials", "a4000", "--csv", check=True).stdout)))
    ranks = {int(row["trial"]): row["history_rank"] for row in rows}
    assert ranks == {t.id: str(t.history["rank"]) if t.history else "" for t in seeded}
    report = fleet.cli("report", "a4000", "-o", str(fleet.home / "r.html"), check=True)
    assert report.returncode == 0
    page = (fleet.home / "r.html").read_text()
    assert f"{len(from_history)} trials proposed from history" in page


# -- the store's query, on both backends ---------------------------------------------------------------------------


def measured(store: Store, campaign: str, target: str, kind: str, params: dict, results: list, tags: tuple = ()) -> int:
    """A done campaign of one problem on ``target`` whose trials measured ``results`` ((config, objective, valid))."""
    problem = store.add_problem(kind, params, tags)
    created = store.create_campaign(
        name=campaign,
        target=target,
        problem_ids=[problem],
        space={"knobs": {"a": [1, 2, 3, 4, 5]}},
        strategy={"name": "grid"},
        workload={"kind": "noop"},
        options={},
        provenance={},
    )
    configs = [
        NewTrial(problem, config, f"b{campaign}{i}", f"m{campaign}{i}") for i, (config, _, _) in enumerate(results)
    ]
    for (trial, _), (_, objective, valid) in zip(store.add_trials(created.id, target, configs), results, strict=True):
        record_run(store, trial, objective, valid)
    return created.id


def record_run(store: Store, trial: int, objective: float, valid: bool = True) -> None:
    """Compile, evaluate and record ``trial`` as a worker would, with ``objective`` in ms."""
    assert store.claim(trial, "compile", "w", 60, 3) and store.mark_compiled(trial, "w")
    assert store.claim(trial, "evaluate", "w", 60, 3)
    measurement = {"objective_name": "ms", "maximize": False, "objective": objective, "valid": valid}
    store.record(trial, "w", measurement={**measurement, "samples": [objective], "metrics": {}})


def test_history_finds_each_related_problem_and_target_best_first(store: Store) -> None:
    runs = [({"a": a}, float(10 - a), a != 5) for a in range(1, 6)]
    mine = measured(store, "mine", "sm_90", "conv", {"n": 1}, runs)
    measured(store, "other-gpu", "sm_80", "conv", {"n": 1}, [({"a": 2}, 3.0, True), ({"a": 1}, 2.0, True)])
    measured(store, "other-size", "sm_90", "conv", {"n": 2}, [({"a": 3}, 7.0, True)], tags=("prod",))
    measured(store, "other-kind", "sm_90", "gemm", {"n": 1}, [({"a": 1}, 1.0, True)])

    found = store.history("conv", per_source=3)

    assert [(s.params, s.target) for s in found] == [({"n": 1}, "sm_80"), ({"n": 1}, "sm_90"), ({"n": 2}, "sm_90")]
    by_target = {(s.params["n"], s.target): s for s in found}
    # Best first, three per source, the invalid one (a=5) never.
    assert by_target[1, "sm_90"].runs == [({"a": 4}, 6.0), ({"a": 3}, 7.0), ({"a": 2}, 8.0)]
    assert by_target[1, "sm_80"].runs == [({"a": 1}, 2.0), ({"a": 2}, 3.0)]
    assert "on sm_80" in by_target[1, "sm_80"].name
    # Narrowed, and never the asking campaign's own trials.
    assert [s.target for s in store.history("conv", targets=["sm_80"])] == ["sm_80"]
    assert [s.params for s in store.history("conv", tags=["prod"])] == [{"n": 2}]
    assert [(s.params["n"], s.target) for s in store.history("conv", exclude_campaign=mine)] == [
        (1, "sm_80"),
        (2, "sm_90"),
    ]
    assert store.history("conv", maximize=True) == []
    assert store.history("nothing") == []
    # Only what the trusted campaigns measured.
    assert [(s.params["n"], s.target) for s in store.history("conv", campaigns=[mine])] == [(1, "sm_90")]
    assert store.history("conv", campaigns=[]) == []


# -- fleet bench search --history DB: two GPUs of one target -------------------------------------------------------


def test_a_database_history_tells_two_gpus_of_one_target_apart(store: Store, tmp_path: Path) -> None:
    from fleet.bench.transfer import histories
    from fleet.interop.records import KIND, import_kt
    from fleet.replay import tuning_spaces_dir

    names = ["convolution_milo__A100", "convolution_milo__A4000", "convolution_milo__A6000"]
    paths = {name: tuning_spaces_dir() / f"{name}.json.gz" for name in names}
    for path in paths.values():
        import_kt(store, path)
        (tmp_path / path.name).symlink_to(path)

    # The RTX A4000 and the RTX A6000 are both sm_86: one source per target would mix their best runs.
    assert sorted(s.target for s in store.history(KIND)) == ["sm_80", "sm_86"]
    by_device = store.history(KIND, by_device=True)
    assert sorted((s.target, s.device) for s in by_device) == [
        ("sm_80", "NVIDIA A100-PCIE-40GB"),
        ("sm_86", "NVIDIA RTX A4000"),
        ("sm_86", "NVIDIA RTX A6000"),
    ]
    a6000 = next(s for s in by_device if s.device == "NVIDIA RTX A6000")
    assert [objective for _, objective in a6000.runs] == recorded_best("convolution_milo__A6000", 10)
    assert "on sm_86, NVIDIA RTX A6000" in a6000.name

    found = histories([paths["convolution_milo__A4000"]], store.url)["convolution_milo__A4000"]
    # The A4000's history is the A100 and the A6000 (the other GPU of its target), never its own records.
    assert [name.split(" on ")[1].split(" (")[0] for name in found["related"]] == [
        "sm_80, NVIDIA A100-PCIE-40GB",
        "sm_86, NVIDIA RTX A6000",
    ]
    # The same history as the folder of recorded spaces gives: the same sources, the same best runs.
    folder = histories([paths["convolution_milo__A4000"]], tmp_path)["convolution_milo__A4000"]
    assert folder["related"] == ["convolution_milo__A100", "convolution_milo__A6000"]
    assert [c["config"] for c in found["configs"]] == [c["config"] for c in folder["configs"]]
    assert found["first"] == folder["first"]


def recorded_best(name: str, top: int) -> list[float]:
    """The ``top`` best valid times of a recorded space."""
    with gzip.open(SPACES / f"{name}.json.gz") as handle:
        data = json.loads(handle.read())
    times = sorted(float(r["time"]) for r in data["cache"].values() if isinstance(r["time"], int | float))
    return times[:top]
