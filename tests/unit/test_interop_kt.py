"""Kernel Tuner cache files and T4 files, read and written by Fleet and checked with the real packages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.interop import export_kt, import_kt, read_results, target_of_device, write_kt
from fleet.interop.kerneltuner import KTRecord, KTResults, dumps_cache, read_cache
from fleet.interop.t4 import t4_document
from fleet.store import Campaign, Store
from tests.conftest import SPACES

PNPOLY = SPACES / "pnpoly__RTX_2080_Ti.json.gz"


def small() -> KTResults:
    records = [
        KTRecord({"bx": 32, "unroll": True}, 1.5, None, [1.5, 1.6], {"compile_time": 20.0, "GFLOP/s": 3.0}),
        KTRecord({"bx": 64, "unroll": True}, None, "CompilationFailedConfig", None, {"compile_time": 1.0}),
        KTRecord({"bx": 64, "unroll": False}, 0.75, None, [0.75], {"benchmark_time": 8}),
    ]
    params = {"bx": [32, 64], "unroll": [True, False]}
    return KTResults("NVIDIA A100-PCIE-40GB", "k", [1024], ["bx", "unroll"], params, "time", records)


def by_config(results: KTResults) -> dict[str, tuple]:
    return {json.dumps(r.config, sort_keys=True): (r.value, r.error, r.times) for r in results.records}


def test_a_cache_file_cut_short_is_read_as_kernel_tuner_reads_it(tmp_path: Path) -> None:
    from kernel_tuner.util import read_cache as kt_read_cache

    text = dumps_cache(small())
    whole = tmp_path / "whole.json"
    whole.write_text(text)
    assert by_config(read_cache(whole)) == by_config(small())
    # Kernel Tuner appends "\n<entry>," per configuration and closes the file at the end: a run cut short has
    # neither the cache's nor the file's closing brace.
    cut = tmp_path / "cut.json"
    cut.write_text(text.rstrip().removesuffix("}").rstrip().removesuffix("}").rstrip() + ",")
    assert by_config(read_cache(cut)) == by_config(small())
    assert set(kt_read_cache(str(cut), open_cache=False)["cache"]) == set(json.loads(text)["cache"])
    one = tmp_path / "one.json"  # the file's brace alone missing
    one.write_text(text.rstrip().removesuffix("}"))
    assert len(read_cache(one).records) == 3


def test_bad_files_are_one_clear_error(tmp_path: Path) -> None:
    document = json.loads(dumps_cache(small()))
    document["cache"]["64,False"]["bx"] = 128
    bad = tmp_path / "A100.json"
    bad.write_text(json.dumps(document))
    with pytest.raises(SpecError, match=r"entry '64,False' does not match its parameters \(they give '128,False'\)"):
        read_results(bad)
    t4 = t4_document(small())
    t4["results"][0]["invalidity"] = "sometimes"
    bad.write_text(json.dumps(t4))
    with pytest.raises(SpecError, match=r"not a T4 results file: .*'sometimes' is not one of .* \(at results/0/"):
        read_results(bad)
    bad.write_text("{]")
    with pytest.raises(SpecError, match="not JSON"):
        read_results(bad)
    with pytest.raises(SpecError, match="unknown device name 'Voodoo 3'"):
        target_of_device("Voodoo 3")
    assert target_of_device("NVIDIA GeForce RTX 2080 Ti") == "sm_75"
    assert target_of_device("AMD Instinct MI50/MI60") == "gfx906:60"


def test_t4_is_valid_t4_and_reads_back_with_its_cache_file(tmp_path: Path) -> None:
    from autotuning_methodology.formats_interface import load_T4_format

    (tmp_path / "A100.json").write_text(dumps_cache(small()))
    (tmp_path / "A100_T4.json").write_text(json.dumps(t4_document(small())))
    load_T4_format(tmp_path / "A100_T4.json", validate=True)
    back = read_results(tmp_path / "A100_T4.json")
    assert back.format == "t4" and back.kernel == "k" and back.device == "NVIDIA A100-PCIE-40GB"
    want = {k: (v, e, t or []) for k, (v, e, t) in by_config(small()).items()}
    assert by_config(back) == want
    assert back.records[0].extra["GFLOP/s"] == 3.0 and back.records[0].extra["compile_time"] == 20.0


def test_a_recorded_space_imports_exports_and_replays_in_kernel_tuner(tmp_path: Path) -> None:
    import kernel_tuner

    store = Store(f"sqlite:///{tmp_path / 'fleet.db'}")
    store.upgrade()
    done = import_kt(store, PNPOLY)
    # The sample's 432 configurations, 410 valid (tests/data/tuning-spaces/README.md).
    assert (done.target, done.records, done.invalid, done.created) == ("sm_75", 432, 432 - 410, True)
    assert not import_kt(store, PNPOLY).created  # the same file again adds nothing
    campaign: Campaign = store.campaign(done.campaign)
    exports = export_kt(store, campaign)
    cache, t4 = write_kt(exports, tmp_path / "out", campaign.target)
    assert cache.name == "NVIDIA_GeForce_RTX_2080_Ti.json" and t4.name == "NVIDIA_GeForce_RTX_2080_Ti_T4.json"
    assert by_config(read_cache(cache)) == by_config(read_cache(PNPOLY))
    best, _ = store.best(exports[0].problem.id, "sm_75")[0]
    results, _ = kernel_tuner.tune_cache(str(cache), strategy="brute_force", quiet=True)
    found = min((r for r in results if "__error__" not in r), key=lambda r: r["time"])
    assert found["time"] == best.objective == min(r.value for r in read_cache(PNPOLY).records if r.value is not None)
    store.close()
