"""The test bed of nodes (issue 39): each node its own network, hostname, mounts, PID namespace with tini, account and
sshd; a database node with PostgreSQL and Redis; torn down with nothing left in the machine's own namespaces."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fleet.ops.nodes import ACCOUNT, DATABASE_ADDRESS, Bed
from tests.conftest import ROOT
from tests.nodes import make_bed


def machine_state() -> dict[str, str]:
    """What a bed must leave as it found it in the machine's own namespaces: links, addresses, routes, rules,
    named network namespaces, mounts (of the machine's own mount namespace)."""
    commands = {
        "links": ["ip", "-o", "link"],
        "addresses": ["ip", "-o", "addr"],
        "routes": ["ip", "route", "show", "table", "all"],
        "rules": ["nft", "list", "ruleset"],
        "netns": ["ip", "netns", "list"],
    }
    state = {key: subprocess.run(argv, capture_output=True, text=True).stdout for key, argv in commands.items()}
    state["mounts"] = Path("/proc/1/mountinfo").read_text()
    return state


def bed_processes(bed: Bed) -> list[str]:
    """Processes on the machine that belong to the bed: in one of its network namespaces, or running from its folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if bed.directory in cmdline or f"{bed.prefix}-" in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_a_bed_of_nodes_apart_comes_up_in_seconds_and_goes_leaving_nothing() -> None:
    before = machine_state()
    begun = time.monotonic()
    bed = make_bed(2)
    up = time.monotonic() - begun
    try:
        node1, node2 = bed["node1"], bed["node2"]
        # Each node its own host name, PID namespace with tini as PID 1, /tmp, and an account the machine lacks.
        for node in (node1, node2):
            assert bed.run(node, ["hostname"]).stdout.strip() == node.name
            assert bed.run(node, ["cat", "/proc/1/comm"]).stdout.strip() == "tini"
            assert bed.run(node, ["id", "-un"]).stdout.strip() == ACCOUNT
        assert ACCOUNT not in Path("/etc/passwd").read_text()
        assert bed.run(node1, ["sh", "-c", "echo one > /tmp/mine"]).returncode == 0
        assert bed.run(node2, ["test", "-e", "/tmp/mine"]).returncode == 1
        assert not Path("/tmp/mine").exists()
        # tini reaps an orphan: no zombie is left for `kill -0` to take for a live process.
        bed.run(node1, ["sh", "-c", "sleep 0.2 & exit 0"])
        time.sleep(0.5)
        assert " Z" not in bed.run(node1, ["ps", "-eo", "pid,stat"]).stdout
        # Each node its own address: node2 reaches the database node's PostgreSQL and Redis over the bridge.
        probe = f"import psycopg2, redis; psycopg2.connect(host={DATABASE_ADDRESS!r}, user='fleet', dbname='fleet'); "
        done = bed.run(node2, [sys.executable, "-c", probe + f"print(redis.Redis({DATABASE_ADDRESS!r}).ping())"])
        assert done.stdout.strip() == "True", done.stderr
        # sshd on each node, reached by name from the operator's seat with the bed's ssh config, as a user would.
        ssh = bed.at_switch(["ssh", "-F", str(bed.ssh_config), "node2", "hostname; id -un"])
        assert subprocess.run(ssh, capture_output=True, text=True, timeout=30).stdout.split() == ["node2", ACCOUNT]
        # The machine itself has no route to the bed: its addresses live in the bed's namespaces only.
        assert DATABASE_ADDRESS not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        # Each node's Fleet home its own filesystem: node1's filled to the last byte, node2's is not.
        write = ["sh", "-c", "echo kept > ~/.fleet/mine"]
        assert bed.fill(node1) > 32 << 20
        assert bed.run(node1, write).returncode != 0
        assert bed.run(node2, write).returncode == 0
        # Each node its own wall clock, for its Fleet processes: node1's two minutes behind, node2's right.
        bed.jump(node1, -120)
        time.sleep(0.5)  # a running process reads the clock file again within 0.2 s
        clocks = [int(bed.run(node, ["date", "+%s"]).stdout) - time.time() for node in (node1, node2)]
        assert -125 < clocks[0] < -115 and abs(clocks[1]) < 5, clocks
        bed.heal(node1)
        time.sleep(0.5)
        assert abs(int(bed.run(node1, ["date", "+%s"]).stdout) - time.time()) < 5
        assert bed.run(node1, write).returncode == 0
        # A crashed node (its PID 1 killed) takes its processes with it and comes back with its disk.
        bed.crash(node1)
        bed.start(node1)
        assert bed.run(node1, ["id", "-un"]).stdout.strip() == ACCOUNT
        assert bed.run(node1, ["test", "-e", "/tmp/mine"]).returncode == 1  # /tmp is gone, as after a reboot
        assert bed.run(node1, ["cat", ".fleet/mine"]).stdout == "kept\n"  # its Fleet home is not
    finally:
        begun = time.monotonic()
        bed.down()
        down = time.monotonic() - begun
    print(f"bed of 3 nodes: up in {up:.1f} s, down in {down:.1f} s")
    assert bed_processes(bed) == []
    assert not Path(bed.directory).exists()
    # Each node's Fleet home went with its mount namespace, and its loop device with it.
    assert bed.directory not in subprocess.run(["losetup", "--list"], capture_output=True, text=True).stdout
    after = machine_state()
    for key, text in before.items():
        # Other tests on this machine may add or remove their own loopback servers' mounts; the bed's never.
        if key == "mounts":
            assert bed.directory not in after[key]
        else:
            assert after[key] == text, f"the bed left {key} changed"


def test_where_namespaces_cannot_be_made_the_bed_refuses_in_one_line(tmp_path: Path) -> None:
    """Not root (here: nobody), `scripts/nodes up` says why in one line and exits 1, leaving nothing."""
    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(ROOT / "scripts" / "nodes"),
         "--root", str(tmp_path), "up", "2"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"nodes: .*needs root", lines[0]), done.stderr
    assert list(tmp_path.iterdir()) == []
