"""``fleet export mlflow``: a campaign run on real workers, read back with ``mlflow.search_runs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Fleet, write_spec

pytestmark = pytest.mark.integration


def test_a_campaign_reads_back_from_mlflow(fleet: Fleet, tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra (mlflow-skinny) is not installed")
    fleet.start_worker()
    spec = {
        "name": "tracked",
        "target": fleet.target,
        "problems": [{"kind": "pnpoly", "params": {}}],
        "space": {"knobs": {"block_size_x": [32, 64], "tile_size": [1, 2], "between_method": [0], "use_method": [0]}},
        "strategy": {"name": "grid"},
        "workload": {"kind": "replay", "space": "pnpoly__RTX_2080_Ti.json.gz"},
    }
    fleet.cli("tune", str(write_spec(fleet.home, spec)), check=True, timeout=300)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = fleet.cli("export", "mlflow", "tracked", env={"MLFLOW_TRACKING_URI": uri}, check=True, timeout=300)
    assert "parent run" in done.stdout
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["tracked"])
    parent = runs[runs["tags.fleet.campaign"] == "tracked"]
    assert len(parent) == 1
    children = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
    trials = fleet.store.campaign("tracked")
    assert len(children) == len(runs) - 1 == 4
    assert set(children["status"]) == {"FINISHED"} and set(children["params.block_size_x"]) == {"32", "64"}
    assert children["metrics.time_ms"].notna().all() and children["metrics.eval_seconds"].notna().all()
    assert trials.target == parent["params.target"].iloc[0]
    again = fleet.cli("export", "mlflow", "tracked", env={"MLFLOW_TRACKING_URI": uri})
    assert again.returncode == 1 and "already" in again.stderr and len(again.stderr.strip().splitlines()) == 1
