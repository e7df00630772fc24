"""Builds (issue 34): the toolchain is probed per build (a compiler upgraded in place builds anew), a failure is
remembered per toolchain until ``--remeasure`` rebuilds it, and a failing build fails once for every trial waiting
on it. Real PostgreSQL, Redis, worker processes and gcc, behind a fake ``gcc`` on the worker's PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sqlalchemy import delete, select

from fleet.store import Artifact, Campaign, NewTrial, Store, Trial
from fleet.store._models import Blob
from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec as campaign_kernel_spec
from tests.integration.test_store import LEASE, MAX, TARGET, make_campaign, new_trial
from tests.integration.test_worker_facts import kernel_spec, rows

BROKEN = "fatal error: fleet-config.h: No such file or directory"


def compiler(fleet: Fleet, version: str, *, broken: bool = False) -> Path:
    """A folder holding ``gcc``: prints ``version`` for --version, else runs the real gcc, unless a file
    ``broken`` lies beside it (the node's configuration, outside any build key): then it fails as a missing
    header would. Written in place, so that calling it again upgrades the compiler at the same path."""
    real = shutil.which("gcc")
    assert real is not None
    directory = fleet.home / "bin-gcc"
    directory.mkdir(exist_ok=True)
    script = directory / "gcc"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\n'
        f'if [ -e "{directory / "broken"}" ]; then echo "{BROKEN}" >&2; exit 1; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    if broken:
        (directory / "broken").touch()
    else:
        (directory / "broken").unlink(missing_ok=True)
    return directory


def on_path(directory: Path) -> dict[str, str]:
    return {"PATH": f"{directory}:{os.environ['PATH']}"}


def tune(fleet: Fleet, name: str, *args: str, spec: dict | None = None) -> int:
    spec = spec or kernel_spec(fleet, name)
    spec["name"] = name
    done = fleet.cli("tune", str(write_spec(fleet.home, spec, f"{name}.json")), *args)
    return done.returncode


def test_a_compiler_upgraded_in_place_is_probed_again_and_builds_anew(fleet: Fleet) -> None:
    tools = compiler(fleet, "gcc (Fleet fake) 1.0", broken=True)
    fleet.start_worker(env=on_path(tools))
    assert tune(fleet, "old") == 1  # every build fails: no valid measurement
    assert {(a.toolchain, a.state) for a in rows(fleet, Artifact)} == {("gcc (Fleet fake) 1.0", "failed")}

    # The same path, a new binary (another size and mtime), the same worker processes: probed again.
    compiler(fleet, "gcc (Fleet fake) 2.0.1")
    assert tune(fleet, "new") == 0

    trials = rows(fleet, Trial, "new")
    assert [t.state for t in trials] == ["evaluated"] * 4
    assert {t.toolchain for t in trials} == {"gcc (Fleet fake) 2.0.1"}
    artifacts = {(a.build_config["size"], a.toolchain): a.state for a in rows(fleet, Artifact)}
    assert artifacts == {
        **{(size, "gcc (Fleet fake) 1.0"): "failed" for size in (2, 3)},  # remembered for the old compiler
        **{(size, "gcc (Fleet fake) 2.0.1"): "built" for size in (2, 3)},
    }


def test_a_failed_build_is_remembered_until_remeasure_builds_it_again(fleet: Fleet) -> None:
    version = "gcc (Fleet fake) 3.0"
    tools = compiler(fleet, version, broken=True)
    fleet.start_worker(env=on_path(tools))
    assert tune(fleet, "first") == 1
    failed = {a.id: (a.state, a.reason, a.built_at) for a in rows(fleet, Artifact)}
    assert len(failed) == 2 and {state for state, _, _ in failed.values()} == {"failed"}
    for trial in rows(fleet, Trial, "first"):
        assert trial.state == "errored" and trial.reason is not None and trial.reason.startswith("build failed:")
        assert BROKEN in (trial.stderr_tail or "")

    # Fixed on the node, outside the build key. A new campaign still finds the failure of this toolchain...
    (tools / "broken").unlink()
    assert tune(fleet, "second") == 1
    assert {a.id: (a.state, a.reason, a.built_at) for a in rows(fleet, Artifact)} == failed
    assert {t.state for t in rows(fleet, Trial, "second")} == {"errored"}

    # ... and --remeasure builds it again, once, and succeeds.
    assert tune(fleet, "third", "--remeasure") == 0
    assert [t.state for t in rows(fleet, Trial, "third")] == ["evaluated"] * 4
    artifacts = rows(fleet, Artifact)
    assert [(a.toolchain, a.state, a.attempts) for a in artifacts] == [(version, "built", 1)] * 2


def one_key_spec(fleet: Fleet, name: str, size: int) -> dict:
    """Four trials that share one build: they differ only in a run-time knob."""
    spec = campaign_kernel_spec(
        fleet, name=name, space={"knobs": {"size": [size], "scale": {"values": [1, 10, 100, 1000], "build": False}}}
    )
    del spec["baseline"]
    return spec


def test_a_failing_build_fails_once_for_every_trial_waiting_on_it(fleet: Fleet) -> None:
    tools = compiler(fleet, "gcc (Fleet fake) 4.0", broken=True)
    fleet.start_worker("--build-procs", "2", env=on_path(tools))
    # The compiler fails: one build, its failure every trial's.
    assert tune(fleet, "fails", spec=one_key_spec(fleet, "fails", 2)) == 1
    [artifact] = rows(fleet, Artifact)
    assert (artifact.state, artifact.attempts) == ("failed", 1)
    trials = rows(fleet, Trial, "fails")
    assert len(trials) == 4
    assert {(t.state, t.reason) for t in trials} == {("errored", f"build failed: {artifact.reason}")}

    # The workload raises (here: its sources are gone from the database). That is the build's failure too, recorded
    # at once for every trial sharing it; not a build left to its lease, taken over and raised again until "lost".
    spec = one_key_spec(fleet, "raises", 3)
    (fleet.home / "notes.txt").write_text("another bundle than the one this worker has in its cache\n")
    spec["workload"]["sources"].append("notes.txt")
    fleet.cli("submit", str(write_spec(fleet.home, spec, "raises.json")), check=True)
    with fleet.store.session() as session:
        campaign = session.scalars(select(Campaign).where(Campaign.name == "raises")).one()
        session.execute(delete(Blob).where(Blob.digest == campaign.workload["bundle"]))
    fleet.cli("resume", "raises", "--json")
    [_, artifact] = rows(fleet, Artifact)
    assert (artifact.state, artifact.attempts) == ("failed", 1)
    assert artifact.reason is not None and "no blob" in artifact.reason and "lost" not in artifact.reason
    trials = rows(fleet, Trial, "raises")
    assert len(trials) == 4
    assert {(t.state, t.reason) for t in trials} == {("errored", f"build failed: {artifact.reason}")}


def test_a_remeasuring_campaign_builds_a_failed_key_again_once(store: Store) -> None:
    """The store's side of --remeasure, on SQLite and PostgreSQL: a failure from before the campaign is forgotten as
    the campaign's first trial of the key is created; the failure of the campaign's own build of it stays."""
    first = make_campaign(store)
    problem = store.campaign_problems(first.id)[0].id
    trial = new_trial(problem, {"tile": 2})
    [(failing, _)] = store.add_trials(first.id, TARGET, [trial])
    start = store.start_compile(failing, "w1", LEASE, MAX, {first.id: "gcc 13"})
    assert start.artifact is not None and start.artifact.worker == "w1"
    assert store.finish_build(trial.build_key, "w1", data=None, reason="no header", toolchain="gcc 13")

    # A campaign that does not remeasure meets the failure: nothing to build.
    plain = make_campaign(store, name="plain", problem_ids=[problem])
    [(met, _)] = store.add_trials(plain.id, TARGET, [trial])
    start = store.start_compile(met, "w2", LEASE, MAX, {plain.id: "gcc 13"})
    assert start.artifact is not None and (start.artifact.state, start.artifact.reason) == ("failed", "no header")

    # A remeasuring one builds it again, once: its own build's failure stays for its next trial of the key.
    again = make_campaign(store, name="again", problem_ids=[problem], options={"remeasure": True})
    [(rebuilt, _)] = store.add_trials(again.id, TARGET, [trial], remeasure=True)
    start = store.start_compile(rebuilt, "w3", LEASE, MAX, {again.id: "gcc 13"})
    assert start.artifact is not None and (start.artifact.state, start.artifact.worker) == ("building", "w3")
    assert store.finish_build(trial.build_key, "w3", data=None, reason="still no header", toolchain="gcc 13")
    same_key = NewTrial(problem, {"tile": 2, "x": 1}, trial.build_key, trial.measure_key[:-1] + "x")
    [(later, _)] = store.add_trials(again.id, TARGET, [same_key], remeasure=True)
    start = store.start_compile(later, "w4", LEASE, MAX, {again.id: "gcc 13"})
    assert start.artifact is not None and (start.artifact.state, start.artifact.reason) == ("failed", "still no header")
    # Remembered per toolchain: another compiler builds the key on its own, failure or not.
    other = make_campaign(store, name="other", problem_ids=[problem])
    [(newer, _)] = store.add_trials(other.id, TARGET, [trial])
    start = store.start_compile(newer, "w5", LEASE, MAX, {other.id: "gcc 14"})
    assert start.artifact is not None and (start.artifact.state, start.artifact.toolchain) == ("building", "gcc 14")


def test_remeasure_with_the_name_of_a_campaign_run_without_it_says_how_and_writes_nothing(fleet: Fleet) -> None:
    # The same name resumes a campaign, whose recorded trials are not measured again: that is not what was asked.
    path = write_spec(fleet.home, kernel_spec(fleet, "once"), "once.json")
    fleet.cli("submit", str(path), check=True)
    trials = len(fleet.store.trials(fleet.store.campaign("once").id))
    done = fleet.cli("tune", str(path), "--remeasure")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "fleet: error: campaign 'once' exists and was not run with --remeasure: the same name resumes it and "
        "measures nothing again; measure again in a new campaign: --name once-remeasured"
    ]
    assert len(fleet.store.trials(fleet.store.campaign("once").id)) == trials
    assert [c.name for c in fleet.store.campaigns()] == ["once"]
