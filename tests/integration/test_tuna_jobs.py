"""Tuna's jobs on real workers: with no MIOpen on the node they error with one clear reason; with the
MIOpenDriver test double they run the perf and find steps, and their results export, promote and invalidate;
with the broker down they write nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fleet.workers.workloads.miopen import NO_MIOPEN
from tests.conftest import MIOPEN

DATA = Path(__file__).resolve().parents[1] / "data"


def fake_driver(folder: Path) -> Path:
    """A launcher for the MIOpenDriver test double (tests/data/fake_miopen_driver.py), run by this Python."""
    launcher = folder / "MIOpenDriver"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DATA / "fake_miopen_driver.py"}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


def test_without_miopen_every_job_errors_with_one_clear_reason(fleet) -> None:  # type: ignore[no-untyped-def]
    fleet.env.pop("FLEET_MIOPEN_DRIVER", None)
    fleet.cli("miopen", "import", str(MIOPEN / "alexnet.txt"), "-t", "alexnet", check=True)
    added = fleet.cli(
        "miopen",
        "jobs",
        "add",
        "--target",
        fleet.target,
        "--reason",
        "first",
        "--tag",
        "alexnet",
        "--direction",
        "F",
        check=True,
    )
    assert f"first@{fleet.target}: 5 jobs created, 0 already there; 5 sent" in added.stdout
    fleet.start_worker()
    campaign = fleet.store.campaign(f"first@{fleet.target}")
    fleet.wait_for(lambda: fleet.store.trial_counts(campaign.id) == {"errored": 5}, timeout=120, what="5 errored jobs")
    assert {t.reason for t in fleet.store.trials(campaign.id)} == {f"build failed: {NO_MIOPEN}"}
    listed = json.loads(fleet.cli("miopen", "jobs", "list", "--reason", "first", "--json", check=True).stdout)
    assert listed[0]["steps"] == {"find": {"errored": 5}}
    line = (MIOPEN / "alexnet.txt").read_text().splitlines()[0]
    shown = json.loads(fleet.cli("miopen", "query", line, "--json", check=True).stdout)
    trial = shown["problems"][0]["trials"][0]
    assert (trial["state"], trial["why"], trial["reason"]) == ("errored", f"build failed: {NO_MIOPEN}", "first")


def test_jobs_run_export_promote_and_invalidate(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    driver = fake_driver(tmp_path)
    t = fleet.target
    fleet.cli("miopen", "import", str(MIOPEN / "conv_configs_NHWC.txt"), "-t", "nhwc", check=True)
    fleet.cli("miopen", "jobs", "add", "--target", t, "--reason", "tune", "--tag", "nhwc", "--step", "perf",
              "--step", "find", check=True)  # fmt: skip
    fleet.start_worker(env={"FLEET_MIOPEN_DRIVER": str(driver)})
    campaign = fleet.store.campaign(f"tune@{t}")
    fleet.wait_for(
        lambda: fleet.store.trial_counts(campaign.id).get("evaluated") == 10, timeout=180, what="10 evaluated jobs"
    )

    out = tmp_path / "out"
    fleet.cli(
        "miopen", "export", "find-db", "--target", t, "--campaign", "tune", "-o", str(out / "find.txt"), check=True
    )
    records = (out / "find.txt").read_text().splitlines()
    assert len(records) == 5
    keys = {r.partition("=")[0] for r in records}
    for key in keys:
        shown = json.loads(fleet.cli("miopen", "query", key, "--json", check=True).stdout)
        assert shown["keys"] == [key]
        assert {tr["state"] for tr in shown["problems"][0]["trials"]} == {"evaluated"}
    provenance = json.loads((out / "find.txt.provenance.json").read_text())
    assert provenance["campaigns"] == [f"tune@{t}"] and provenance["records"] == 5
    assert provenance["toolchains"] == ["MIOpen 2_19_0_fake"]  # the version the worker's MIOpen wrote
    fleet.cli(
        "miopen", "export", "perf-db", "--target", t, "--campaign", "tune", "-o", str(out / "perf.db"), check=True
    )
    kdb = fleet.cli(
        "miopen", "export", "kernel-db", "--target", t, "--campaign", "tune", "-o", str(out / "k.kdb"), check=True
    )
    assert kdb.stdout.startswith("5 records written")

    promoted = fleet.cli("miopen", "golden", "update", "--campaign", "tune", "--target", t, check=True)
    assert f"golden {t} version 1: 10 entries" in promoted.stdout
    fleet.cli(
        "miopen",
        "export",
        "find-db",
        "--target",
        t,
        "--golden",
        "--version",
        "1",
        "-o",
        str(out / "g1.txt"),
        check=True,
    )
    assert (out / "g1.txt").read_bytes() == (out / "find.txt").read_bytes()

    # A copy is new work; invalid jobs are never run and never exported.
    copied = fleet.cli("miopen", "jobs", "copy", "--from-reason", "tune", "--reason", "retune", "--no-send", check=True)
    assert f"retune@{t}: 10 jobs created" in copied.stdout
    assert "10 jobs invalidated" in fleet.cli("miopen", "jobs", "invalidate", "--reason", "retune", check=True).stdout
    forward = fleet.cli("miopen", "jobs", "invalidate", "--reason", "tune", "--direction", "F", check=True)
    assert "4 jobs invalidated" in forward.stdout  # two forward problems, two steps each
    listed = json.loads(fleet.cli("miopen", "jobs", "list", "--target", t, "--json", check=True).stdout)
    assert {row["reason"]: row["steps"] for row in listed} == {
        "tune": {"find": {"evaluated": 3, "invalid": 2}, "perf": {"evaluated": 3, "invalid": 2}},
        "retune": {"find": {"invalid": 5}, "perf": {"invalid": 5}},
    }
    fleet.cli(
        "miopen", "export", "find-db", "--target", t, "--campaign", "tune", "-o", str(out / "after.txt"), check=True
    )
    after = (out / "after.txt").read_text().splitlines()
    assert len(after) == 3 and not any(r.partition("=")[0].endswith("-F") for r in after)
    # The golden version is a copy: exported later, it gives the same bytes.
    fleet.cli(
        "miopen",
        "export",
        "find-db",
        "--target",
        t,
        "--golden",
        "--version",
        "1",
        "-o",
        str(out / "g1b.txt"),
        check=True,
    )
    assert (out / "g1b.txt").read_bytes() == (out / "g1.txt").read_bytes()


def test_jobs_with_the_broker_down_write_nothing(fleet) -> None:  # type: ignore[no-untyped-def]
    t = fleet.target
    fleet.cli("miopen", "import", str(MIOPEN / "conv_configs_NHWC.txt"), "-t", "nhwc", check=True)
    fleet.cli("miopen", "jobs", "add", "--target", t, "--reason", "first", "--tag", "nhwc", "--no-send", check=True)
    down = {"FLEET_BROKER_URL": "redis://127.0.0.1:1/0"}  # nothing listens on port 1

    for args in (
        ("miopen", "jobs", "add", "--target", t, "--reason", "later", "--tag", "nhwc"),
        ("miopen", "jobs", "copy", "--from-reason", "first", "--reason", "copied"),
    ):
        done = fleet.cli(*args, env=down)
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("fleet: error: broker redis://127.0.0.1:1/0 does not answer")
    assert {c.name for c in fleet.store.campaigns()} == {f"first@{t}"}
