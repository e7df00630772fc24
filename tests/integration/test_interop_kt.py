"""Kernel Tuner and T4 files in and out of Fleet on PostgreSQL: every recorded tuning space survives an import and
an export; a campaign run on real workers replays in Kernel Tuner; bad files are refused whole."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.interop import export_kt, import_kt, read_results, write_kt
from fleet.interop.kerneltuner import read_cache
from fleet.store import Campaign, Store, Trial
from tests.conftest import SPACES, Fleet, write_spec

pytestmark = pytest.mark.integration


def by_config(records: list) -> dict[str, tuple]:
    return {json.dumps(r.config, sort_keys=True): (r.value, r.error, r.times) for r in records}


def test_every_recorded_space_comes_back_the_same(postgres_server: object, tmp_path: Path) -> None:
    store = Store(postgres_server.create_database("interop_all"))  # type: ignore[attr-defined]
    store.upgrade()
    files = sorted(SPACES.glob("*.json.gz"))
    assert len(files) >= 13
    for path in files:
        original = read_results(path)
        # The MI250X file was recorded with an empty device name: its target is given.
        done = import_kt(store, path, target="gfx90a:110" if "MI250X" in path.name else None, results=original)
        campaign = store.campaign(done.campaign)
        (exported,) = export_kt(store, campaign)
        assert by_config(exported.results.records) == by_config(original.records), path.name
        assert exported.results.device == original.device and exported.results.keys == original.keys
        if path.name.startswith(("pnpoly", "convolution_kt", "convolution_milo__MI250X")):
            # Through the files too (writing and reading tens of thousands of records takes seconds: three files).
            # A T4 file has no "no samples" (its runtimes are a list).
            cache, t4 = write_kt([exported], tmp_path / path.name, campaign.target)
            assert by_config(read_cache(cache).records) == by_config(original.records), path.name
            from_t4 = {k: (v, e, t or []) for k, (v, e, t) in by_config(read_results(t4).records).items()}
            assert from_t4 == {k: (v, e, t or []) for k, (v, e, t) in by_config(original.records).items()}, path.name
    with store.transaction() as connection:
        assert connection.scalar(select(func.count()).select_from(Campaign)) == len(files)
    store.close()


def test_bad_files_are_one_line_and_store_nothing(fleet: Fleet, tmp_path: Path) -> None:
    with gzip.open(SPACES / "pnpoly__RTX_2080_Ti.json.gz") as handle:
        document = json.loads(handle.read())
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document))
    key = next(iter(document["cache"]))
    document["cache"]["0,0,0,0"] = document["cache"].pop(key)
    mismatched = tmp_path / "mismatched.json"
    mismatched.write_text(json.dumps(document))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**json.loads(good.read_text()), "device_name": "Voodoo 3"}))
    bad_t4 = tmp_path / "x_T4.json"
    bad_t4.write_text(json.dumps({"schema_version": "1.0.0", "results": [{"configuration": {}}]}))
    for bad, said in (
        (mismatched, "does not match its parameters"),
        (unknown, "unknown device name 'Voodoo 3'"),
        (bad_t4, "not a T4 results file"),
    ):
        # The good file first: it is not stored either, since every file is checked before anything is.
        done = fleet.cli("import", "kt", str(good), str(bad))
        assert done.returncode == 1 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    with fleet.store.transaction() as connection:
        assert connection.scalar(select(func.count()).select_from(Campaign)) == 0
    # A cache file that a cut-short run left open is read, as Kernel Tuner reads it.
    cut = tmp_path / "cut.json"
    cut.write_text(good.read_text().removesuffix("}}") + ",")
    done = fleet.cli("import", "kt", str(cut), "--json", check=True)
    assert json.loads(done.stdout)[0]["records"] == len(document["cache"])


def test_a_campaign_on_real_workers_exports_to_kernel_tuner_and_t4(fleet: Fleet, tmp_path: Path) -> None:
    import kernel_tuner
    from autotuning_methodology.formats_interface import load_T4_format

    with gzip.open(SPACES / "pnpoly__RTX_2080_Ti.json.gz") as handle:
        recorded = json.loads(handle.read())
    spec = {
        "name": "kt-out",
        "target": fleet.target,
        "problems": [{"kind": "pnpoly", "params": {}}],
        "space": {"knobs": recorded["tune_params"]},
        "strategy": {"name": "random", "budget": 30, "seed": 3},
        "workload": {"kind": "replay", "space": "pnpoly__RTX_2080_Ti.json.gz"},
    }
    fleet.start_worker()
    fleet.cli("tune", str(write_spec(fleet.home, spec)), "--json", check=True, timeout=300)
    out = tmp_path / "kt"
    done = fleet.cli("export", "kt", "kt-out", "-o", str(out), check=True)
    (cache,) = [p for p in out.glob("*/*.json") if not p.name.endswith(("_T4.json", "_T1.json"))]
    (t4,) = out.glob("*/*_T4.json")
    (t1,) = out.glob("*/*_T1.json")  # its space, which T1 expresses (a kernel file Fleet does not have is said)
    assert "KernelFile names" in done.stderr and json.loads(t1.read_text())["ConfigurationSpace"]
    assert str(cache) in done.stdout
    load_T4_format(t4, validate=True)
    with fleet.store.transaction() as connection:
        finished = connection.scalar(
            select(func.count()).select_from(Trial).where(Trial.state.in_(("evaluated", "invalid")))
        )
    exported = read_cache(cache)
    assert len(exported.records) == finished
    valid = [r for r in exported.records if r.error is None]
    assert all(r.extra["benchmark_time"] > 0 and r.times for r in valid)
    results, _ = kernel_tuner.tune_cache(str(cache), strategy="brute_force", quiet=True)
    best = min((r for r in results if "__error__" not in r), key=lambda r: r["time"])
    campaign = fleet.store.campaign("kt-out")
    (problem,) = fleet.store.campaign_problems(campaign.id)
    (fleet_best, config), *_ = fleet.store.best(problem.id, fleet.target)
    assert best["time"] == min(r.value for r in valid) == fleet_best.objective
    assert {k: best[k] for k in recorded["tune_params_keys"]} == config
