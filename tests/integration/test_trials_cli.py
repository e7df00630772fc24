"""Failures in plain sight: a run that measured nothing exits 1 and says why; `fleet trials` and `fleet trial` show it.

Embedded, as a new user runs Fleet: SQLite and a filesystem broker under a scratch home, local worker processes.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import update

from fleet.errors import NotFound
from fleet.store import Store, Trial
from fleet.workers.gpus import cpu_target
from tests.conftest import write_spec
from tests.integration.test_cli import good_spec
from tests.integration.test_embedded import embedded_env, fleet_cli
from tests.integration.test_store import add, evaluate, make_campaign, reuse_claim

REASON = "no objective in the run's output"


def whoami_spec(home: Path, name: str, objective: dict[str, str]) -> dict:
    """test_cli's spec (two trials of whoami.py), embedded: for this machine's CPU, with ``objective``."""
    spec = good_spec(SimpleNamespace(home=home, target=cpu_target()))  # type: ignore[arg-type]
    spec["workload"]["objective"] = objective
    return spec | {"name": name}


class Home:
    """A scratch home and the `fleet` commands run in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = embedded_env(path, FLEET_BROKER_URL="filesystem://")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return fleet_cli(self.path, self.env, *args)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    return Home(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def failed(home: Home) -> subprocess.CompletedProcess[str]:
    """`fleet tune --json` of a spec whose objective regex matches nothing that whoami.py prints."""
    spec = write_spec(home.path, whoami_spec(home.path, "wrong-regex", {"regex": r"time: ([0-9.]+)"}), "wrong.json")
    return home.cli("tune", str(spec), "--json")


def example_trial(stderr: str) -> int:
    found = re.search(r"\(fleet trial (\d+)\)", stderr)
    assert found, stderr
    return int(found.group(1))


def test_a_run_that_measured_nothing_exits_1_and_says_why(failed: subprocess.CompletedProcess[str]) -> None:
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert f"2 trials: {REASON}" in failed.stderr
    assert "fleet trials wrong-regex" in failed.stderr
    # --json keeps standard output valid JSON, with the failure in it.
    out = json.loads(failed.stdout)
    assert out["problems"][0]["best"] is None
    [problem] = out["failure"]["problems"]
    assert problem["reasons"] == [{"reason": REASON, "count": 2, "trial": example_trial(failed.stderr)}]


def test_resume_of_such_a_run_exits_1_too(home: Home, failed: subprocess.CompletedProcess[str]) -> None:
    done = home.cli("resume", "wrong-regex")

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "no valid measurement" in done.stdout  # the summary, as before
    assert f"2 trials: {REASON}  (fleet trial {example_trial(failed.stderr)})" in done.stderr


def test_trial_shows_its_reason_and_output(home: Home, failed: subprocess.CompletedProcess[str]) -> None:
    trial_id = example_trial(failed.stderr)

    done = home.cli("trial", str(trial_id))

    assert done.returncode == 0, done.stderr
    assert f"trial {trial_id} of campaign wrong-regex" in done.stdout
    assert f"reason    {REASON}" in done.stdout
    assert "stdout (tail):" in done.stdout and '{"score": 1' in done.stdout
    detail = json.loads(home.cli("trial", str(trial_id), "--json").stdout)
    assert (detail["state"], detail["reason"], detail["measurement"]) == ("errored", REASON, None)
    assert '"score": 1' in detail["stdout_tail"]
    assert detail["artifact"]["state"] == "built" and len(detail["artifact"]["digest"]) == 64
    assert detail["attempts"] == 1 and detail["worker"]
    assert detail["times"]["finished"] is not None and detail["times"]["ran_seconds"] >= 0
    # Its slots' time: no compile of its own when it was handed to the other trial's build of the same artifact.
    times = detail["times"]
    compiled, evaluated = times["compiled_seconds"], times["evaluated_seconds"]
    assert 0 < (compiled or 0) + evaluated <= times["ran_seconds"]
    assert f"its evaluation {evaluated:.3f} s" in done.stdout
    assert (compiled is not None) == (f"its compile {compiled or 0:.3f} s, " in done.stdout)


def test_trials_lists_the_errored_ones(home: Home, failed: subprocess.CompletedProcess[str]) -> None:
    done = home.cli("trials", "wrong-regex", "--state", "errored", "--json")

    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)["trials"]
    assert [t["state"] for t in trials] == ["errored", "errored"]
    assert example_trial(failed.stderr) in [t["id"] for t in trials]
    assert {t["reason"] for t in trials} == {REASON}
    assert json.loads(home.cli("trials", "wrong-regex", "--state", "evaluated", "--json").stdout)["trials"] == []
    table = home.cli("trials", "wrong-regex").stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "PROBLEM", "STATE", "OBJECTIVE"]
    assert len(table) == 3 and all(line.rstrip().endswith(REASON) for line in table[1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("trials", "no-such-campaign"), "no campaign 'no-such-campaign' in sqlite:///"),
        (("trial", "999999"), "no trial 999999 in sqlite:///"),
        (("trial", "seven"), "no trial 'seven': a trial id is a number"),
        (("trials", "wrong-regex", "--state", "broken"), "unknown trial state 'broken': one of new, "),
    ],
)
def test_bad_input_is_one_line(
    home: Home, failed: subprocess.CompletedProcess[str], args: tuple[str, ...], message: str
) -> None:
    done = home.cli(*args)

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("fleet: error: ") and message in line, line


