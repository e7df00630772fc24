"""Workloads cannot read the fleet's secrets: a hostile workload on a real worker finds the database and
broker passwords nowhere, and a concealed process's environment is closed to its own user."""

from __future__ import annotations

import inspect
import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from fleet.settings import conceal
from tests.conftest import ROOT, Fleet, write_spec

ROOT_USER = os.geteuid() == 0


def secrets(fleet: Fleet) -> list[str]:
    # The test servers have no passwords: the whole URLs stand for them (a URL is all a workload needs).
    return [fleet.env["FLEET_DATABASE_URL"], fleet.env["FLEET_BROKER_URL"]]


def test_a_hostile_workload_finds_no_secret_where_it_looks(fleet: Fleet) -> None:
    # As root (CI) the worker runs workloads as `nobody`; as any other user, as itself.
    worker_env = {"FLEET_WORKLOAD_USER": "nobody"} if ROOT_USER else {}
    fleet.start_worker(env=worker_env)
    # A settings file as `fab deploy` writes it on a node: mode 0600, owned by the account systemd reads it as.
    settings_file = fleet.home / "node.env"
    settings_file.write_text(f"FLEET_DATABASE_URL={fleet.env['FLEET_DATABASE_URL']}\n")
    settings_file.chmod(0o600)
    shutil.copy(ROOT / "tests" / "data" / "probe.sh", fleet.home / "probe.sh")
    files = [str(settings_file)] if ROOT_USER else []  # a user's own 0600 file is its workloads' too
    spec = {
        "name": "secrets",
        "target": fleet.target,
        "problems": [{"kind": "probe", "params": {}}],
        "space": {"knobs": {"attempt": {"values": [1, 2], "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["probe.sh"],
            "run": ["sh", "probe.sh", *secrets(fleet), *files],
            "objective": {"json": "score"},
            "repeats": 1,
        },
    }
    done = fleet.cli("tune", str(write_spec(fleet.home, spec)), "--json", check=True)
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 2}
    results = fleet.store.results(campaign_id=fleet.store.campaign("secrets").id)
    assert [r.objective for r in results] == [0, 0]
    for result in results:
        tail = fleet.store.trial_detail(result.trial_id).trial.stdout_tail or ""
        assert json.loads(tail.strip().splitlines()[-1])["readable"] >= 1  # it did read: its own environment

    # The same probe, run by this test's own user, finds them: the worker's processes hold them.
    control = subprocess.run(
        ["sh", str(ROOT / "tests" / "data" / "probe.sh"), *secrets(fleet), str(settings_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(control.stdout)["score"] >= 1


def _reader_options() -> dict:
    """Run the reader as `nobody` when the tests run as root (root reads any process); else as ourselves."""
    if not ROOT_USER:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


def _holder(concealed: bool) -> subprocess.Popen[str]:
    """A process whose environment holds a secret, concealed with fleet's own conceal() or not."""
    code = textwrap.dedent(inspect.getsource(conceal)) if concealed else ""
    code += "\nimport ctypes, sys, time\n" + ("conceal()\n" if concealed else "") + "print('ready', flush=True)\n"
    code += "time.sleep(60)\n"
    # The system Python: the account that reads must be able to run it, and ours may be under /root.
    python = "/usr/bin/python3" if ROOT_USER and Path("/usr/bin/python3").exists() else sys.executable
    holder = subprocess.Popen(
        [python, "-c", code],
        env={"PATH": "/usr/bin:/bin", "FLEET_DATABASE_URL": "postgresql://fleet:s3cret-in-env@db/fleet"},
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
        **_reader_options(),
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    return holder


def test_a_concealed_process_environment_is_closed_to_its_own_user() -> None:
    for concealed in (False, True):
        holder = _holder(concealed)
        try:
            read = subprocess.run(
                ["cat", f"/proc/{holder.pid}/environ"], capture_output=True, cwd="/", check=False, **_reader_options()
            )
        finally:
            holder.kill()
            holder.wait()
        if concealed:
            assert read.returncode != 0 and b"s3cret-in-env" not in read.stdout
            assert b"Permission denied" in read.stderr
        else:
            assert read.returncode == 0 and b"s3cret-in-env" in read.stdout  # the same user reads it otherwise


def test_a_workload_user_that_does_not_exist_stops_the_worker_with_one_line(fleet: Fleet) -> None:
    done = fleet.cli("worker", "--target", fleet.target, env={"FLEET_WORKLOAD_USER": "no-such-user-here"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "fleet: error: FLEET_WORKLOAD_USER='no-such-user-here': no such user on this node"
    ]
