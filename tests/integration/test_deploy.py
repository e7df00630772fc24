"""deploy/fabfile.py against real SSH hosts on loopback (tests/sshhosts.py): deploy, status, a campaign on
the deployed workers, a redeploy that keeps the artifact cache, a stop that lets the running measurement
finish, and a driver deployed to a third host that drives a submitted campaign and lets go of it when
stopped. The hosts have no systemd, so this is the fabfile's supervisor mode; the systemd units it would
install are checked with ``systemd-analyze verify``."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fleet.services import PostgresServer, RedisServer
from fleet.store import Measurement, Store, Trial
from tests.conftest import ROOT, write_spec
from tests.sshhosts import SshHosts, ssh_hosts  # noqa: F401  (the fixture)

FAB = Path(sys.executable).parent / "fab"
NODES = ("fleetnode1", "fleetnode2")
DRIVER_NODE = "fleetnode3"  # a head node: the driver alone, no workers


def load_fabfile():  # type: ignore[no-untyped-def]
    """deploy/fabfile.py as a module (it is not part of the fleet package)."""
    if "fleet_fabfile" in sys.modules:
        return sys.modules["fleet_fabfile"]
    spec = importlib.util.spec_from_file_location("fleet_fabfile", ROOT / "deploy" / "fabfile.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_fabfile"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Deployment:
    hosts: SshHosts
    env: dict[str, str]
    store: Store
    target: str
    wheelhouse: Path
    home: Path

    def fab(self, *args: str, hosts: tuple[str, ...] = NODES, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        return subprocess.run(
            [str(FAB), "-r", str(ROOT / "deploy"), "-S", str(self.hosts.config), "-H", ",".join(hosts), *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def deploy(self, *hosts: str) -> subprocess.CompletedProcess[str]:
        done = self.fab("deploy", "--target", self.target, "--wheelhouse", str(self.wheelhouse), hosts=hosts or NODES)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        return done

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``fleet ARGS`` here, against the deployment's database and broker."""
        return subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def tune(self, spec: dict, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cli("tune", str(write_spec(self.home, spec)), "--no-local", "--json", *args)

    def live_workers(self) -> set[str]:
        # A generous window: the machine running the tests is shared and a heartbeat may come late.
        return {w.name for w in self.store.workers(target=self.target, within=30)}


@pytest.fixture(scope="module")
def wheelhouse(ssh_hosts: SshHosts) -> Iterator[Path]:  # noqa: F811
    """Fleet and its dependencies as wheels, built once for the nodes' Python."""
    node_python = ssh_hosts.hosts[0].run("command -v python3").stdout.strip()
    assert node_python, "the SSH hosts need python3"
    directory = Path(tempfile.mkdtemp(prefix="fleet-wheelhouse-"))
    try:
        yield load_fabfile().build_wheelhouse(directory, node_python)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def deployment(
    ssh_hosts: SshHosts,  # noqa: F811
    wheelhouse: Path,
    redis_server: RedisServer,
    postgres_server: PostgresServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    ssh_hosts.clean_homes()
    url = postgres_server.create_database(f"d{uuid.uuid4().hex[:12]}")
    store = Store(url)
    store.upgrade()
    home = tmp_path_factory.mktemp("deploy")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
        "FLEET_DATABASE_URL": url,
        "FLEET_BROKER_URL": redis_server.url,
        "FLEET_HOME": str(home / ".fleet"),
        "FLEET_HEARTBEAT_SECONDS": "0.5",
        "FLEET_LEASE_SECONDS": "30",
        "FLEET_STOP_TIMEOUT": "120",
        "PYTHONUNBUFFERED": "1",
    }
    deployed = Deployment(ssh_hosts, env, store, f"cpu-d{uuid.uuid4().hex[:8]}", wheelhouse, home)
    deployed.deploy()
    try:
        for node in NODES:
            assert _wait_registered(deployed, node), f"{node}'s workers did not register"
        yield deployed
    finally:
        deployed.fab("stop")
        store.close()


def script_spec(home: Path, target: str, modes: list[str], name: str) -> dict:
    """A campaign with a build step and a run-time knob; its artifact, larger than ``INLINE_BYTES``, lands in
    the nodes' caches (a smaller one would come with each evaluation's claim instead)."""
    shutil.copy(ROOT / "tests" / "data" / "poison.py", home / "poison.py")
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "script", "params": {}}],
        "space": {"knobs": {"mode": {"values": modes, "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["poison.py"],
            "build": [
                "python3",
                "-c",
                "import os, shutil; shutil.copy('poison.py', 'prog.py'); "
                "open('weights', 'wb').write(os.urandom(1 << 17))",
            ],
            "artifacts": ["prog.py", "weights"],
            "run": ["python3", "prog.py", "{mode}"],
            "objective": {"json": "score", "goal": "max"},
            "repeats": 1,
        },
    }


def test_deploy_starts_workers_on_every_node_as_its_user(deployment: Deployment) -> None:
    workers = deployment.live_workers()
    assert workers >= {f"{role}@{node}" for node in NODES for role in ("eval-cpu0", f"build-{deployment.target}")}
    machines = {m.hostname: m.targets for m in deployment.store.machines()}
    assert {node: machines[node] for node in NODES} == {node: [deployment.target] for node in NODES}
    for node in NODES:
        host = deployment.hosts[node]
        env_file = host.run("stat -c '%a %U' ~/fleet/node.env && cat ~/fleet/node.env").stdout.splitlines()
        assert env_file[0] == f"600 {node}"
        # The URLs are files of their own (0600), named in the environment file, never in it.
        assert not any(line.startswith(("FLEET_BROKER_URL=", "FLEET_DATABASE_URL=")) for line in env_file)
        assert f"FLEET_BROKER_URL_FILE='{host.home}/fleet/broker-url'" in env_file
        broker = host.run("stat -c '%a %U' ~/fleet/broker-url && cat ~/fleet/broker-url").stdout.splitlines()
        assert broker == [f"600 {node}", deployment.env["FLEET_BROKER_URL"]]
        assert f"FLEET_NODE_NAME='{node}'" in env_file
        assert f"FLEET_CACHE_DIR='{host.home}/fleet/cache'" in env_file
        # The launcher and its Celery workers run as the node's unprivileged user, from the virtual env.
        owners = host.run("ps -o user=,args= -u $(id -u) | grep '[-]m fleet.tasks worker'").stdout
        assert owners.count(f"{host.home}/fleet/venv/bin/python") >= 2
    status = deployment.fab("status")
    assert status.returncode == 0, status.stderr
    assert [line.split(":")[0] for line in status.stdout.splitlines() if "running (pid" in line] == list(NODES)


def test_campaign_runs_on_the_nodes_and_a_redeploy_keeps_the_cache(deployment: Deployment) -> None:
    done = deployment.tune(script_spec(deployment.home, deployment.target, ["a", "bb", "ccc"], "deployed"))
    assert done.returncode == 0, done.stderr
    with deployment.store.session() as session:
        reasons = [t.reason for t in session.scalars(select(Trial)) if t.reason]
    assert json.loads(done.stdout)["problems"][0]["trials"] == {"evaluated": 3}, reasons
    listing = "find ~/fleet/cache -type f -not -path '*/scratch/*' -printf '%p %i %T@\\n' | sort"
    before = {node: deployment.hosts[node].run(listing).stdout for node in NODES}
    assert any(before.values()), "the built artifact is in some node's cache"
    pids = deployment.hosts[NODES[0]].run("cat ~/fleet/run/worker.pid").stdout

    redeployed = deployment.deploy(NODES[0])
    assert f"{NODES[0]}: deployed fleet" in redeployed.stdout
    after = deployment.hosts[NODES[0]].run(listing).stdout
    assert after == before[NODES[0]]  # the same files, untouched: the cache lives outside the venv
    assert deployment.hosts[NODES[0]].run("cat ~/fleet/run/worker.pid").stdout != pids
    assert _wait_registered(deployment, NODES[0])


def _wait_registered(deployment: Deployment, node: str) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if {f"eval-cpu0@{node}", f"build-{deployment.target}@{node}"} <= deployment.live_workers():
            return True
        time.sleep(0.2)
    return False


def test_upgrade_restart_and_logs(deployment: Deployment) -> None:
    node = NODES[1]
    before = deployment.hosts[node].run("cat ~/fleet/run/worker.pid").stdout
    upgraded = deployment.fab("upgrade", "--wheelhouse", str(deployment.wheelhouse), hosts=(node,))
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"{node}: workers stopped\n{node}: workers started" in upgraded.stdout
    assert f"{node}: upgraded to fleet, version" in upgraded.stdout
    restarted = deployment.fab("restart", hosts=(node,))
    assert restarted.returncode == 0, restarted.stderr
    after = deployment.hosts[node].run("cat ~/fleet/run/worker.pid").stdout
    assert len({before, after}) == 2
    assert _wait_registered(deployment, node)
    logs = deployment.fab("logs", "--lines", "200", hosts=(node,))
    assert logs.returncode == 0, logs.stderr
    assert f"eval-cpu0@{node} ready." in logs.stdout


def test_fab_stop_lets_the_running_measurement_finish(deployment: Deployment) -> None:
    for node in NODES:
        assert _wait_registered(deployment, node)
    detached = deployment.tune(script_spec(deployment.home, deployment.target, ["sleep5"], "stopping"), "--detach")
    assert detached.returncode == 0, detached.stderr

    def trial() -> Trial:
        with deployment.store.session() as session:
            query = select(Trial).where(Trial.config["mode"].as_string() == "sleep5")
            return session.scalars(query).one()

    deadline = time.monotonic() + 120
    while trial().state != "evaluating":
        assert time.monotonic() < deadline, f"trial never evaluating: {trial().state}"
        time.sleep(0.1)
    stopped = deployment.fab("stop")
    assert stopped.returncode == 0, f"{stopped.stdout}\n{stopped.stderr}"
    assert [line for line in stopped.stdout.splitlines() if "workers stopped" in line] == [
        f"{node}: workers stopped" for node in NODES
    ]
    # fab stop returned only once the warm shutdown ended: the measurement is recorded, exactly once.
    finished = trial()
    assert finished.state == "evaluated", finished.reason
    assert finished.attempts == 1
    with deployment.store.session() as session:
        count = session.scalar(select(func.count()).select_from(Measurement).where(Measurement.trial_id == finished.id))
    assert count == 1
    status = deployment.fab("status")
    assert [line for line in status.stdout.splitlines() if line.endswith("stopped")] == [
        f"{node}: workers stopped" for node in NODES
    ]
    for node in NODES:
        assert deployment.hosts[node].run("pgrep -u $(id -u) -f 'fleet.tasks worker'").returncode == 1
    # And start brings them back.
    started = deployment.fab("start")
    assert started.returncode == 0, started.stderr
    for node in NODES:
        assert _wait_registered(deployment, node)


def test_deploy_driver_role_drives_submitted_campaigns_and_lets_go_on_stop(deployment: Deployment) -> None:
    node, host = DRIVER_NODE, deployment.hosts[DRIVER_NODE]
    deployed = deployment.fab(
        "deploy",
        "--role",
        "driver",
        "--max-campaigns",
        "4",
        "--wheelhouse",
        str(deployment.wheelhouse),
        hosts=(node,),
        env={"FLEET_DRIVER_LEASE_SECONDS": "20"},
    )
    try:
        assert deployed.returncode == 0, f"{deployed.stdout}\n{deployed.stderr}"
        assert f"{node}: driver started (pid " in deployed.stdout
        assert "supervisor" in deployed.stdout and deployed.stdout.rstrip().endswith("; driver)")
        # The workers' environment file, with the driver's lease passed on; the node runs the driver alone.
        env_file = host.run("stat -c '%a %U' ~/fleet/node.env && cat ~/fleet/node.env").stdout.splitlines()
        assert env_file[0] == f"600 {node}"
        for name, file in (("FLEET_DATABASE_URL", "database-url"), ("FLEET_BROKER_URL", "broker-url")):
            assert f"{name}_FILE='{host.home}/fleet/{file}'" in env_file
            assert host.run(f"cat ~/fleet/{file}").stdout == deployment.env[name] + "\n"
        assert f"FLEET_NODE_NAME='{node}'" in env_file and "FLEET_DRIVER_LEASE_SECONDS='20'" in env_file
        assert host.run("cat ~/fleet/roles").stdout == "driver\n"
        # `fleet driver` from the node's virtual environment, as the node's unprivileged user, named after it.
        processes = host.run("ps -o args= -u $(id -u) | grep '[f]leet driver'").stdout
        assert f"{host.home}/fleet/venv/bin/fleet driver --name driver@{node} --max-campaigns 4" in processes
        assert "fleet.tasks" not in host.run("ps -o args= -u $(id -u)").stdout
        assert _wait(lambda: _live_driver(deployment, node), 60), "the driver did not register"
        status = deployment.fab("status", hosts=(node,))
        assert [line.split(" (")[0] for line in status.stdout.splitlines()] == [f"{node}: driver running"]

        # A campaign handed to the fleet: the deployed driver takes it, the deployed workers measure it.
        spec = write_spec(
            deployment.home,
            script_spec(deployment.home, deployment.target, ["sleep4", "sleep6"], "driven"),
            "driven.json",
        )
        submitted = deployment.cli("submit", str(spec))
        assert submitted.returncode == 0, submitted.stderr
        assert "no `fleet driver` is running" not in submitted.stderr
        assert _wait(lambda: deployment.store.campaign("driven").driver == f"driver@{node}", 60)

        # fab stop sends SIGTERM: the driver lets go of the campaign at once, for another driver to take.
        stopped = deployment.fab("stop", hosts=(node,))
        assert stopped.returncode == 0, f"{stopped.stdout}\n{stopped.stderr}"
        assert f"{node}: driver stopped" in stopped.stdout
        campaign = deployment.store.campaign("driven")
        assert (campaign.status, campaign.driver) == ("running", None)
        assert host.run("pgrep -u $(id -u) -f 'fleet driver'").returncode == 1
        assert not _live_driver(deployment, node)

        # fab start brings it back, and it drives the campaign to its end.
        started = deployment.fab("start", hosts=(node,))
        assert started.returncode == 0, started.stderr
        assert _wait(lambda: deployment.store.campaign("driven").status == "done", 180), "the campaign did not end"
        counts = deployment.store.trial_counts(deployment.store.campaign("driven").id)
        assert counts == {"evaluated": 2}
        logs = deployment.fab("logs", "--lines", "200", hosts=(node,))
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.count(f"driver@{node}: took campaign 'driven'") == 2
    finally:
        deployment.fab("stop", hosts=(node,))


def _live_driver(deployment: Deployment, node: str) -> bool:
    return any(w.name == f"driver@{node}" for w in deployment.store.workers(role="driver", within=30))


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_deploy_refuses_without_the_urls(deployment: Deployment) -> None:
    env = {k: v for k, v in deployment.env.items() if k != "FLEET_BROKER_URL"}
    done = subprocess.run(
        [
            str(FAB),
            "-r",
            str(ROOT / "deploy"),
            "-S",
            str(deployment.hosts.config),
            "-H",
            NODES[1],
            "deploy",
            "--wheelhouse",
            str(deployment.wheelhouse),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "set FLEET_BROKER_URL in your environment" in done.stdout + done.stderr
    # Nothing half way: the node still has the broker it was deployed with.
    broker = deployment.hosts[NODES[1]].run("cat ~/fleet/broker-url").stdout
    assert broker == deployment.env["FLEET_BROKER_URL"] + "\n"


def test_deploys_started_together_never_take_a_half_built_wheelhouse(tmp_path: Path) -> None:
    """One fab per node side by side: while one builds the wheelhouse (under the build lock, python.txt not yet
    written), another that finds Fleet's wheel there already waits for the build to end, not uploads what is there."""
    fabfile = load_fabfile()
    half = tmp_path / "wheelhouse"
    half.mkdir()
    (half / "fleet_tune-0.1.0-py3-none-any.whl").write_bytes(b"")
    (ROOT / "dist").mkdir(exist_ok=True)
    found: list[Path] = []
    with (ROOT / "dist" / ".build.lock").open("w") as building:
        fcntl.flock(building, fcntl.LOCK_EX)
        other = threading.Thread(target=lambda: found.append(fabfile.build_wheelhouse(half, sys.executable)))
        other.start()
        other.join(3)
        assert other.is_alive() and found == []
        (half / "python.txt").write_text("3.11.2-x86_64\n")  # the build's last step
    other.join(60)
    assert found == [half]


def test_a_wheelhouse_pip_cannot_build_is_one_line_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As from an operator's seat with no route to the package index (the bed's, in test_deploy_nodes.py)."""
    fabfile = load_fabfile()
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds no build backend to build Fleet's own wheel with
    with pytest.raises(fabfile.Exit) as refused:
        fabfile.build_wheelhouse(tmp_path / "wheelhouse", sys.executable)
    assert str(refused.value.message).startswith("pip could not build the wheelhouse for Python 3.")
    assert str(refused.value.message).endswith("name it with --wheelhouse or FLEET_WHEELHOUSE")
    assert not (tmp_path / "wheelhouse" / "python.txt").exists()


def test_systemd_units_verify(tmp_path: Path) -> None:
    fabfile = load_fabfile()
    node = fabfile.Node(True, str(tmp_path / "opt"), str(tmp_path / "node.env"), "root")
    (tmp_path / "opt" / "venv" / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.executable).parent / "fleet", tmp_path / "opt" / "venv" / "bin" / "fleet")
    (tmp_path / "node.env").write_text("FLEET_HOME='/tmp'\n")
    units = fabfile.render_units(node, ["--target", "gfx90a:104"], [0, 1], 900)
    assert set(units) == {"fleet-eval@.service", "fleet-build.service"}
    for name, text in units.items():
        (tmp_path / name).write_text(text)
        assert "KillMode=mixed" in text and "TimeoutStopSec=960" in text
    assert "--role eval --gpus %i" in units["fleet-eval@.service"]
    for text in units.values():
        # Each worker checks its node first, as the unit runs it: the very command, with --check.
        [start] = [line.removeprefix("ExecStart=") for line in text.splitlines() if line.startswith("ExecStart=")]
        assert f"ExecStartPre={start} --check" in text.splitlines()
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "run scripts/install-services (Debian's systemd provides systemd-analyze)"
    checked = [str(tmp_path / "fleet-eval@0.service"), str(tmp_path / "fleet-build.service")]
    done = subprocess.run(
        [systemd_analyze, "verify", *checked], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert fabfile.unit_names([0, 1]) == ["fleet-eval@0.service", "fleet-eval@1.service", "fleet-build.service"]
    cpu = fabfile.render_units(node, ["--target", "cpu-x86_64", "--eval-procs", "2"], [], 900)
    assert set(cpu) == {"fleet-eval.service", "fleet-build.service"}


def test_an_evaluation_unit_names_its_gpu_once_whatever_the_node_was_given(tmp_path: Path) -> None:
    """`fab deploy --gpus 0,1`: the node's options hold --gpus; each evaluation unit passes only its own."""
    fabfile = load_fabfile()
    node = fabfile.Node(True, str(tmp_path / "opt"), str(tmp_path / "node.env"), "root")
    (tmp_path / "opt" / "venv" / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.executable).parent / "fleet", tmp_path / "opt" / "venv" / "bin" / "fleet")
    (tmp_path / "node.env").write_text("FLEET_HOME='/tmp'\n")
    for given in (fabfile.worker_args("gfx90a:104", "0,1", None, None), ["--target", "gfx90a:104", "--gpus=0,1"]):
        units = fabfile.render_units(node, given, [0, 1], 900)
        [start] = [line for line in units["fleet-eval@.service"].splitlines() if line.startswith("ExecStart=")]
        assert start.split().count("--gpus") == 1 and start.endswith("--role eval --gpus %i"), start
        assert "--gpus=" not in start
        (tmp_path / "fleet-eval@0.service").write_text(units["fleet-eval@.service"])
        systemd_analyze = shutil.which("systemd-analyze")
        assert systemd_analyze, "run scripts/install-services (Debian's systemd provides systemd-analyze)"
        done = subprocess.run(
            [systemd_analyze, "verify", str(tmp_path / "fleet-eval@0.service")],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr


def test_driver_unit_verifies(tmp_path: Path) -> None:
    """The driver's unit: `fleet driver` as the node's unprivileged user with its environment file, stopped by
    SIGTERM within a minute, started with the workers' or alone."""
    fabfile = load_fabfile()
    node = fabfile.Node(True, str(tmp_path / "opt"), str(tmp_path / "node.env"), "fleet")
    args = fabfile.driver_args("head1", 8)
    unit = fabfile.render_driver_unit(node, args)
    lines = unit.splitlines()
    assert f"ExecStart={tmp_path}/opt/venv/bin/fleet driver --name driver@head1 --max-campaigns 8" in lines
    assert {"User=fleet", "Group=fleet", f"EnvironmentFile={tmp_path}/node.env"} <= set(lines)
    assert {"KillSignal=SIGTERM", "TimeoutStopSec=60", "NoNewPrivileges=yes", "ProtectSystem=strict"} <= set(lines)
    assert f"LoadCredential=fleet-database-url:{tmp_path}/database-url" in lines  # the URLs: credentials
    assert f"LoadCredential=fleet-broker-url:{tmp_path}/broker-url" in lines
    assert not re.search(r"@[A-Z_]+@", unit)  # every placeholder filled
    assert fabfile.unit_names([], ["driver"]) == ["fleet-driver.service"]
    assert fabfile.unit_names([0], ["workers", "driver"])[-2:] == ["fleet-build.service", "fleet-driver.service"]
    assert fabfile.parse_roles("driver,workers") == ["workers", "driver"]
    with pytest.raises(fabfile.Exit):
        fabfile.parse_roles("drivers")

    # systemd-analyze checks the user exists: verify the same unit for root, which does.
    (tmp_path / "opt" / "venv" / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.executable).parent / "fleet", tmp_path / "opt" / "venv" / "bin" / "fleet")
    (tmp_path / "opt" / "home").mkdir()
    (tmp_path / "node.env").write_text("FLEET_HOME='/tmp'\n")
    root = fabfile.Node(True, str(tmp_path / "opt"), str(tmp_path / "node.env"), "root")
    (tmp_path / "fleet-driver.service").write_text(fabfile.render_driver_unit(root, args))
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "run scripts/install-services (Debian's systemd provides systemd-analyze)"
    done = subprocess.run(
        [systemd_analyze, "verify", str(tmp_path / "fleet-driver.service")],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr


def test_worker_roles_and_node_name_for_the_units() -> None:
    """What each unit starts: `fleet worker --role` keeps one kind of process, named after FLEET_NODE_NAME."""
    env = {**os.environ, "FLEET_NODE_NAME": "node7"}

    def dry(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "fleet.cli", "worker", "--dry-run", "--target", "cpu-x86_64", *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return [line.split()[0] for line in done.stdout.splitlines() if not line.startswith(" ")]

    assert dry("--eval-procs", "2") == ["eval-cpu0@node7", "eval-cpu1@node7", "build-cpu-x86_64@node7"]
    assert dry("--eval-procs", "2", "--role", "eval") == ["eval-cpu0@node7", "eval-cpu1@node7"]
    assert dry("--role", "build") == ["build-cpu-x86_64@node7"]
