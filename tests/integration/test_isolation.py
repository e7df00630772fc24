"""Campaigns that cannot touch each other, and workloads that reach no host socket (issue 44), tried as an attacker
who submits specs to a shared fleet would: workers run as the docs say (an unprivileged service account, the URLs in
0600 files), real PostgreSQL, Redis, worker processes and bubblewrap.

fleet/workers/sandbox.py (a private /tmp and /var/tmp, no unix socket), fleet/workers/runner.py.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.services import PostgresServer
from tests.conftest import ROOT, Fleet, write_spec
from tests.integration.test_sandbox import start_service_worker

# Dials every socket it is given (a path, or @name for an abstract one) and says what each did; creates one of its
# own in its private /tmp, and a pair, which a workload may well need.
DIAL = """
import json, os, socket, sys
said = {}
for path in sys.argv[1:]:
    address = "\\0" + path[1:] if path.startswith("@") else path
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(address)
        s.sendall(b"PING\\r\\n")
        said[path] = "reached: " + s.recv(100).decode(errors="replace")
    except OSError as error:
        said[path] = type(error).__name__ + ": " + str(error.strerror)
a, b = socket.socketpair()
a.sendall(b"x")
tmp = sorted(os.listdir("/tmp")) + sorted(os.listdir("/var/tmp"))
print(json.dumps({"t": 1, "reached": sum(v.startswith("reached") for v in said.values()), "said": said,
                  "pair": b.recv(1).decode(), "tmp": tmp[:20]}))  # a few names: the line must fit the output's tail
"""


class PeerServer:
    """A unix socket that answers with the uid it sees at the other end (SO_PEERCRED), as a service that lets its
    own account in (PostgreSQL's ``peer``) checks it; every connection is remembered."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.seen: list[int] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # anyone may connect: the sandbox, not the socket's mode, must keep them out
        self.sock.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            self.seen.append(uid)
            # Read the caller's line first: answering and closing before it writes ends its write in EPIPE.
            conn.settimeout(5)
            try:
                conn.recv(100)
                conn.sendall(f"uid {uid}\n".encode())
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[PeerServer]]:
    """Peer-credential servers where a node's services keep their sockets: in /tmp, in /var/tmp, in a folder
    outside both that everyone may pass (here the checkout's), and in the abstract namespace."""
    token = uuid.uuid4().hex[:12]
    outside = ROOT / "test-artifacts" / f"sockets-{token}"
    outside.mkdir(parents=True)
    outside.chmod(0o755)
    var_tmp = Path("/var/tmp") / f"fleet-test-{token}.sock"
    made = [
        PeerServer(str(tmp_path / "peer.sock")),
        PeerServer(str(var_tmp)),
        PeerServer(str(outside / "peer.sock")),
        PeerServer(f"\0fleet-test-{token}"),
    ]
    yield made
    for server in made:
        server.close()
    var_tmp.unlink(missing_ok=True)
    (outside / "peer.sock").unlink(missing_ok=True)
    outside.rmdir()


def dial_spec(fleet: Fleet, name: str, targets: list[str], **workload: object) -> Path:
    (fleet.home / "dial.py").write_text(DIAL)
    spec = {
        "name": name,
        "target": fleet.target,
        "problems": [{"kind": "dial", "params": {}}],
        "space": {"knobs": {"attempt": {"values": [1], "build": False}}},
        "workload": {
            "kind": "command",
            "sources": ["dial.py"],
            "run": ["python3", "dial.py", *targets],
            "objective": {"json": "t"},
            **workload,
        },
    }
    return write_spec(fleet.home, spec, f"{name}.json")


def last_line(fleet: Fleet, campaign: str) -> dict:
    results = fleet.store.results(campaign_id=fleet.store.campaign(campaign).id)
    assert results, f"{campaign}: no result"
    stdout = fleet.store.trial_detail(results[0].trial_id).trial.stdout_tail or ""
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("network", [False, True])
def test_a_workload_reaches_no_socket_of_the_host_network_or_not(
    fleet: Fleet, servers: list[PeerServer], postgres_server: PostgresServer, network: bool
) -> None:
    """Issue 44, item 4: the PostgreSQL socket (trusted: the test server lets its socket in as superuser), sockets in
    /tmp, /var/tmp and elsewhere, and an abstract one: none answers, and no peer-credential server sees anyone."""
    start_service_worker(fleet)
    postgres = str(postgres_server.directory / f".s.PGSQL.{postgres_server.port}")
    assert Path(postgres).is_socket()
    targets = [postgres, *(s.address if s.address[0] != "\0" else "@" + s.address[1:] for s in servers)]
    name = f"dial-{int(network)}"
    done = fleet.cli("tune", str(dial_spec(fleet, name, targets, network=network)), "--json")
    assert done.returncode == 0, done.stderr
    out = last_line(fleet, name)
    assert out["reached"] == 0, out["said"]
    assert [s.seen for s in servers] == [[], [], [], []]
    assert all(said.startswith(("PermissionError", "FileNotFoundError")) for said in out["said"].values()), out
    assert out["pair"] == "x"  # a socketpair of its own still works
    assert out["tmp"] == []  # its own /tmp and /var/tmp: none of the node's files in them


