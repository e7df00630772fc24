"""The ``miopen`` workload in-process: with no MIOpen on the node, and with the MIOpenDriver test double."""

from __future__ import annotations

import io
import sqlite3
import sys
import tarfile
from pathlib import Path

import pytest

from fleet.miopen.driver import parse_line, problems
from fleet.miopen.keys import db_key
from fleet.workers.workloads import Job, load_workload
from fleet.workers.workloads import miopen as miopen_workload

DATA = Path(__file__).resolve().parents[1] / "data"
LINE = "./bin/MIOpenDriver conv -n 128 -c 1024 -H 14 -W 14 -k 256 -y 1 -x 1 -p 0 -q 0 -u 1 -v 1 -F 1 -t 1"


def fake_driver(folder: Path) -> Path:
    """A launcher for the MIOpenDriver test double, run by this interpreter (which has Fleet installed)."""
    launcher = folder / "MIOpenDriver"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DATA / "fake_miopen_driver.py"}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


def job(tmp_path: Path, step: str, name: str, params: dict) -> Job:
    scratch = tmp_path / name
    scratch.mkdir()
    return Job(config={"step": step}, problem=params, scratch=scratch, fetch=lambda key: b"")


@pytest.fixture
def problem() -> dict:
    return problems(parse_line(LINE))[0]


@pytest.fixture
def no_miopen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv("FLEET_MIOPEN_DRIVER", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(miopen_workload, "ROCM_DRIVER", tmp_path / "no-rocm" / "MIOpenDriver")


def test_without_miopen_the_build_and_the_run_fail_with_one_clear_reason(
    no_miopen: None, tmp_path: Path, problem: dict
) -> None:
    workload = load_workload({"kind": "miopen"})
    built = workload.build(job(tmp_path, "perf", "b", problem))
    assert built.data is None
    assert built.reason == miopen_workload.NO_MIOPEN
    measured = workload.evaluate(job(tmp_path, "find", "e", problem), b"")
    assert (measured.state, measured.reason) == ("errored", miopen_workload.NO_MIOPEN)


def test_a_driver_path_that_is_not_executable_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEET_MIOPEN_DRIVER", str(tmp_path / "nowhere"))
    path, why = miopen_workload.find_driver()
    assert path is None
    assert why == f"FLEET_MIOPEN_DRIVER={tmp_path / 'nowhere'} is not an executable file"


def test_compile_then_find_and_perf_with_the_driver_test_double(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, problem: dict
) -> None:
    monkeypatch.setenv("FLEET_MIOPEN_DRIVER", str(fake_driver(tmp_path)))
    workload = load_workload({"kind": "miopen"})
    built = workload.build(job(tmp_path, "find", "build", problem))
    assert built.reason is None and built.data is not None
    with tarfile.open(fileobj=io.BytesIO(built.data), mode="r:gz") as tar:
        assert tar.getnames() == ["gfx906_60.ukdb"]
        kdb = tmp_path / "k.ukdb"
        kdb.write_bytes(tar.extractfile("gfx906_60.ukdb").read())  # type: ignore[union-attr]
    with sqlite3.connect(kdb) as db:
        assert db.execute("SELECT count(*) FROM kern_db").fetchone() == (1,)

    key = db_key(problem)
    found = workload.evaluate(job(tmp_path, "find", "find", problem), built.data)
    assert found.state == "evaluated", found.reason
    entries = found.metrics["find"]
    assert [e[1] for e in entries] == ["ConvBinWinogradRxSf2x3g1", "GemmFwdRest"]  # fastest first
    assert found.objective == pytest.approx(entries[0][2], rel=1e-5)
    assert found.metrics["solver"] == "ConvBinWinogradRxSf2x3g1"
    assert found.metrics["miopen_version"] == "2_19_0_fake"

    tuned = workload.evaluate(job(tmp_path, "perf", "perf", problem), built.data)
    assert tuned.state == "evaluated", tuned.reason
    assert [solver for solver, _ in tuned.metrics["perf"]] == ["ConvBinWinogradRxSf2x3g1"]
    assert key.endswith("-F")


def test_a_driver_that_fails_errors_the_run_with_its_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    failing = tmp_path / "MIOpenDriver"
    failing.write_text("#!/bin/sh\necho 'MIOpen Error: miopenStatusUnknownError' >&2\nexit 7\n")
    failing.chmod(0o755)
    monkeypatch.setenv("FLEET_MIOPEN_DRIVER", str(failing))
    params = problems(parse_line(LINE))[0]
    measured = load_workload({"kind": "miopen"}).evaluate(job(tmp_path, "find", "x", params), _empty_bundle())
    assert measured.state == "errored"
    assert measured.reason == "MIOpenDriver exited with status 7: MIOpen Error: miopenStatusUnknownError"


def _empty_bundle() -> bytes:
    from fleet.bundle import pack

    return pack({})
