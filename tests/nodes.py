"""The test bed of nodes (fleet/ops/nodes.py) as pytest fixtures, and a Fleet run across its nodes.

``bed`` is a database node and three nodes for one test module; :class:`BedFleet` starts Fleet's own processes on
them (``fleet worker``, ``fleet driver``) as a node's service manager would, each as the node's account with the
node's environment, and reads the database from the machine through PostgreSQL's unix socket, so that no partition
the test makes hides the truth from its checks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# The short leases of `fleet bench partition` (a partition costs seconds; the mechanisms are the production ones),
# and the one host name every node of the bed shares.
from fleet.bench.nemesis import SETTINGS, SHARED_HOSTNAME
from fleet.ops.nodes import Bed, BedError, Node, check_host
from fleet.store import Store


def make_bed(count: int, **kwargs: object) -> Bed:
    """A bed that is up, or a test failure saying in one line why it cannot be made here (never a skip)."""
    try:
        check_host()
    except BedError as error:
        pytest.fail(str(error))
    return Bed.create(count, **kwargs).up()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    """A database node and three nodes for the module, all with one host name (as nodes cloned from one image have,
    so that anything told apart by host name is caught); torn down completely after it."""
    made = make_bed(3, hostname=SHARED_HOSTNAME)
    try:
        yield made
    finally:
        made.down()


@dataclass
class BedFleet:
    """Fleet's processes on a bed's nodes, and its database as the machine sees it."""

    bed: Bed
    logs: Path
    store: Store = field(init=False)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = Store(self.bed.database_url)

    def env(self, node: Node, **extra: str) -> dict[str, str]:
        return self.bed.node_env(node, {**SETTINGS, **extra})

    def spawn_fleet(self, node: Node, *args: str, log: str) -> subprocess.Popen[bytes]:
        """``fleet ARGS`` started on ``node``, its output in ``log`` of the test's folder; stopped after the test."""
        argv = [sys.executable, "-m", "fleet.cli", *args]
        proc = self.bed.spawn(node, argv, log=self.logs / log, env=self.env(node))
        self.procs.append(proc)
        return proc

    def worker(self, node: Node, target: str, *args: str) -> subprocess.Popen[bytes]:
        """``fleet worker`` on ``node`` for ``target``."""
        return self.spawn_fleet(node, "worker", "--target", target, *args, log=f"worker-{node.name}.log")

    def driver(self, node: Node) -> subprocess.Popen[bytes]:
        """``fleet driver`` on ``node``."""
        return self.spawn_fleet(node, "driver", log=f"driver-{node.name}.log")

    def fleet(self, node: Node, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``fleet ARGS`` run on ``node``."""
        return self.bed.run(node, [sys.executable, "-m", "fleet.cli", *args], env=self.env(node), timeout=timeout)

    @staticmethod
    def wait_for(condition: Callable[[], object], timeout: float = 60, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with_group(proc, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(10)
        self.store.close()


def with_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal ``proc``'s process group: the nsenter on the machine and the command it runs on the node."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


@pytest.fixture
def bed_fleet(bed: Bed, tmp_path: Path) -> Iterator[BedFleet]:
    """Fleet on the module's bed for one test: an empty broker, the processes it started stopped after it."""
    import redis

    redis.Redis(unix_socket_path=f"{bed['db'].directory}/redis/redis.sock").flushall()
    made = BedFleet(bed, tmp_path)
    try:
        yield made
    finally:
        made.close()
