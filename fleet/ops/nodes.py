"""A test bed of nodes on one Linux machine: Fleet across machines that are apart, without a second machine.

Each node is a set of Linux namespaces of its own, made with ``ip netns`` and ``unshare`` (util-linux, iproute2):

- **network**: its own namespace ``<prefix>-<node>`` with one interface, ``eth0``, at its own address on a bridge.
  The bridge lives in a namespace of its own (``<prefix>-sw``), which is also the operator's seat (10.77.0.1): the
  place ``fab deploy``, ``ssh`` and ``fleet exec`` run from. Only the bed's own namespaces hold these addresses;
  nothing is added to the machine's own namespace (no link, address, route or rule), which other servers share.
- **UTS**: its own hostname (the node's name, or one name shared by every node, to show that Fleet tells nodes
  apart by ``FLEET_NODE_NAME`` rather than by host name).
- **mount**: its own ``/tmp`` and ``/run`` (tmpfs, lost when the node crashes, as on a reboot), its own ``/home``
  (kept across crashes), and an overlay on ``/etc``, so that the node account exists on that node only and keeps
  existing when the machine rewrites its own ``/etc/passwd``. The node account's Fleet home (``~/.fleet``: its
  artifact cache and its workloads' scratch) is a small filesystem of its own, an ext4 image in the node's folder
  loop-mounted there, so that the node's disk can fill (:meth:`Bed.fill`) without the machine's filling too.
- **PID**: its own PID namespace whose PID 1 is ``tini`` (Debian's package), which reaps orphans: with a plain
  ``sleep`` as PID 1, dead processes stay zombies that ``kill -0`` takes for live ones. Killing that PID 1 kills
  every process of the node at once: a node crash.
- its own ``sshd`` on port 22 of its address, letting in the node account with the bed's key.

A database node (``db``, 10.77.0.2) runs PostgreSQL and Redis on its address. Each also listens on a unix socket in
the bed's folder, so that a checker on the machine reads the database without crossing the bed's network (a
partition never hides the truth from the checker).

Partitions are ``nft`` rules inside a node's own network namespace (never in the machine's); a slow link is a
``tc`` token bucket on the node's ``eth0`` (this kernel has no ``netem``: no delay or loss). A node's wall clock
jumps (:meth:`Bed.jump`) for its Fleet processes, which run with a small preloaded library (``clockjump.c``, built
with the machine's C compiler when the bed comes up) that adds the seconds written in the node's ``clock`` file to
``CLOCK_REALTIME``: Linux's time namespaces offset only the monotonic and boot clocks.

A node that runs systemd cannot be one of these (tini is their PID 1): :meth:`Bed.wire` gives the bed a node of
network alone, on the bridge and in the ssh config, in whose namespace fleet/ops/nspawn.py boots a Debian root with
``systemd-nspawn`` (``fleet bench systemd``).

``scripts/nodes up N`` / ``down`` drive this module for people; ``tests/nodes.py`` wraps it as a pytest fixture.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.errors import FleetError

SUBNET = "10.77.0"  # a /24; the same in every bed, since each bed's addresses live in its own namespaces only
SWITCH_ADDRESS = f"{SUBNET}.1"  # the bridge, in the switch namespace: the operator's seat
DATABASE_ADDRESS = f"{SUBNET}.2"
POSTGRES_PORT = 5432
REDIS_PORT = 6379
ACCOUNT = "fleetbed"  # the node account, made on each node inside its overlay on /etc
NEMESIS_TABLE = "fleetbed_nemesis"  # the nft table a partition adds inside a node's namespace
DEFAULT_ROOT = Path("/var/tmp")  # not /tmp: each node mounts its own /tmp over the machine's
TOOLS = ("ip", "unshare", "nsenter", "tini", "nft", "tc", "sshd", "ssh-keygen", "mkfs.ext4", "cc")
# The size of each node's Fleet home filesystem: room for the bench's cache and scratch, little to fill.
FLEET_DISK_MB = 64
FILL_NAME = "nemesis-fill"  # the file that fills a node's Fleet home


class BedError(FleetError):
    """A bed that cannot be made here, or a node that does not answer."""


@dataclass
class Node:
    """One node of the bed: its name, address, folder, and the machine's pid of its PID 1 (tini) while it runs."""

    name: str
    address: str
    hostname: str
    directory: str
    pid: int | None = None
    database: bool = False
    login: str = ACCOUNT  # the account SSH logs in as (root on a systemd node: fleet/ops/nspawn.py)

    @property
    def home(self) -> Path:
        """The node account's home as the machine sees it (``/home/fleetbed`` on the node)."""
        return Path(self.directory) / "home" / ACCOUNT

    @property
    def disk(self) -> Path:
        """The image of the node's Fleet home filesystem (``/home/fleetbed/.fleet`` on the node)."""
        return Path(self.directory) / "fleet.img"

    @property
    def clock(self) -> Path:
        """The file whose seconds the node's Fleet processes add to the wall clock (``clockjump.c``)."""
        return Path(self.directory) / "clock"


