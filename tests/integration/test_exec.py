"""``fleet exec``: one command on many real SSH hosts (tests/sshhosts.py) at once, each host's output and
exit status reported, an unreachable host or a failing command reported without stopping the others."""

from __future__ import annotations

import socket

from fleet.store import Store
from tests.conftest import Fleet
from tests.sshhosts import SshHosts, ssh_hosts  # noqa: F401  (the fixture)

ALL = "fleetnode1,fleetnode2,fleetnode3"


def blocks(output: str) -> dict[str, tuple[str, list[str]]]:
    """``--- host: status`` headers and the lines under them."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in output.splitlines():
        if line.startswith("--- "):
            host, _, status = line[4:].partition(": ")
            found[host] = (status, [])
            current = host
        elif current is not None:
            found[current][1].append(line)
    return found


def exec_env(hosts: SshHosts) -> dict[str, str]:
    """The SSH config file that names the test hosts, as ~/.ssh/config would."""
    return {"FLEET_SSH_CONFIG": str(hosts.config)}


def test_exec_runs_everywhere_as_each_hosts_user(fleet: Fleet, ssh_hosts: SshHosts) -> None:  # noqa: F811
    done = fleet.cli("exec", "--hosts", ALL, 'echo "$USER on $(hostname)"; echo warn >&2', env=exec_env(ssh_hosts))
    assert done.returncode == 0, done.stderr
    found = blocks(done.stdout)
    assert list(found) == ["fleetnode1", "fleetnode2", "fleetnode3"]  # the order the hosts were given
    for host, (status, lines) in found.items():
        assert status == "exit 0"
        assert lines == [f"{host} on {socket.gethostname()}", "warn"]


def test_exec_reports_a_failing_command_and_an_unreachable_host(fleet: Fleet, ssh_hosts: SshHosts) -> None:  # noqa: F811
    down = ssh_hosts["fleetnode3"]
    down.stop()
    try:
        done = fleet.cli(
            "exec", "--hosts", ALL, '[ "$USER" != fleetnode2 ] && echo fine || exit 7', env=exec_env(ssh_hosts)
        )
    finally:
        down.start()
    assert done.returncode == 1
    found = blocks(done.stdout)
    assert found["fleetnode1"] == ("exit 0", ["fine"])
    assert found["fleetnode2"] == ("exit 7", [])
    assert found["fleetnode3"][0].startswith("unreachable: ")
    assert "Connection refused" in found["fleetnode3"][0] or "Unable to connect" in found["fleetnode3"][0]
    assert "fleet exec: failed on 2 of 3 hosts: fleetnode2 (exit 7), fleetnode3 (unreachable" in done.stderr


def _register(store: Store, host: str, name: str) -> None:
    store.register_worker(
        name=name,
        hostname=host,
        role="eval",
        target="cpu-exec",
        queues=["eval.cpu-exec"],
        gpu=None,
        gpus=[],
        cpus=1,
        concurrency=1,
        pid=1,
    )


def test_exec_defaults_to_the_machines_table(fleet: Fleet, ssh_hosts: SshHosts) -> None:  # noqa: F811
    env = exec_env(ssh_hosts)
    empty = fleet.cli("exec", "whoami", env=env)
    assert empty.returncode == 1
    assert "fleet: error: no machines to run on: none registered; name them with --hosts" in empty.stderr

    _register(fleet.store, "fleetnode1", "eval-cpu0@fleetnode1")
    _register(fleet.store, "fleetnode2", "eval-cpu0@fleetnode2")
    fleet.store.worker_stopped("eval-cpu0@fleetnode2")

    every = fleet.cli("exec", "whoami", env=env)
    assert every.returncode == 0, every.stderr
    assert blocks(every.stdout) == {"fleetnode1": ("exit 0", ["fleetnode1"]), "fleetnode2": ("exit 0", ["fleetnode2"])}

    available = fleet.cli("exec", "--available", "whoami", env=env)
    assert available.returncode == 0, available.stderr
    assert blocks(available.stdout) == {"fleetnode1": ("exit 0", ["fleetnode1"])}


def test_exec_timeout_is_reported_per_host(fleet: Fleet, ssh_hosts: SshHosts) -> None:  # noqa: F811
    done = fleet.cli(
        "exec",
        "--hosts",
        "fleetnode1,fleetnode2",
        '[ "$USER" = fleetnode1 ] && sleep 30; echo done',
        "--timeout",
        "2",
        env=exec_env(ssh_hosts),
    )
    assert done.returncode == 1
    found = blocks(done.stdout)
    assert found["fleetnode1"][0] == "timed out after 2 s"
    assert found["fleetnode2"] == ("exit 0", ["done"])


def test_exec_node_picks_machines_by_their_registered_name(fleet: Fleet, ssh_hosts: SshHosts) -> None:  # noqa: F811
    """--node NAME: the machine whose workers registered as NAME (FLEET_NODE_NAME, else the host name); an unknown
    name is one line, before any host is reached."""
    env = exec_env(ssh_hosts)
    for host in ("fleetnode1", "fleetnode2", "fleetnode3"):
        _register(fleet.store, host, f"eval-cpu0@{host}")
    picked = fleet.cli("exec", "--node", "fleetnode3", "--node", "fleetnode1", "whoami", env=env)
    assert picked.returncode == 0, picked.stderr
    assert blocks(picked.stdout) == {"fleetnode3": ("exit 0", ["fleetnode3"]), "fleetnode1": ("exit 0", ["fleetnode1"])}
    assert list(blocks(picked.stdout)) == ["fleetnode3", "fleetnode1"]  # the order they were given
    assert blocks(fleet.cli("exec", "--node", "fleetnode2", "whoami", env=env).stdout) == {
        "fleetnode2": ("exit 0", ["fleetnode2"])
    }

    unknown = fleet.cli("exec", "--node", "fleetnode2,gpu9", "whoami", env=env)
    assert unknown.returncode == 1
    assert unknown.stdout == ""
    assert unknown.stderr.strip().splitlines()[-1] == (
        "fleet: error: no node 'gpu9' in the machines table (its nodes: fleetnode1, fleetnode2, fleetnode3)"
    )
    both = fleet.cli("exec", "--node", "fleetnode1", "--hosts", "fleetnode1", "whoami", env=env)
    assert both.returncode == 2 and "give one of --hosts, --node and --available" in both.stderr
