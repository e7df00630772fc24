"""``fab deploy`` as a user runs it, to nodes that are really apart (issue 39): a bed of a database node, three worker
nodes and two head nodes (fleet/ops/nodes.py), each with its own network, host name, ``/tmp``, ``/home``, accounts
and sshd. From the operator's seat (the bed's switch, which reaches the nodes only over the bridge), ``fab`` deploys
the workers and the drivers over SSH to the nodes' addresses, ``fleet submit`` hands a campaign to the drivers, and
``fab stop`` ends everything. The spec lies in the machine's ``/tmp``, which no node sees: Fleet reaches the nodes
through the deploy, the campaign through the database and the broker, never through a shared folder (the nodes share
only the machine's system files, as nodes made from one image do)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from fleet.ops.nodes import ACCOUNT, DATABASE_ADDRESS, POSTGRES_PORT, REDIS_PORT, Bed
from fleet.store import Measurement, Store, Trial
from tests.conftest import ROOT, write_spec
from tests.integration.test_deploy import FAB, load_fabfile
from tests.nodes import BedFleet, make_bed

WORKERS = ("node1", "node2", "node3")
HEADS = ("node4", "node5")
TARGET = "cpu-bed"
TRIALS = 24


@dataclass
class Seat:
    """The operator's seat: commands run in the bed's switch namespace, with the operator's environment."""

    bed: Bed
    env: dict[str, str]

    def run(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.bed.at_switch(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def fab(self, hosts: tuple[str, ...], *args: str) -> list[str]:
        """``fab -r deploy -S SSH_CONFIG -H HOSTS ARGS``, as docs/operations.md shows it."""
        return [str(FAB), "-r", str(ROOT / "deploy"), "-S", str(self.bed.ssh_config), "-H", ",".join(hosts), *args]

    def fleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "fleet.cli", *args], timeout=120)


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    """A bed of a database node and five nodes (host names node1 ... node5), and the seat that deploys to it."""
    bed = make_bed(len(WORKERS) + len(HEADS))
    try:
        ssh = ["ssh", "-F", str(bed.ssh_config), WORKERS[0], "command -v python3"]
        node_python = subprocess.run(bed.at_switch(ssh), capture_output=True, text=True, timeout=60).stdout.strip()
        assert node_python, "the nodes need python3"
        # The seat has no route beyond the bed, so pip could not reach its index from there: the wheelhouse is built
        # here first, where the fabfile finds it (the nodes' Python and the sources name it), as for air-gapped nodes.
        load_fabfile().build_wheelhouse(python=node_python)
        home = tmp_path_factory.mktemp("seat")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
            "FLEET_DATABASE_URL": f"postgresql+psycopg2://fleet@{DATABASE_ADDRESS}:{POSTGRES_PORT}/fleet",
            "FLEET_BROKER_URL": f"redis://{DATABASE_ADDRESS}:{REDIS_PORT}/0",
            "FLEET_NODE_PYTHON": node_python,
            "FLEET_HOME": str(home / ".fleet"),
            "FLEET_HEARTBEAT_SECONDS": "1",
            "FLEET_STOP_TIMEOUT": "60",
            "FLEET_SSH_CONFIG": str(bed.ssh_config),  # fleet exec's, as ~/.ssh/config would be
            "PYTHONUNBUFFERED": "1",
        }
        yield Seat(bed, env)
    finally:
        bed.down()


