"""A shared fleet, tried as an attacker would (issue 29): workers run as an unprivileged service account that
reads the database and broker URLs from files, and a hostile spec tries every way to reach them or the workers.
Real PostgreSQL, Redis, worker processes and bubblewrap."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from fleet.store import Campaign, Measurement, Trial
from tests.conftest import ROOT, Fleet, write_spec

SERVICE = "daemon"  # an account every Debian system has: the workers' service account here
ATTACK = ROOT / "tests" / "data" / "attack.sh"


def secrets(fleet: Fleet) -> list[str]:
    # The test servers need no passwords: the whole URLs stand for them (a URL is all a workload needs).
    return [fleet.env["FLEET_DATABASE_URL"], fleet.env["FLEET_BROKER_URL"]]


def secret_files(fleet: Fleet) -> list[Path]:
    """The URLs as a deployment keeps them: files only the service account reads."""
    folder = fleet.home / "credentials"
    folder.mkdir(exist_ok=True)
    files = []
    for name, value in zip(("database-url", "broker-url"), secrets(fleet), strict=True):
        path = folder / name
        path.write_text(value + "\n")
        path.chmod(0o600)
        files.append(path)
    return files


def start_service_worker(fleet: Fleet, **env: str) -> subprocess.Popen[bytes]:
    """``fleet worker`` as systemd runs it: the service account, a clean environment, the URLs in files."""
    db_file, broker_file = secret_files(fleet)
    clean = {
        "PATH": os.environ["PATH"],
        "HOME": str(fleet.home),
        "FLEET_HOME": fleet.env["FLEET_HOME"],
        "FLEET_DATABASE_URL_FILE": str(db_file),
        "FLEET_BROKER_URL_FILE": str(broker_file),
        **{k: v for k, v in fleet.env.items() if k.startswith("FLEET_") and k.endswith("SECONDS")},
        "FLEET_MAX_ATTEMPTS": "3",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    prefix: list[str] = []
    if os.geteuid() == 0:
        account = pwd.getpwnam(SERVICE)
        for root, dirs, files in os.walk(fleet.home):
            for name in [root, *(os.path.join(root, entry) for entry in dirs + files)]:
                os.lchown(name, account.pw_uid, account.pw_gid)
        prefix = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", "--"]
    before = {w.name for w in fleet.store.workers(within=2)}
    with (fleet.home / "worker.log").open("ab") as log:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "fleet.cli", "worker", "--target", fleet.target],
            env=clean,
            cwd=fleet.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    fleet.procs.append(proc)
    fleet.wait_for(
        lambda: len({w.name for w in fleet.store.workers(within=2)} - before) >= 2,
        timeout=60,
        what=f"the service account's workers (log: {fleet.home / 'worker.log'})",
    )
    return proc


def attack_spec(fleet: Fleet, name: str, mode: str, **workload: object) -> Path:
    shutil.copy(ATTACK, fleet.home / "attack.sh")
    (fleet.home / "needles").write_text("\n".join(secrets(fleet)) + "\n")
    port = str(urlsplit(fleet.env["FLEET_DATABASE_URL"]).port)
    files = [str(path) for path in secret_files(fleet)] + [fleet.env["FLEET_HOME"]]
    spec = {
        "name": name,
        "target": fleet.target,
        "problems": [{"kind": "attack", "params": {}}],
        "space": {"knobs": {"attempt": {"values": [1, 2], "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["attack.sh", "needles"],
            "build": ["sh", "-c", "echo built"],
            # The probe that names the toolchain is the spec's too: it goes looking as well.
            "toolchain": ["sh", "-c", "echo $FLEET_DATABASE_URL $FLEET_BROKER_URL; cat /proc/1/environ"],
            "run": ["sh", "attack.sh", mode, port, "needles", *files],
            "objective": {"json": "found"},
            **workload,
        },
    }
    return write_spec(fleet.home, spec, f"{name}.json")


def running(words: list[str]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[:-1] == [w.encode() for w in words]:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def everything_stored(fleet: Fleet, campaign: str) -> str:
    """Every text the campaign's trials left in the database, as one string."""
    with fleet.store.session() as session:
        trials = session.scalars(
            select(Trial).join(Campaign, Campaign.id == Trial.campaign_id).where(Campaign.name == campaign)
        ).all()
        measured = session.scalars(select(Measurement).where(Measurement.trial_id.in_([t.id for t in trials]))).all()
        texts = [str(t.reason) + str(t.stdout_tail) + str(t.stderr_tail) + str(t.toolchain) for t in trials]
        texts += [str(m.toolchain) + json.dumps(m.metrics) for m in measured]
    return "\n".join(texts)


