"""Facts from the worker (issue 13): the toolchain is taken by the build worker that builds, the device by the
evaluation worker that measures, never where the campaign is submitted. Real PostgreSQL, Redis, workers, gcc."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from sqlalchemy import select

from fleet.store import Artifact, Campaign, Measurement, Trial
from fleet.workers.gpus import cpu_model
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec as campaign_kernel_spec

FAKE_GCC = "gcc (Fleet fake) 99.1.0"


def kernel_spec(fleet: Fleet, name: str, **workload: object) -> dict:
    """test_campaign's kernel, at two sizes and two scales, with no baseline: 4 trials, 2 builds."""
    spec = campaign_kernel_spec(
        fleet, name=name, space={"knobs": {"size": [2, 3], "scale": {"values": [1, 10], "build": False}}}
    )
    del spec["baseline"]
    spec["workload"] |= workload
    return spec


def tool_dir(fleet: Fleet, name: str, version_line: str, *, then: str | None = None) -> Path:
    """A directory holding a script ``name`` that prints ``version_line`` for --version, else runs ``then``."""
    directory = fleet.home / f"bin-{name}"
    directory.mkdir(exist_ok=True)
    script = directory / name
    otherwise = f'exec {then} "$@"' if then else "exit 1"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "{version_line}"; exit 0; fi\n{otherwise}\n')
    script.chmod(0o755)
    return directory


def rows(fleet: Fleet, model: type, campaign: str | None = None) -> list:
    query = select(model)
    if campaign is not None:
        query = query.join(Campaign, Campaign.id == model.campaign_id).where(Campaign.name == campaign)
    with fleet.store.session() as session:
        return list(session.scalars(query.order_by(model.id)))


def measured(fleet: Fleet, campaign: str) -> list[Measurement]:
    with fleet.store.session() as session:
        return list(
            session.scalars(
                select(Measurement)
                .join(Trial, Trial.id == Measurement.trial_id)
                .join(Campaign, Campaign.id == Trial.campaign_id)
                .where(Campaign.name == campaign)
            )
        )


def replace_worker(fleet: Fleet, old: subprocess.Popen[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Stop ``old`` and start a worker with ``env`` in its place.

    The new one has the same names: it is waited for once the old ones' last heartbeats are too old to count.
    """
    fleet.stop(old, signal.SIGTERM)
    time.sleep(2.5)
    return fleet.start_worker(env=env, log="replacement.log")


def test_two_build_workers_with_different_gcc_build_and_measure_apart(fleet: Fleet) -> None:
    real = shutil.which("gcc")
    assert real is not None
    real_version = subprocess.run([real, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[
        0
    ]
    fake = tool_dir(fleet, "gcc", FAKE_GCC, then=real)
    # Where `fleet tune` runs, gcc is the real one: what the builds carry must be the workers' own.
    first = fleet.start_worker()
    fleet.cli("tune", str(write_spec(fleet.home, kernel_spec(fleet, "real"), "real.json")), check=True)
    second = replace_worker(fleet, first, env={"PATH": f"{fake}:{os.environ['PATH']}"})
    fleet.cli("tune", str(write_spec(fleet.home, kernel_spec(fleet, "fake"), "fake.json")), check=True)

    # One build key per size, built once by each toolchain: two artifacts each.
    artifacts = rows(fleet, Artifact)
    assert sorted((a.build_config["size"], a.toolchain) for a in artifacts) == sorted(
        (size, version) for size in (2, 3) for version in (real_version, FAKE_GCC)
    )
    assert all(a.state == "built" for a in artifacts)
    # The campaign measured on the fake-gcc worker reused nothing measured with the real gcc.
    real_trials, fake_trials = rows(fleet, Trial, "real"), rows(fleet, Trial, "fake")
    assert [t.state for t in real_trials + fake_trials] == ["evaluated"] * 8
    assert {t.toolchain for t in real_trials} == {real_version}
    assert {t.toolchain for t in fake_trials} == {FAKE_GCC}
    assert all(t.source_trial_id is None for t in fake_trials)
    assert {m.toolchain for m in measured(fleet, "real")} == {real_version}
    assert {m.toolchain for m in measured(fleet, "fake")} == {FAKE_GCC}
    # Every measurement says what it ran on: here, this machine's CPU.
    for m in measured(fleet, "real") + measured(fleet, "fake"):
        assert m.device_kind == cpu_model()
        assert m.device is not None and m.device.startswith(cpu_model())
    # No campaign holds the toolchain of where it was submitted.
    assert all("toolchain" not in c.provenance for c in rows(fleet, Campaign))

    # The same toolchain and device: a third campaign on the fake-gcc worker reuses the fake campaign's.
    fleet.cli("tune", str(write_spec(fleet.home, kernel_spec(fleet, "again"), "again.json")), check=True)
    fake_ids = {t.id for t in fake_trials}
    again = rows(fleet, Trial, "again")
    assert [t.state for t in again] == ["evaluated"] * 4
    assert {t.source_trial_id for t in again} == fake_ids
    assert len(rows(fleet, Artifact)) == 4  # no build either
    fleet.stop(second, signal.SIGTERM)

    # The export names what each record was built and measured with.
    out = fleet.home / "steps.csv"
    fleet.cli("export", "steps", "fake", "-o", str(out), check=True)
    text = out.read_text()
    assert FAKE_GCC in text and cpu_model() in text


def test_a_toolchain_only_the_workers_have_is_no_obstacle_to_submitting(fleet: Fleet) -> None:
    tool = tool_dir(fleet, "fleet-test-cc", "fleet-test-cc 7.0 (only on the nodes)")
    spec = kernel_spec(fleet, "nodes-only", toolchain=["fleet-test-cc", "--version"])
    path = write_spec(fleet.home, spec, "nodes-only.json")
    assert shutil.which("fleet-test-cc", path=fleet.env["PATH"]) is None

    submitted = fleet.cli("submit", str(path))  # no such command here, and no worker yet
    assert submitted.returncode == 0, submitted.stderr
    fleet.start_worker(env={"PATH": f"{tool}:{os.environ['PATH']}"})
    fleet.cli("resume", "nodes-only", "--json", check=True)

    trials = rows(fleet, Trial, "nodes-only")
    assert [t.state for t in trials] == ["evaluated"] * 4
    assert {t.toolchain for t in trials} == {"fleet-test-cc 7.0 (only on the nodes)"}
    assert {a.toolchain for a in rows(fleet, Artifact)} == {"fleet-test-cc 7.0 (only on the nodes)"}


def test_a_worker_without_the_toolchain_errors_its_trials_with_one_line(fleet: Fleet) -> None:
    spec = kernel_spec(fleet, "missing", toolchain=["fleet-test-absent-cc", "--version"])
    fleet.start_worker()

    done = fleet.cli("tune", str(write_spec(fleet.home, spec, "missing.json")), "--json")

    # The campaign was written and its trials sent: the failure is the worker's, one line for each trial.
    trials = rows(fleet, Trial, "missing")
    assert len(trials) == 4 and all(t.state == "errored" for t in trials)
    for trial in trials:
        assert trial.reason is not None and "\n" not in trial.reason
        assert trial.reason.startswith("cannot run the toolchain command ['fleet-test-absent-cc', '--version']")
        assert "No such file or directory" in trial.reason and "(on " in trial.reason
    assert rows(fleet, Artifact) == []
    # `fleet tune` says why its trials failed, as that reason.
    assert "4 trials: cannot run the toolchain command ['fleet-test-absent-cc', '--version']" in done.stderr