def campaign_spec(name: str) -> dict:
    """A grid whose builds and runs take a moment; each run prints its score and the host name it ran on."""
    build = "import sys, time; time.sleep(0.2); open('b.txt', 'w').write(sys.argv[1])"
    run = (
        "import json, socket, sys, time; time.sleep(0.3); "
        "print(json.dumps({'score': int(open('b.txt').read()) * 10 + int(sys.argv[1]), 'host': socket.gethostname()}))"
    )
    python = ["python3", "-I", "-S", "-c"]  # what a node's PATH finds, as a user's spec says it; not this test's Python
    return {
        "name": name,
        "target": TARGET,
        "problems": [{"kind": "bed", "params": {}}],
        "space": {"knobs": {"b": {"values": list(range(TRIALS // 4)), "build": True}, "r": {"values": [0, 1, 2, 3]}}},
        "strategy": {"name": "grid", "budget": TRIALS},
        "workload": {
            "kind": "command",
            "build": [*python, build, "{b}"],
            "artifacts": ["b.txt"],
            "run": [*python, run, "{r}"],
            "objective": {"json": "score", "goal": "max"},
            "repeats": 1,
        },
    }


def node_processes(bed: Bed, name: str) -> list[str]:
    """The node account's processes on the node, from inside its own PID namespace."""
    done = bed.run(bed[name], ["ps", "-o", "args=", "-u", ACCOUNT], user=None)
    return [line for line in done.stdout.splitlines() if line]


def deploy(seat: Seat) -> float:
    """``fab deploy`` to each node from a shell of its own, side by side: the workers on the worker nodes, a driver on
    each head node; the seconds it took."""
    begun = time.monotonic()
    workers = ["deploy", "--target", TARGET, "--eval-procs", "1", "--build-procs", "1"]
    commands = {name: seat.fab((name,), *workers) for name in WORKERS}
    commands |= {name: seat.fab((name,), "deploy", "--role", "driver") for name in HEADS}
    shells = {
        name: subprocess.Popen(
            seat.bed.at_switch(argv), env=seat.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, argv in commands.items()
    }
    for name, shell in shells.items():
        out, _ = shell.communicate(timeout=900)
        assert shell.returncode == 0, out
        role = "workers" if name in WORKERS else "driver"
        assert f"{name}: {role} started (pid " in out and f"{name}: deployed fleet" in out, out
    return time.monotonic() - begun


def check_measurements(store: Store, name: str) -> None:
    """Every trial measured once, each measurement naming the node whose host name its run saw, on every worker
    node; the campaign driven by head nodes' drivers alone, whose logs on those nodes say they took it."""
    campaign = store.campaign(name)
    assert store.trial_counts(campaign.id) == {"evaluated": TRIALS}
    with store.session() as session:
        query = select(Measurement).join(Trial).where(Trial.campaign_id == campaign.id)
        measured = [(m.node, m.worker, m.metrics["host"]) for m in session.scalars(query)]
    assert len(measured) == TRIALS
    assert [(node, worker, host) for node, worker, host in measured if worker != f"eval-cpu0@{host}"] == []
    assert [(node, host) for node, _, host in measured if node != host] == []
    assert {node for node, _, _ in measured} == set(WORKERS)


def test_fab_deploys_workers_and_drivers_to_nodes_apart_and_each_measurement_names_its_node(
    seat: Seat, tmp_path: Path
) -> None:
    bed = seat.bed
    store = Store(bed.database_url)  # the checker reads through the database node's unix socket
    stopped = None
    try:
        deployed = deploy(seat)
        names = {f"{role}@{n}" for n in WORKERS for role in ("eval-cpu0", f"build-{TARGET}")}
        names |= {f"driver@{n}" for n in HEADS}
        BedFleet.wait_for(lambda: names <= {w.name for w in store.workers(within=30)}, 120, "every worker and driver")
        # Each runs inside its node, as the node's account, from the virtual environment the deploy made there.
        for name in WORKERS:
            assert any(f"fleet/venv/bin/fleet worker --target {TARGET}" in p for p in node_processes(bed, name))
        for name in HEADS:
            driver = f"/home/{ACCOUNT}/fleet/venv/bin/fleet driver --name driver@{name}"
            assert any(driver in p for p in node_processes(bed, name)), node_processes(bed, name)

        # fleet exec reaches a node by the name it registered, from the seat over SSH.
        reached = seat.fleet("exec", "--node", "node2", "hostname")
        assert reached.returncode == 0, reached.stderr
        assert reached.stdout.splitlines() == ["--- node2: exit 0", "node2"]

        # A campaign handed to the fleet: a head node's driver drives it, the worker nodes measure it.
        begun = time.monotonic()
        spec = write_spec(tmp_path, campaign_spec("apart"))  # the machine's /tmp: no node sees it
        submitted = seat.fleet("submit", str(spec))
        assert submitted.returncode == 0, submitted.stderr
        drivers: set[str] = set()

        def done() -> bool:
            campaign = store.campaign("apart")
            drivers.add(campaign.driver or "")
            return campaign.status == "done"

        BedFleet.wait_for(done, 240, "the campaign to end")
        ran = time.monotonic() - begun
        check_measurements(store, "apart")
        drivers.discard("")
        assert drivers and drivers <= {f"driver@{n}" for n in HEADS}, drivers
        # And the driver that held it ran on its head node: its log there says it took the campaign.
        logs = {n: (bed[n].home / "fleet" / "logs" / "driver.log").read_text() for n in HEADS}
        assert drivers <= {f"driver@{n}" for n, log in logs.items() if "took campaign 'apart'" in log}, logs

        # fab stop: every worker and driver stopped warmly, nothing of Fleet left running on any node.
        begun = time.monotonic()
        stopped = seat.run(seat.fab(WORKERS + HEADS, "stop"))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert [line for line in stopped.stdout.splitlines() if line.endswith(" stopped")] == [
            *(f"{n}: workers stopped" for n in WORKERS),
            *(f"{n}: driver stopped" for n in HEADS),
        ]
        for name in WORKERS + HEADS:
            assert node_processes(bed, name) == [], name
        assert [w.name for w in store.workers(within=30) if w.name in names] == []
        print(f"\nfab deploy to 5 nodes side by side {deployed:.1f} s, {TRIALS} trials {ran:.1f} s, "
              f"fab stop {time.monotonic() - begun:.1f} s")  # fmt: skip
    finally:
        if stopped is None:
            seat.run(seat.fab(WORKERS + HEADS, "stop"))
        store.close()