def test_a_hostile_spec_reaches_no_secret_and_no_worker_and_leaves_nothing_behind(fleet: Fleet) -> None:
    worker = start_service_worker(fleet)
    assert "given in the environment" not in (fleet.home / "worker.log").read_text()  # from files: no warning
    workers = {w.name: w.pid for w in fleet.store.workers(within=2)}
    done = fleet.cli("tune", str(attack_spec(fleet, "attack", "hostile")), "--json", check=True)
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 2}

    results = fleet.store.results(campaign_id=fleet.store.campaign("attack").id)
    for result in results:
        out = json.loads((fleet.store.trial_detail(result.trial_id).trial.stdout_tail or "").strip().splitlines()[-1])
        assert out["found"] == 0, out  # no environment, command line or file held a URL
        assert out["procs"] <= 6, out  # its own namespace: bubblewrap's init, the shell and what it started
        assert out["network"] == 0, out  # no way to the database's port on loopback
    stored = everything_stored(fleet, "attack")
    assert not any(secret in stored for secret in secrets(fleet))
    # The toolchain probe ran in the sandbox: it found neither variable nor the worker's environment.
    assert "postgresql" not in stored and "redis" not in stored

    # `kill -9 -1` reached no worker: the same processes are alive and registered.
    assert worker.poll() is None
    assert {w.name: w.pid for w in fleet.store.workers(within=2)} == workers
    # The `setsid` child died with its trial's sandbox.
    deadline = time.monotonic() + 5
    while running(["sleep", "300.75"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(["sleep", "300.75"]) == []


def test_artifacts_that_leave_the_build_folder_are_refused_at_submit_or_by_the_worker(fleet: Fleet) -> None:
    for name in ("/etc/passwd", "../../x", "a/../../b"):
        spec = attack_spec(fleet, "outside", "gentle", artifacts=[name])
        done = fleet.cli("tune", str(spec))
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1 and "inside the build's directory" in done.stderr
        assert fleet.store.campaigns() == []  # nothing written

    start_service_worker(fleet)
    # The build leaves links to the worker's environment and to a file only root reads.
    build = ["sh", "-c", "ln -s /proc/self/environ k && ln -s /etc/shadow r && mkdir d && ln -s /etc d/e"]
    for artifacts in (["k"], ["r"], ["d/e/passwd"]):
        name = f"links-{len(fleet.store.campaigns())}"
        done = fleet.cli("tune", str(attack_spec(fleet, name, "gentle", build=build, artifacts=artifacts)), "--json")
        assert done.returncode == 1
        stored = everything_stored(fleet, name)
        assert "link" in stored
        assert not any(secret in stored for secret in secrets(fleet)) and "root:" not in stored


def test_a_python_space_file_runs_only_in_the_submitting_process_never_in_a_driver(fleet: Fleet) -> None:
    (fleet.home / "evil.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.path.dirname(__file__), f'ran-{os.getpid()}'), 'w').write(' '.join(sys.argv))\n"
        "x = [1, 2, 3]\n"
        "def META_is_config_valid(config):\n"
        "    return config['x'] != 2\n"
    )
    spec = {
        "name": "evil",
        "target": fleet.target,
        "problems": [{"kind": "p", "params": {}}],
        "space": {"file": "evil.py"},
        "strategy": {"name": "grid"},
        "workload": {"kind": "command", "run": ["sh", "-c", 'echo "{\\"t\\": 1}"'], "objective": {"json": "t"}},
    }
    fleet.cli("submit", str(write_spec(fleet.home, spec, "evil.json")), check=True)
    fleet.start_worker()
    driver = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "driver", "--name", "d1"],
        env=fleet.env,
        cwd=fleet.home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    fleet.procs.append(driver)
    fleet.wait_for(lambda: fleet.store.campaign("evil").status == "done", timeout=120, what="the campaign to end")
    runs = [path.read_text() for path in fleet.home.glob("ran-*")]
    assert len(runs) == 1 and " submit " in f" {runs[0]} "  # the submitter's process, and no other
    # The driver used the verdicts stored at submit: x=2 was never tried.
    configs = [t.config["x"] for t in fleet.store.trials(fleet.store.campaign("evil").id)]
    assert sorted(configs) == [1, 3]


def test_without_the_sandbox_a_worker_says_what_is_not_isolated_and_the_probe_sees_the_node(fleet: Fleet) -> None:
    start_service_worker(fleet, FLEET_SANDBOX="none")
    log = (fleet.home / "worker.log").read_text()
    assert "FLEET_SANDBOX=none: workload commands run without a sandbox" in log
    done = fleet.cli("tune", str(attack_spec(fleet, "open", "gentle")), "--json")
    out = [
        json.loads((fleet.store.trial_detail(r.trial_id).trial.stdout_tail or "").strip().splitlines()[-1])
        for r in fleet.store.results(campaign_id=fleet.store.campaign("open").id)
    ]
    assert done.returncode in (0, 1) and out
    assert all(o["procs"] > 6 and o["network"] == 1 for o in out)  # the node's processes and network: the old way


def start_worker_once(fleet: Fleet, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``fleet worker`` that is expected to refuse, at once."""
    argv = [sys.executable, "-m", "fleet.cli", "worker", "--target", fleet.target]
    return subprocess.run(argv, env=env, cwd=fleet.home, capture_output=True, text=True, timeout=120, check=False)


def test_a_worker_given_the_urls_in_its_environment_says_to_give_them_as_files(fleet: Fleet) -> None:
    fleet.start_worker()  # the fleet fixture's environment holds both URLs, as a laptop's would
    log = (fleet.home / "worker.log").read_text()
    assert (
        "fleet: warning: FLEET_DATABASE_URL and FLEET_BROKER_URL given in the environment: on a shared node give "
        "FLEET_DATABASE_URL_FILE and FLEET_BROKER_URL_FILE instead (a file only this account reads)"
    ) in log


def test_a_worker_refuses_to_start_without_its_sandbox_or_without_the_fleets_database(fleet: Fleet) -> None:
    done = start_worker_once(fleet, {**fleet.env, "PATH": "/nonexistent"})
    assert done.returncode == 1
    assert "bubblewrap is not installed" in done.stderr and "FLEET_SANDBOX=none" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

    done = start_worker_once(fleet, {k: v for k, v in fleet.env.items() if k != "FLEET_DATABASE_URL"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "fleet: error: FLEET_BROKER_URL names a fleet's broker but no FLEET_DATABASE_URL (or FLEET_DATABASE_URL_FILE) "
        "is set: a worker needs the fleet's database, not one of its own"
    ]


@pytest.fixture(autouse=True)
def _no_stray_sleep() -> Iterator[None]:
    yield
    for pid in running(["sleep", "300.75"]):
        os.kill(pid, signal.SIGKILL)