def test_the_sockets_are_there_to_reach_without_the_sandbox(fleet: Fleet, servers: list[PeerServer]) -> None:
    """The attack works where nothing stops it (FLEET_SANDBOX=none): the test above tests the sandbox, not a typo."""
    start_service_worker(fleet, FLEET_SANDBOX="none")
    targets = [s.address if s.address[0] != "\0" else "@" + s.address[1:] for s in servers]
    fleet.cli("tune", str(dial_spec(fleet, "open", targets)), "--json")
    assert last_line(fleet, "open")["reached"] >= 2, last_line(fleet, "open")


def hog_spec(fleet: Fleet, name: str, run: str, build: str = "pass", **workload: object) -> Path:
    """A campaign of one trial whose build and run are these Python lines."""
    spec = {
        "name": name,
        "target": fleet.target,
        "problems": [{"kind": "hog", "params": {}}],
        "space": {"knobs": {"attempt": {"values": [1], "build": False}}},
        "workload": {
            "kind": "command",
            "build": ["python3", "-c", build],
            "run": ["python3", "-c", run],
            "objective": {"json": "t"},
            **workload,
        },
    }
    return write_spec(fleet.home, spec, f"{name}.json")


def peak_rss_kib(session: int) -> int:
    """The largest peak resident memory of the processes of ``session`` (a worker and its pool)."""
    peak = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == session:
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except (OSError, ValueError):
            continue
    return peak


def only_trial(fleet: Fleet, campaign: str) -> object:
    trials = fleet.store.trials(fleet.store.campaign(campaign).id)
    assert len(trials) == 1
    return trials[0]


BIG_LINE = """
import sys
for _ in range(1024):
    sys.stdout.write("x" * (1 << 20) + "\\n")
print('{"t": 1}')
"""


def test_nothing_a_workload_produces_takes_a_workers_memory_or_blames_its_node(fleet: Fleet) -> None:
    """Issue 44, item 6, on a real worker: 1 GiB on stdout took the evaluation process to 2 GB and ended "lost its
    worker 3 times"; a 1.5 GB artifact was read whole, built three times, then "lost"; a large string metric was
    stored whole; NaN in a metric ended "lost" after PostgreSQL refused it three times; a timeout of 1e12 was taken.
    Each is now its trial's own error, with its reason, once, on a healthy node whose memory stays small."""
    worker = start_service_worker(fleet)
    cases = {
        "stdout": (hog_spec(fleet, "stdout", BIG_LINE), "the run was killed: it printed more than 16 MiB"),
        "artifact": (
            hog_spec(fleet, "artifact", "print('{\"t\": 1}')", build="open('k', 'wb').truncate(1536 << 20)"),
            "the build's artifacts hold more than 256 MiB (FLEET_ARTIFACT_LIMIT)",
        ),
        "metric": (
            hog_spec(fleet, "metric", "import json; print(json.dumps({'t': 1, 's': 'x' * (1 << 20)}))"),
            "the run's JSON line holds 1 MiB of metrics; at most 16 KiB (FLEET_METRICS_BYTES)",
        ),
        "nan": (
            hog_spec(fleet, "nan", 'print(\'{"t": 1, "m": NaN, "n": Infinity}\')'),
            "the run's metric 'm' is nan: not a finite number, which is not stored",
        ),
    }
    for name, (spec, said) in cases.items():
        done = fleet.cli("tune", str(spec), "--json", timeout=240)
        trial = only_trial(fleet, name)
        assert trial.state == "errored" and said in (trial.reason or ""), (name, trial.reason, done.stderr[-2000:])
        assert trial.node_faults == 0 and trial.attempts <= 1, (name, trial.attempts, trial.node_faults)
    assert all(w.fault is None for w in fleet.store.workers(within=5)), "a workload's own fault made a node unhealthy"
    assert peak_rss_kib(worker.pid) < 400 << 10, peak_rss_kib(worker.pid)

    far = hog_spec(fleet, "far", "print('{\"t\": 1}')", build_timeout=1e12)
    done = fleet.cli("tune", str(far))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'build_timeout' must be a number of seconds, more than 0 and at most 86400" in done.stderr