@dataclass
class Bed:
    """A bed of nodes: ``Bed.create(...).up()``; ``down()`` removes every trace of it.

    Parameters
    ----------
    prefix:
        Names the bed's network namespaces (``<prefix>-sw``, ``<prefix>-node1``, ...): several beds can run at once.
    directory:
        The bed's folder on the machine: each node's disk (``/home``, ``/etc`` overlay), keys, logs, ``bed.json``.
    """

    prefix: str
    directory: str
    nodes: dict[str, Node] = field(default_factory=dict)
    started: float = 0.0

    # -- making and removing -------------------------------------------------------------------------------

    @classmethod
    def create(
        cls, count: int, *, prefix: str | None = None, root: Path = DEFAULT_ROOT, hostname: str | None = None
    ) -> Bed:
        """A bed of a database node and ``count`` nodes (``node1`` ...), not yet up.

        Parameters
        ----------
        hostname:
            One host name for every node (as a fleet cloned from one image has); default: each its own name.
        """
        prefix = prefix or f"fb{uuid.uuid4().hex[:6]}"
        directory = root / f"fleet-nodes-{prefix}"
        bed = cls(prefix, str(directory))
        names = ["db", *(f"node{i}" for i in range(1, count + 1))]
        for index, name in enumerate(names):
            address = DATABASE_ADDRESS if name == "db" else f"{SUBNET}.{10 + index}"
            bed.nodes[name] = Node(name, address, hostname or name, str(directory / name), database=name == "db")
        return bed

    @classmethod
    def load(cls, directory: Path) -> Bed:
        """The bed described by ``directory/bed.json`` (what ``scripts/nodes down`` reads)."""
        data = json.loads((directory / "bed.json").read_text())
        return cls(data["prefix"], data["directory"], {n["name"]: Node(**n) for n in data["nodes"]}, data["started"])

    def save(self) -> None:
        data = {"prefix": self.prefix, "directory": self.directory, "started": self.started}
        data["nodes"] = [asdict(node) for node in self.nodes.values()]
        (Path(self.directory) / "bed.json").write_text(json.dumps(data, indent=2))

    def up(self) -> Bed:
        """Make the switch, every node's namespaces and sshd, and the database node's servers."""
        check_host()
        self.started = time.time()
        folder = Path(self.directory)
        folder.mkdir(parents=True, exist_ok=False)
        folder.chmod(0o711)  # the postgres account and the node accounts pass through to their own folders
        self.save()  # written first, so that `scripts/nodes down` can remove a bed whose `up` failed halfway
        try:
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet-bed", "-f", str(self.key)])
            build_clock_library(self.clock_library)
            _run(["ip", "netns", "add", self.switch])
            self.ip(self.switch, "link", "add", "br0", "type", "bridge")
            self.ip(self.switch, "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
            self.ip(self.switch, "link", "set", "br0", "up")
            self.ip(self.switch, "link", "set", "lo", "up")
            for index, node in enumerate(self.nodes.values()):
                self._wire(node, index)
            # The database's servers (seconds: initdb) start while the other nodes boot.
            servers = self.start(self["db"], serve=False)
            for node in self.workers:
                self.start(node)
            self.wait_database(servers)
            self.write_ssh_config()
            self.migrate()
        except BaseException:
            self.down()
            raise
        return self

    def _wire(self, node: Node, index: int) -> None:
        """The node's network namespace, with ``eth0`` at its address, plugged into the bridge."""
        netns = self.netns(node)
        _run(["ip", "netns", "add", netns])
        # Both ends are made directly in their namespaces: no interface ever appears in the machine's own.
        _run(
            [
                "ip",
                "link",
                "add",
                "eth0",
                "netns",
                netns,
                "type",
                "veth",
                "peer",
                "name",
                f"p{index}",
                "netns",
                self.switch,
            ]
        )
        self.ip(self.switch, "link", "set", f"p{index}", "master", "br0", "up")
        self.ip(netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        self.ip(netns, "link", "set", "eth0", "up")
        self.ip(netns, "link", "set", "lo", "up")

    def wire(self, name: str, *, login: str = ACCOUNT) -> Node:
        """A node on the bridge that the bed does not boot: its network namespace at the next address, and its entry
        in the ssh config; what runs inside it is the caller's (a systemd-nspawn container: fleet/ops/nspawn.py).
        :meth:`down` removes it with the rest, killing whatever still runs in its namespace."""
        if name in self.nodes:
            raise BedError(f"the bed already has a node {name}")
        index = len(self.nodes)
        node = Node(name, f"{SUBNET}.{10 + index}", name, str(Path(self.directory) / name), login=login)
        Path(node.directory).mkdir()
        self.nodes[name] = node
        self.save()  # before the namespace, so that `scripts/nodes down` finds it
        self._wire(node, index)
        self.write_ssh_config()
        return node

    def down(self) -> None:
        """Kill every node's processes, remove the namespaces (their links and rules go with them) and the folder."""
        for node in self.nodes.values():
            self.crash(node)
        for netns in [*(self.netns(n) for n in self.nodes.values()), self.switch]:
            if not Path(f"/run/netns/{netns}").exists():
                continue
            # Whatever still runs in the namespace (a node whose pid bed.json lost, an nsenter waiting on its child)
            # would keep it alive after its name is gone.
            for pid in _run(["ip", "netns", "pids", netns], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run(["ip", "netns", "delete", netns], check=False)
        # The PostgreSQL and Redis folders belong to other accounts; the node folders hold nothing mounted on the
        # machine (every mount was made inside a node's own mount namespace, which died with its processes).
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- one node's life -----------------------------------------------------------------------------------

    def start(self, node: Node, timeout: float = 10, *, serve: bool = True) -> subprocess.Popen[str] | None:
        """Boot the node: its namespaces with tini as PID 1, its mounts, account and sshd (and servers for ``db``).

        Used again after :meth:`crash`: the node's disk (``/home``, ``/etc``, the database's data) is kept."""
        disk = Path(node.directory)
        for sub in ("etc/upper", "etc/work", "home", "log"):
            (disk / sub).mkdir(parents=True, exist_ok=True)
        if not (disk / "ssh_host_ed25519_key").exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(disk / "ssh_host_ed25519_key")])
        fleet_disk = "" if node.database else self._fleet_disk(node)
        (disk / "sshd_config").write_text(
            f"ListenAddress {node.address}:22\nHostKey {disk / 'ssh_host_ed25519_key'}\nPidFile /run/sshd.pid\n"
            f"AllowUsers {ACCOUNT}\nAuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin no\nUsePAM no\nSubsystem sftp internal-sftp\n"
            "LogLevel ERROR\n"
        )
        # Everything below runs inside the node's fresh mount namespace, before tini becomes its PID 1. The mounts
        # die with the namespace: none is ever seen by the machine.
        boot = (
            "set -e\n"
            "mount -t tmpfs -o mode=1777 tmpfs /tmp\n"
            "mount -t tmpfs -o mode=0755 tmpfs /run\n"
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={disk}/etc/upper,workdir={disk}/etc/work /etc\n"
            f"mount --bind {disk}/home /home\n"
            f"hostname {node.hostname}\n"
            "mkdir -p /run/sshd\n"
            f"id -u {ACCOUNT} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {ACCOUNT}\n"
            f"usermod --password '*' {ACCOUNT}\n"  # useradd's "!" is a locked account, which sshd refuses
            f"install -d -m 700 -o {ACCOUNT} -g {ACCOUNT} /home/{ACCOUNT}/.ssh\n"
            f"install -m 600 -o {ACCOUNT} -g {ACCOUNT} {self.key}.pub /home/{ACCOUNT}/.ssh/authorized_keys\n"
            f"{fleet_disk}"
            f"/usr/sbin/sshd -f {disk}/sshd_config -E {disk}/log/sshd.log\n"
            "exec tini -- sleep infinity\n"
        )
        log = (disk / "log" / "boot.log").open("ab")
        launcher = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(node), "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
             "--propagation", "private", "sh", "-c", boot],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        node.pid = self._init_pid(launcher, node, timeout)
        self.save()
        self._wait_listening(node, 22, timeout)
        if not node.database:
            return None
        servers = self.serve_database(node)
        if serve:
            self.wait_database(servers, timeout)
        return servers

    def _fleet_disk(self, node: Node) -> str:
        """The boot script's lines that mount the node's Fleet home filesystem, its image made on the first boot.

        The image's loop device is freed once the node's mount namespace dies (``mount -o loop`` asks for that); a
        node booted again waits for it, so that one image is never mounted twice at once."""
        if not node.disk.exists():
            with node.disk.open("wb") as image:
                image.truncate(FLEET_DISK_MB << 20)
            # No blocks kept for root (-m 0): the node account fills it to the last block, as the nemesis does.
            _run(["mkfs.ext4", "-q", "-m", "0", "-b", "4096", "-F", str(node.disk)])
        if not node.clock.exists():
            node.clock.write_text("0\n")
        deadline = time.monotonic() + 10
        while _run(["losetup", "--associated", str(node.disk)], check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise BedError(f"node {node.name}'s disk {node.disk} is still mounted by its last boot")
            time.sleep(0.05)
        home = f"/home/{ACCOUNT}/.fleet"
        return (
            f"install -d -o {ACCOUNT} -g {ACCOUNT} {home}\n"
            f"mount -o loop,nosuid,nodev {node.disk} {home}\n"
            f"chown {ACCOUNT}:{ACCOUNT} {home}\n"
        )

    def _init_pid(self, launcher: subprocess.Popen[bytes], node: Node, timeout: float) -> int:
        """The machine's pid of the node's PID 1 once it is tini (the boot script has finished)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if launcher.poll() is not None:
                raise BedError(f"node {node.name} did not boot: {_tail(Path(node.directory) / 'log' / 'boot.log')}")
            for child in _children(launcher.pid):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == "tini":
                        return child
            time.sleep(0.02)
        raise BedError(f"node {node.name} did not boot in {timeout:g} s")

    def _wait_listening(self, node: Node, port: int, timeout: float) -> None:
        """Wait until something on the node listens on ``port`` (``ss`` inside its namespace)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = _run(["ip", "netns", "exec", self.netns(node), "ss", "-Hltn", f"sport = :{port}"], check=False)
            if done.stdout.strip():
                return
            time.sleep(0.05)
        raise BedError(f"nothing listens on {node.name}:{port} after {timeout:g} s")

    def crash(self, node: Node) -> None:
        """Kill the node's PID 1: the kernel kills every process of its PID namespace at once, as a power cut.

        Its mounts (``/tmp``, ``/run``) go too; its disk stays for :meth:`start`."""
        if node.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(node.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        node.pid = None
        self.save()

    def serve_database(self, node: Node) -> subprocess.Popen[str] | None:
        """Start PostgreSQL and Redis on the database node, as root there (PostgreSQL drops to ``postgres``)."""
        code = f"from fleet.ops.nodes import _serve_database; _serve_database({node.directory!r}, {node.address!r})"
        return subprocess.Popen(
            [*self.enter(node, None), sys.executable, "-c", code],
            env=self.node_env(node),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @staticmethod
    def wait_database(servers: subprocess.Popen[str] | None, timeout: float = 60) -> None:
        """Wait for :meth:`serve_database` to have both servers answering."""
        if servers is None:
            return
        out, _ = servers.communicate(timeout=timeout + 30)
        if servers.returncode != 0:
            raise BedError(f"the database node's servers did not start:\n{out}")

    def migrate(self) -> None:
        """Make Fleet's tables in the bed's database (from the machine, through the unix socket)."""
        from fleet.store import Store

        store = Store(self.database_url)
        try:
            store.upgrade()
        finally:
            store.close()

    # -- running things on nodes ---------------------------------------------------------------------------

    def enter(self, node: Node, user: str | None = ACCOUNT) -> list[str]:
        """The argv prefix that runs a command inside ``node`` (all its namespaces), as ``user`` (None: root)."""
        if node.pid is None:
            raise BedError(f"node {node.name} is down")
        argv = ["nsenter", "-t", str(node.pid), "--net", "--uts", "--mount", "--pid", "--ipc"]
        if user is not None:
            account = self.account(node)
            # nsenter's own --wd would open the folder before entering the node's mount namespace, where it is not.
            argv += [
                "--setgid",
                str(account.pw_gid),
                "--setuid",
                str(account.pw_uid),
                "--",
                "env",
                "-C",
                account.pw_dir,
            ]
            return argv
        return [*argv, "--"]

    def account(self, node: Node) -> pwd.struct_passwd:
        """The node account as the node's own ``/etc/passwd`` has it (the machine's has no such account)."""
        for line in (Path(node.directory) / "etc" / "upper" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == ACCOUNT:
                uid, gid = int(fields[2]), int(fields[3])
                return pwd.struct_passwd((ACCOUNT, "*", uid, gid, "", fields[5], fields[6]))
        raise BedError(f"node {node.name} has no account {ACCOUNT}")

    def node_env(self, node: Node, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a Fleet process on ``node`` gets: the bed's database and broker, the node's own name, and
        (but on the database node, whose clock is the one leases run on) the node's own wall clock."""
        home = f"/home/{ACCOUNT}"
        clock = {} if node.database else {"LD_PRELOAD": str(self.clock_library), "FLEET_CLOCK_FILE": str(node.clock)}
        return {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": home,
            "USER": ACCOUNT,
            "LANG": "C.UTF-8",
            "FLEET_HOME": f"{home}/.fleet",
            "FLEET_NODE_NAME": node.name,
            "FLEET_DATABASE_URL": f"postgresql+psycopg2://fleet@{DATABASE_ADDRESS}:{POSTGRES_PORT}/fleet",
            "FLEET_BROKER_URL": f"redis://{DATABASE_ADDRESS}:{REDIS_PORT}/0",
            "PYTHONUNBUFFERED": "1",
            **clock,
            **(extra or {}),
        }

    def run(
        self, node: Node, argv: Sequence[str], *, user: str | None = ACCOUNT, env: Mapping[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``argv`` on ``node`` and wait for it."""
        return subprocess.run(
            [*self.enter(node, user), *argv],
            env=dict(env) if env is not None else self.node_env(node),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def spawn(
        self, node: Node, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
        user: str | None = ACCOUNT,
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        """Start ``argv`` on ``node`` in a process group of its own, its output appended to ``log``."""
        with log.open("ab") as out:
            return subprocess.Popen(
                [*self.enter(node, user), *argv],
                env=dict(env) if env is not None else self.node_env(node),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    # -- the nemesis's tools -------------------------------------------------------------------------------

    def cut(self, node: Node, peers: Iterable[tuple[str, int | None]] = ()) -> None:
        """Drop the node's traffic to and from each ``(address, port)`` (port None: every port); no peers: all.

        Dropped, not refused: as on a dead link, a connection hangs until its own timeouts give up."""
        rules = [
            f"ip daddr {address} tcp dport {port} drop" if port else f"ip daddr {address} drop"
            for address, port in peers
        ]
        back = [
            f"ip saddr {address} tcp sport {port} drop" if port else f"ip saddr {address} drop"
            for address, port in peers
        ]
        rules, back = (rules, back) if rules else (['oifname "eth0" drop'], ['iifname "eth0" drop'])
        script = (
            f"table inet {NEMESIS_TABLE} {{\n"
            f"  chain out {{ type filter hook output priority 0; {'; '.join(rules)}; }}\n"
            f"  chain in {{ type filter hook input priority 0; {'; '.join(back)}; }}\n"
            "}\n"
        )
        self.heal(node)
        _run(["ip", "netns", "exec", self.netns(node), "nft", "-f", "-"], input=script)

    def heal(self, node: Node) -> None:
        """Remove every partition rule and slow link of the node, set its clock right and empty its filled disk."""
        netns = self.netns(node)
        _run(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", NEMESIS_TABLE], check=False)
        _run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        if not node.database:
            self.jump(node, 0)
            if node.pid is not None:
                with contextlib.suppress(FileNotFoundError):
                    (self.fleet_home(node) / FILL_NAME).unlink()

    def fill(self, node: Node) -> int:
        """Fill the node's Fleet home filesystem: one file written until the disk says ENOSPC; its bytes."""
        written, zeros = 0, bytes(1 << 20)
        fd = os.open(self.fleet_home(node) / FILL_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while True:
                before, chunk = written, len(zeros)
                while chunk:  # the last blocks in ever smaller writes, to the very last byte
                    try:
                        written += os.write(fd, zeros[:chunk])
                    except OSError as error:
                        if error.errno != errno.ENOSPC:
                            raise
                        chunk //= 2
                # ext4 says ENOSPC while it still holds blocks back for the file's unwritten extents: once they are
                # written out it frees the rest, which the next pass takes, until a pass gets nothing more.
                os.fsync(fd)
                if written == before:
                    return written
        finally:
            os.close(fd)

    def jump(self, node: Node, seconds: float) -> None:
        """Set the node's wall clock ``seconds`` off the machine's (0: right), for its Fleet processes at once."""
        node.clock.write_text(f"{seconds:g}\n")

    def fleet_home(self, node: Node) -> Path:
        """The node account's Fleet home, its own filesystem, as the machine reaches it: through the node's root."""
        if node.pid is None:
            raise BedError(f"node {node.name} is down")
        return Path(f"/proc/{node.pid}/root/home/{ACCOUNT}/.fleet")

    def slow(self, node: Node, rate: str = "1mbit") -> None:
        """Slow the node's outgoing link to ``rate`` with a token bucket (no ``netem`` here: no delay or loss)."""
        _run(["ip", "netns", "exec", self.netns(node), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
              "rate", rate, "burst", "32kbit", "latency", "400ms"])  # fmt: skip

    def rules(self, node: Node) -> str:
        """The node's nft ruleset (empty once healed)."""
        return _run(["ip", "netns", "exec", self.netns(node), "nft", "list", "ruleset"]).stdout

    # -- names and addresses -------------------------------------------------------------------------------

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def netns(self, node: Node) -> str:
        return f"{self.prefix}-{node.name}"

    def netns_path(self, node: Node) -> Path:
        """The file ``ip netns`` keeps the node's network namespace by (what ``nsenter --net=`` and nspawn take)."""
        return Path("/run/netns") / self.netns(node)

    @property
    def key(self) -> Path:
        return Path(self.directory) / "id_ed25519"

    @property
    def clock_library(self) -> Path:
        return Path(self.directory) / "clockjump.so"

    @property
    def ssh_config(self) -> Path:
        return Path(self.directory) / "ssh_config"

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    @property
    def workers(self) -> list[Node]:
        """Every node but the database's."""
        return [node for node in self.nodes.values() if not node.database]

    def ip(self, netns: str, *args: str) -> None:
        _run(["ip", "-n", netns, *args])

    def at_switch(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` at the operator's seat (the switch namespace), where nodes are reachable."""
        return ["ip", "netns", "exec", self.switch, *argv]

    def write_ssh_config(self) -> None:
        """An ssh config naming the nodes, as an operator's ``~/.ssh/config`` would (Fabric and ``fleet exec`` read)."""
        self.ssh_config.write_text(
            "".join(
                f"Host {n.name}\n  HostName {n.address}\n  User {n.login}\n  IdentityFile {self.key}\n"
                "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                for n in self.workers
            )
        )

    @property
    def database_url(self) -> str:
        """The bed's database as the machine reaches it: PostgreSQL's unix socket in the database node's folder."""
        return f"postgresql+psycopg2://fleet@/fleet?host={self['db'].directory}/postgres&port={POSTGRES_PORT}"

    @property
    def broker_url(self) -> str:
        """The bed's Redis as the machine reaches it: its unix socket."""
        return f"redis+socket://{self['db'].directory}/redis/redis.sock?virtual_host=0"


def _serve_database(directory: str, address: str) -> None:
    """On the database node: PostgreSQL and Redis on the node's address (and unix sockets in its folder)."""
    from fleet.services import PostgresServer, RedisServer

    postgres = PostgresServer(
        Path(directory) / "postgres", port=POSTGRES_PORT, clients=f"{SUBNET}.0/24", synced_init=False
    )
    postgres.settings["listen_addresses"] = address
    postgres.start()
    redis_dir = Path(directory) / "redis"
    redis_dir.mkdir(exist_ok=True)
    settings = {"bind": f"127.0.0.1 {address}", "protected-mode": "no", "unixsocket": str(redis_dir / "redis.sock")}
    RedisServer(redis_dir, port=REDIS_PORT, settings=settings).start()
    # Both keep running under the node's tini once this process exits: their Popen objects are simply dropped.


def build_clock_library(path: Path) -> Path:
    """Build ``clockjump.c`` at ``path`` with the machine's C compiler: preloaded with ``FLEET_CLOCK_FILE`` naming a
    file of seconds, it moves a process's wall clock by them, at once."""
    _run(["cc", "-O2", "-shared", "-fPIC", "-o", str(path), str(Path(__file__).with_name("clockjump.c")), "-ldl"])
    return path


def check_host() -> None:
    """Refuse, in one line, where a bed cannot be made: not root, a tool missing, or no namespaces."""
    if os.geteuid() != 0:
        raise BedError("nodes: making network, mount and PID namespaces needs root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]
    if missing:
        raise BedError(f"nodes: {', '.join(missing)} missing (scripts/install-services installs them)")
    if not Path("/dev/loop-control").exists():
        raise BedError("nodes: this machine has no loop devices (each node's Fleet home is a filesystem of its own)")
    probe = _run(["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "true"], check=False)
    if probe.returncode != 0:
        raise BedError(f"nodes: this machine cannot make namespaces ({probe.stderr.strip() or 'unshare failed'})")


def _run(argv: Sequence[str], *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, input=input, check=False, timeout=60)
    if check and done.returncode != 0:
        raise BedError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _tail(path: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return "(no log)"


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/nodes up N [--prefix P]`` / ``scripts/nodes down [--prefix P]`` / ``scripts/nodes status``."""
    import argparse

    parser = argparse.ArgumentParser(prog="scripts/nodes", description="A test bed of Fleet nodes on this machine.")
    parser.add_argument("--prefix", default="fleetbed", help="names the bed's namespaces and folder")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the bed's folder goes")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="a database node and N nodes")
    up.add_argument("count", type=int)
    up.add_argument("--hostname", help="one host name for every node")
    commands.add_parser("down", help="remove the bed, leaving nothing behind")
    commands.add_parser("status", help="the bed's nodes and whether each runs")
    args = parser.parse_args(argv)
    folder = args.root / f"fleet-nodes-{args.prefix}"
    try:
        if args.command == "up":
            begun = time.monotonic()
            bed = Bed.create(args.count, prefix=args.prefix, root=args.root, hostname=args.hostname).up()
            print(f"nodes: {len(bed.nodes)} nodes up in {time.monotonic() - begun:.1f} s ({bed.directory})")
            _print_status(bed)
        elif not (folder / "bed.json").exists():
            print(f"nodes: no bed {args.prefix} here")
        elif args.command == "down":
            begun = time.monotonic()
            Bed.load(folder).down()
            print(f"nodes: bed {args.prefix} down in {time.monotonic() - begun:.1f} s")
        else:
            _print_status(Bed.load(folder))
    except BedError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _print_status(bed: Bed) -> None:
    for node in bed.nodes.values():
        state = "up" if node.pid and _alive(node.pid) else "down"
        print(f"  {node.name:<8} {node.address:<12} {state:<5} ip netns exec {bed.netns(node)} ...")
    print(f"  operator's seat: ip netns exec {bed.switch} ssh -F {bed.ssh_config} node1")
    print(f"  database (from this machine): {bed.database_url}")


if __name__ == "__main__":
    sys.exit(main())
