"""A campaign of two objectives, end to end: examples/matmul-c's time and tile size tuned by real workers, its Pareto
front in `fleet best`, the report and the exports."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from fleet.search.pareto import Objective, dominates, loss_vector
from tests.conftest import Fleet, write_spec

ROOT = Path(__file__).resolve().parents[2]
OBJECTIVES = [Objective("seconds"), Objective("tile_kib")]


def pareto_spec(fleet: Fleet) -> dict:
    example = ROOT / "examples" / "matmul-c"
    shutil.copy(example / "matmul.c", fleet.home / "matmul.c")
    spec = json.loads((example / "spec-pareto.json").read_text())
    spec["target"] = fleet.target
    spec["problems"][0]["params"]["n"] = 96  # milliseconds a run
    spec["strategy"] = {"name": "auto", "budget": 14, "seed": 3, "options": {"population": 5}}
    spec["workload"]["repeats"] = 1
    return spec


def test_two_objectives_tuned_by_real_workers_and_their_front_shown(fleet: Fleet) -> None:
    fleet.start_worker("--build-procs", "2")
    path = write_spec(fleet.home, pareto_spec(fleet))

    tuned = json.loads(fleet.cli("tune", str(path), "--json", check=True).stdout)

    problem = tuned["problems"][0]
    assert problem["trials"] == {"evaluated": 14}
    # Every measurement keeps both objectives; the first is its objective too.
    results = fleet.store.results(campaign_id=fleet.store.campaign("matmul-c-pareto").id)
    assert len(results) == 14
    assert all(set(r.objectives) == {"seconds", "tile_kib"} and r.objectives["seconds"] == r.objective for r in results)
    losses = [loss_vector(r.objectives, OBJECTIVES) for r in results]
    beaten = [any(dominates(other, loss) for other in losses) for loss in losses]
    on_front = [r.trial_id for r, out in zip(results, beaten, strict=True) if not out]
    assert sorted(p["trial"] for p in problem["front"]) == sorted(on_front)

    best = json.loads(fleet.cli("best", "matmul-c-pareto", "--json", check=True).stdout)
    assert best["objectives"] == [{"name": "seconds", "goal": "min"}, {"name": "tile_kib", "goal": "min"}]
    front = best["problems"][0]["front"]
    assert sorted(p["trial"] for p in front) == sorted(on_front)
    assert best["preference"] == "least seconds"
    chosen = [p for p in front if p["chosen"]]
    assert len(chosen) == 1 and chosen[0]["objectives"]["seconds"] == min(p["objectives"]["seconds"] for p in front)

    # Any tile size within 1000% of the fastest time: the smallest tile among those points of the front. (Most
    # often every point; on a machine at a load of 20, one of the smallest tiles ran more than 11 times slower.)
    leanest = fleet.cli("best", "matmul-c-pareto", "--prefer", "tile_kib", "--within", "1000", "--json", check=True)
    chosen = [p for p in json.loads(leanest.stdout)["problems"][0]["front"] if p["chosen"]]
    fastest = min(p["objectives"]["seconds"] for p in front)
    near = [p["objectives"]["tile_kib"] for p in front if p["objectives"]["seconds"] <= fastest * 11]
    assert len(chosen) == 1 and chosen[0]["objectives"]["tile_kib"] == min(near)
    table = fleet.cli("best", "matmul-c-pareto", check=True).stdout.splitlines()
    assert table[0].startswith(f"matmul-c n=96: Pareto front of {len(front)} (seconds, tile_kib); * the least seconds")
    assert len(table) == 2 + len(front) and sum(line.startswith("  * ") for line in table) == 1
    wrong = fleet.cli("best", "matmul-c-pareto", "--prefer", "energy")
    assert wrong.returncode == 1
    assert wrong.stderr == "fleet: error: no objective 'energy': the campaign's are seconds, tile_kib\n"

    report = fleet.cli("report", "matmul-c-pareto", "-o", "-", check=True).stdout
    assert "Pareto front: seconds against tile_kib" in report and '<polyline class="front"' in report
    assert report.count('class="chosen"') == 1

    rows = list(csv.DictReader(io.StringIO(fleet.cli("trials", "matmul-c-pareto", "--csv", check=True).stdout)))
    assert all(float(row["seconds"]) == float(row["objective"]) and float(row["tile_kib"]) > 0 for row in rows)


def test_the_exports_keep_every_objective(fleet: Fleet, tmp_path: Path) -> None:
    import mlflow
    import optuna

    fleet.start_worker("--build-procs", "2")
    spec = pareto_spec(fleet)
    spec["strategy"] = {"name": "random", "budget": 6, "seed": 1}
    fleet.cli("tune", str(write_spec(fleet.home, spec)), check=True)
    front = json.loads(fleet.cli("best", "matmul-c-pareto", "--json", check=True).stdout)["problems"][0]["front"]

    fleet.cli("export", "kt", "matmul-c-pareto", "-o", str(tmp_path / "kt"), check=True)
    (cache,) = [d for d in map(json.loads, map(Path.read_text, (tmp_path / "kt").rglob("*.json"))) if "cache" in d]
    records = cache["cache"].values()
    assert len(records) == 6
    assert all(r["tile_kib"] > 0 and r["seconds"] * 1000 == pytest.approx(r["time"]) for r in records)

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    fleet.cli("export", "optuna", "matmul-c-pareto", "--storage", storage, check=True)
    study = optuna.load_study(study_name="matmul-c-pareto / problem 1", storage=storage)
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2
    assert sorted(t.values for t in study.best_trials) == sorted(
        [p["objectives"]["seconds"], p["objectives"]["tile_kib"]] for p in front
    )

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fleet.cli("export", "mlflow", "matmul-c-pareto", env={"MLFLOW_TRACKING_URI": uri}, check=True)
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["matmul-c-pareto"])
    children = runs[runs["tags.fleet"] == "trial"]
    assert len(children) == 6 and (children["metrics.tile_kib"] > 0).all()
