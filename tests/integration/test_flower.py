"""Flower on Fleet's app, against a running fleet: its API and its pages in a real headless Chromium.

Flower runs as a real process on a free loopback port with basic auth (its password from the environment);
a real worker runs a small campaign. Screenshots go to test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.browser import headless_chromium
from tests.conftest import ROOT, Fleet, write_spec
from tests.integration.test_campaign import kernel_spec
from tests.integration.test_report import png_facts

ARTIFACTS = ROOT / "test-artifacts"
USER, PASSWORD = "fleet", "s3cret-for-the-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, auth: bool = True) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url``, with time for Flower's scripts to fill the tables after the page loads."""
    done = headless_chromium(url, profile, "--window-size=1600,1000", "--virtual-time-budget=8000", *args)
    assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def page(port: int, path: str, tmp_path: Path, name: str) -> str:
    """The page's DOM after its scripts ran, and a screenshot of it as test-artifacts/NAME.png."""
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}{path}"
    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / f"{name}.png"
    png.unlink(missing_ok=True)
    browse(url, tmp_path / f"profile-shot-{name}", f"--screenshot={png}")
    width, height, distinct = png_facts(png.read_bytes())
    assert (width, height) == (1600, 1000) and distinct > 8, f"{png} looks blank"
    dom = browse(url, tmp_path / f"profile-dom-{name}", "--dump-dom").stdout
    (ARTIFACTS / f"{name}.html").write_text(dom)
    return dom


def test_flower_shows_the_workers_and_the_tasks_with_their_arguments(fleet: Fleet, tmp_path: Path) -> None:
    port = free_port()
    flower = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "flower", "--port", str(port)],
        env={**fleet.env, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"},
        cwd=fleet.home,
        stdout=(fleet.home / "flower.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                api(port, "/api/workers")
                break
            except (OSError, urllib.error.HTTPError):
                assert flower.poll() is None, (fleet.home / "flower.log").read_text()
                assert time.monotonic() < deadline, (fleet.home / "flower.log").read_text()
                time.sleep(0.3)
        try:  # the password is asked for
            api(port, "/api/workers", auth=False)
            raise AssertionError("Flower answered without a password")
        except urllib.error.HTTPError as error:
            assert error.code == 401

        fleet.start_worker("--build-procs", "1")
        spec = kernel_spec(fleet, name="watched")
        spec["space"] = {"knobs": {"size": [2, 3], "scale": {"values": [1], "build": False}}}
        del spec["baseline"]
        fleet.cli("tune", str(write_spec(fleet.home, spec)), "--json", check=True)
        trials = [t.id for t in fleet.store.trials(fleet.store.campaign("watched").id)]
        host = socket.gethostname()
        workers = {f"eval-cpu0@{host}", f"build-{fleet.target}@{host}"}

        def tasks() -> dict[str, Any]:
            return api(port, "/api/tasks")

        fleet.wait_for(
            lambda: sum(t["state"] == "SUCCESS" for t in tasks().values()) >= 2 * len(trials),
            what="Flower to see every task succeed",
        )
        seen = tasks().values()
        for trial in trials:
            for name, worker in (
                ("fleet.compile", f"build-{fleet.target}@{host}"),
                ("fleet.evaluate", f"eval-cpu0@{host}"),
            ):
                [task] = [t for t in seen if t["name"] == name and f"'trial_ids': [{trial}]" in t["kwargs"]]
                assert f"'target': '{fleet.target}'" in task["kwargs"]
                assert task["worker"] == worker and task["state"] == "SUCCESS"
                # Whose it is: the campaign, the problem and the configuration, for the compile the driver sent
                # and for the evaluation the build worker sent after it.
                config = next(t.config for t in fleet.store.trials(fleet.store.campaign("watched").id) if t.id == trial)
                label = f"watched: problem 1 size={config['size']} scale=1"
                assert f"'for': ['{label}']" in task["kwargs"], task["kwargs"]
        fleet.wait_for(lambda: workers <= set(api(port, "/api/workers?refresh=1")), what="Flower's worker list")

        dashboard = page(port, "/", tmp_path, "flower-workers")
        for worker in workers:
            assert worker in dashboard
        listing = page(port, "/tasks", tmp_path, "flower-tasks")
        for trial in trials:
            assert f"'trial_ids': [{trial}]" in listing.replace("&#39;", "'")
        assert "watched: problem 1 size=2 scale=1" in listing.replace("&#39;", "'")  # in Flower's task list
        assert "fleet.compile" in listing and "fleet.evaluate" in listing
        assert f"build.{fleet.target}" in listing and f"eval.{fleet.target}" in listing  # the routing keys
        [first] = [t for t in seen if t["name"] == "fleet.evaluate" and f"'trial_ids': [{trials[0]}]" in t["kwargs"]]
        detail = page(port, f"/task/{first['uuid']}", tmp_path, "flower-task").replace("&#39;", "'")
        assert f"'trial_ids': [{trials[0]}]" in detail and "eval-cpu0@" in detail
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(30)


def test_flower_wrapper_refuses_an_open_port_beyond_loopback(fleet: Fleet) -> None:
    done = fleet.cli("flower", "--address", "0.0.0.0", env={"FLOWER_BASIC_AUTH": ""})
    assert done.returncode == 1 and "set FLOWER_BASIC_AUTH=user:password" in done.stderr


def test_flower_on_loopback_without_a_password_says_its_pages_are_open(fleet: Fleet) -> None:
    """Issue 44, item 9: its API asks for a login, its pages do not; loopback is every local account's."""
    port = free_port()
    flower = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "flower", "--port", str(port)],
        env={**fleet.env, "FLOWER_BASIC_AUTH": ""},
        cwd=fleet.home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert flower.stderr is not None
        first = flower.stderr.readline()
    finally:
        os.killpg(flower.pid, signal.SIGKILL)
        flower.wait()
    assert first.startswith("fleet: warning: Flower on 127.0.0.1 asks no password"), first