def test_a_good_run_names_its_database_and_what_to_run_next(home: Home) -> None:
    spec = write_spec(home.path, whoami_spec(home.path, "right", {"json": "score"}), "right.json")

    done = home.cli("tune", str(spec))

    assert done.returncode == 0, done.stderr
    assert f"results in sqlite:///{home.path / '.fleet' / 'fleet.db'}" in done.stdout
    assert "fleet report right" in done.stdout and "fleet best right" in done.stdout
    listed = json.loads(home.cli("trials", "right", "--json").stdout)["trials"]
    assert [(t["state"], t["objective"]) for t in listed] == [("evaluated", 1.0), ("evaluated", 1.0)]


def test_a_reused_trial_shows_the_measurement_and_reason_it_reused(store: Store) -> None:
    first = make_campaign(store, "first")
    [measured, failed] = add(store, first, {"tile": 1}, {"tile": 2})
    evaluate(store, measured, 2.5)
    evaluate(store, failed, 9.0, state="invalid", valid=False)
    with store.session() as session:  # an invalid run's reason, as a workload gives it
        session.execute(update(Trial).where(Trial.id == failed).values(reason="wrong result\nin detail"))
    second = make_campaign(store, "second", problem_ids=[p.id for p in store.campaign_problems(first.id)])
    [again, failed_again, fresh] = add(store, second, {"tile": 1}, {"tile": 2}, {"tile": 4})
    for trial_id in (again, failed_again):  # reused by the worker that claims it: same toolchain and device
        work = reuse_claim(store, trial_id)
        state = "evaluated" if work.reuse_valid else "invalid"
        assert store.record(trial_id, "evaluator", state=state, source=work.reuse)

    rows = {r.id: r for r in store.trial_rows(second.id)}
    assert (rows[again].state, rows[again].objective, rows[again].source_trial_id) == ("evaluated", 2.5, measured)
    assert (rows[failed_again].state, rows[failed_again].reason) == ("invalid", "wrong result\nin detail")
    assert (rows[fresh].state, rows[fresh].objective, rows[fresh].problem_kind) == ("new", None, "matmul")
    assert [r.id for r in store.trial_rows(second.id, ["invalid"])] == [failed_again]
    detail = store.trial_detail(again)
    assert detail.source is not None and detail.source.id == measured
    assert detail.measurement is not None and detail.measurement.samples == [2.5, 2.5]
    assert (detail.campaign.name, detail.problem.kind, detail.artifact) == ("second", "matmul", None)
    with pytest.raises(NotFound, match="no trial 999999"):
        store.trial_detail(999999)
