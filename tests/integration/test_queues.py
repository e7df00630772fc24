"""Queue health on real Redis (and kombu's filesystem transport): waiting, unacknowledged, consumers, warnings.

`fleet status` shows them and `fleet metrics` exports them as Prometheus metrics, read back here with
prometheus_client's own parser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from fleet.errors import BrokerError
from fleet.ops.queues import _kombu_counts, _redis_counts, inspect_consumers
from fleet.ops.resp import RespError, connect
from fleet.services import RedisServer
from fleet.settings import Settings
from fleet.tasks import configure
from tests.conftest import ROOT, Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def one_slow_trial(fleet: Fleet, seconds: float) -> dict:
    spec = kernel_spec(fleet, name="slow")
    spec["problems"] = [{"kind": "kernel", "params": {"sleep": seconds}}]
    spec["space"] = {"knobs": {"size": [2], "scale": {"values": [1], "build": False}}}
    spec["workload"] = {**spec["workload"], "warmup": 0, "repeats": 1, "run_timeout": 120}
    del spec["baseline"]
    return spec


def status_queues(fleet: Fleet) -> dict[str, dict]:
    status = json.loads(fleet.cli("status", "--json", check=True).stdout)
    return {q["queue"]: q for q in status["queues"]}


def metrics(text: str) -> dict[tuple[str, str], float]:
    """Samples by (name, queue label) from the Prometheus text exposition, parsed by prometheus_client."""
    return {
        (sample.name, sample.labels.get("queue", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_status_and_metrics_show_waiting_unacked_and_missing_consumers(fleet: Fleet) -> None:
    build, evaluate = f"build.{fleet.target}", f"eval.{fleet.target}"
    spec = write_spec(fleet.home, one_slow_trial(fleet, 8.0))
    fleet.cli("tune", str(spec), "--detach", check=True)

    # No worker: the build waits in its queue, and status says nobody consumes it.
    queues = status_queues(fleet)
    assert queues[build]["waiting"] == 1 and queues[build]["unacked"] == 0 and queues[build]["consumers"] == []
    assert queues[build]["warning"] == f"{build}: 1 messages wait and no worker consumes the queue"
    assert queues[evaluate]["waiting"] == 0 and queues[evaluate]["warning"] is None
    text = fleet.cli("status", check=True).stdout
    assert f"warning: {build}: 1 messages wait and no worker consumes the queue" in text
    exported = metrics(fleet.cli("metrics", check=True).stdout)
    assert exported[("fleet_broker_up", "")] == 1
    assert exported[("fleet_queue_messages_waiting", build)] == 1
    assert exported[("fleet_queue_consumers", build)] == 0
    assert exported[("fleet_queue_without_consumer", build)] == 1
    assert exported[("fleet_queue_without_consumer", evaluate)] == 0

    # A worker takes the long measurement: it is delivered and not acknowledged until it ends (late acks).
    fleet.start_worker("--build-procs", "1")
    [trial] = fleet.store.trials(fleet.store.campaign("slow").id)
    fleet.wait_for(lambda: fleet.store.trial(trial.id).state == "evaluating", what="the measurement to start")
    queues = status_queues(fleet)
    assert fleet.store.trial(trial.id).state == "evaluating", "the measurement ended before status looked"
    assert queues[evaluate]["unacked"] == 1 and queues[evaluate]["waiting"] == 0
    assert [name.split("@")[0] for name in queues[evaluate]["consumers"]] == ["eval-cpu0"]
    # Celery's inspect alone also names it: a prefork worker answers while its pool process measures.
    app = configure(Celery("probe", set_as_current=False), Settings.from_env(fleet.env))
    answered = inspect_consumers(app, timeout=3.0)
    assert fleet.store.trial(trial.id).state == "evaluating"
    assert [name.split("@")[0] for name in answered[evaluate]] == ["eval-cpu0"]
    assert queues[build] == {
        "queue": build,
        "waiting": 0,
        "unacked": 0,
        "consumers": queues[build]["consumers"],
        "warning": None,
    }
    assert [name.split("@")[0] for name in queues[build]["consumers"]] == [f"build-{fleet.target}"]

    fleet.wait_for(lambda: fleet.store.trial(trial.id).state == "evaluated", timeout=120, what="the measurement")
    fleet.wait_for(lambda: status_queues(fleet)[evaluate]["unacked"] == 0, what="the ack")
    exported = metrics(fleet.cli("metrics", check=True).stdout)
    assert exported[("fleet_queue_messages_unacked", evaluate)] == 0
    assert exported[("fleet_queue_consumers", evaluate)] == 1
    assert exported[("fleet_workers_live", "")] >= 1


def modules_of_status(fleet: Fleet) -> tuple[dict, set[str]]:
    """``fleet status --json``'s queues, and the modules the command imported."""
    script = (
        "import json, sys\nfrom fleet.cli import main\ncode = main(['status', '--json'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=fleet.env, cwd=fleet.home, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    *shown, modules = done.stdout.splitlines()
    return {q["queue"]: q for q in json.loads("\n".join(shown))["queues"]}, set(json.loads(modules))


def test_status_reads_the_broker_without_celery_while_live_workers_serve_its_queues(fleet: Fleet) -> None:
    # The broadcast to find workers the database does not know is asked only where it could change what status
    # says: with no live worker, or a queue holding work that no live worker consumes.
    celery = ("celery", "kombu", "redis", "fleet.celery_app")
    queues, modules = modules_of_status(fleet)
    assert "fleet.celery_app" in modules  # no live worker: it asked who answers
    fleet.start_worker("--build-procs", "1")
    queues, modules = modules_of_status(fleet)
    assert not {m for m in modules if m.split(".")[0] in celery or m in celery}
    evaluate = queues[f"eval.{fleet.target}"]
    assert evaluate["waiting"] == 0 and evaluate["unacked"] == 0 and evaluate["warning"] is None
    assert [name.split("@")[0] for name in evaluate["consumers"]] == ["eval-cpu0"]
    # Work waiting on a queue of another target, which no live worker consumes: the broadcast is asked again.
    spec = one_slow_trial(fleet, 0) | {"target": "cpu-nobody"}
    fleet.cli("tune", str(write_spec(fleet.home, spec)), "--detach", check=True)
    queues, modules = modules_of_status(fleet)
    assert "fleet.celery_app" in modules
    assert queues["build.cpu-nobody"]["warning"] == "build.cpu-nobody: 1 messages wait and no worker consumes the queue"


@pytest.mark.parametrize("kind", ["tcp, a password and a database", "unix socket, a password"])
def test_the_socket_reads_count_what_kombu_counts(tmp_path: Path, kind: str) -> None:
    # `fleet status` reads the broker's keys over a plain socket (fleet.ops.resp), kombu over redis-py: the same
    # counts, on a broker with waiting messages of several priorities (one list per step), a delivered message
    # not acknowledged, bindings, and a password.
    unix = kind.startswith("unix")
    server = RedisServer(tmp_path / "redis", password="p@ss word:/", unix_socket=tmp_path / "r.sock" if unix else None)
    with server:
        url = server.url if unix else server.url.removesuffix("/0") + "/3"
        settings = Settings.from_env({**os.environ, "FLEET_HOME": str(tmp_path / "home"), "FLEET_BROKER_URL": url})
        app = configure(Celery("probe", set_as_current=False), settings)
        with app.connection_for_write() as link:
            probe, other = link.SimpleQueue("eval.probe"), link.SimpleQueue("build.probe")
            for priority in (0, 3, 3, 9):
                probe.put({"priority": priority}, priority=priority)
            other.put({"n": 1})
            taken = other.get(timeout=10)  # delivered, not acknowledged
            via_socket = _redis_counts(settings, None)
            assert via_socket == _kombu_counts(link.default_channel)
            waiting, unacked, bound = via_socket
            assert waiting == {"eval.probe": 4} and unacked == {"build.probe": 1}
            assert {"eval.probe", "build.probe"} <= bound
            taken.ack()
            assert _redis_counts(settings, None)[1] == {}
            probe.close()
            other.close()
        with pytest.raises(RespError, match=r"WRONGPASS|invalid"):
            connect(url.replace("p%40ss", "wrong"))
    with pytest.raises(BrokerError, match=r"^broker .* does not answer: "):
        _redis_counts(settings, None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_are_served_over_http(fleet: Fleet) -> None:
    spec = write_spec(fleet.home, one_slow_trial(fleet, 0))
    fleet.cli("tune", str(spec), "--detach", check=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "metrics", "--serve", str(port)],
        env=fleet.env,
        cwd=fleet.home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                    body = response.read().decode()
                    kind = response.headers["Content-Type"]
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read().decode()
                time.sleep(0.2)
        assert kind.startswith("text/plain")
        assert metrics(body)[("fleet_queue_messages_waiting", f"build.{fleet.target}")] == 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


def test_filesystem_broker_counts_waiting_messages_and_cannot_see_unacked(tmp_path: Path) -> None:
    # Embedded, without Redis: SQLite and kombu's filesystem transport under FLEET_HOME.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"FLEET_HOME": str(tmp_path / ".fleet"), "FLEET_BROKER_URL": "filesystem://"}

    def fleet_cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    shutil.copy(ROOT / "tests" / "data" / "kernel.c", tmp_path / "kernel.c")
    spec = {
        "name": "fs",
        "target": "cpu-fs",
        "problems": [{"kind": "kernel", "params": {"sleep": 0}}],
        "space": {"knobs": {"size": [2, 3], "scale": {"values": [1], "build": False}}},
        "baseline": {"size": 1},
        "workload": {
            "kind": "command",
            "sources": ["kernel.c"],
            "build": ["gcc", "-DSIZE={size}", "kernel.c", "-o", "kernel"],
            "artifacts": ["kernel"],
            "run": ["./kernel", "{scale}", "{sleep}"],
            "objective": {"json": "score", "goal": "max"},
        },
    }
    fleet_cli("tune", str(write_spec(tmp_path, spec)), "--detach")

    queues = {q["queue"]: q for q in json.loads(fleet_cli("status", "--json"))["queues"]}
    assert queues["build.cpu-fs"]["waiting"] == 3  # two configurations and the baseline
    assert queues["build.cpu-fs"]["unacked"] is None  # the transport removes a message when it delivers it
    assert queues["build.cpu-fs"]["warning"] == "build.cpu-fs: 3 messages wait and no worker consumes the queue"
    assert re.search(r"build\.cpu-fs +3 +- +0\n", fleet_cli("status"))
    exported = metrics(fleet_cli("metrics"))
    assert exported[("fleet_queue_messages_waiting", "build.cpu-fs")] == 3
    assert ("fleet_queue_messages_unacked", "build.cpu-fs") not in exported
