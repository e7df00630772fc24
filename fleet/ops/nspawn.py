"""A node of the test bed (fleet/ops/nodes.py) that boots systemd: a Debian root run by ``systemd-nspawn -b``.

The bed's own nodes run ``tini`` as their PID 1, so they cannot show that ``fab deploy``'s systemd path (units, the
``fleet`` system user, the URLs as systemd credentials) works. This node runs systemd, booted by ``systemd-nspawn``
inside a network namespace the bed wired to its bridge (:meth:`fleet.ops.nodes.Bed.wire`), with Debian's ``sshd``
letting ``root`` in with the bed's key: what ``fab deploy`` takes for a systemd node.

The root is made once by ``debootstrap`` (minutes) and kept in a cache folder, rebuilt only when it is missing or
its :class:`Recipe` changed. A boot never writes to it: ``--volatile=overlay`` puts a tmpfs over it, so whatever
the deploy installs is gone at the poweroff, and one cached root serves every run. The container's mounts live in
nspawn's own mount namespace and its processes in its own PID namespace: nothing is left on the machine once it
has powered off and the bed is down.

Needs root and the Debian packages ``debootstrap`` and ``systemd-container``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.ops.nodes import Bed, BedError, Node

# Each tool, and the Debian package that has it: what a refusal names.
TOOLS = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container"}
RECIPE_FILE = "recipe.json"  # beside the root, written once the root is whole


@dataclass(frozen=True)
class Recipe:
    """What the root is made of: a change to any field makes a new root (the old one is removed).

    Parameters
    ----------
    suite:
        The Debian release ``debootstrap`` installs; its ``python3`` is the node's Python.
    packages:
        Installed on top of ``minbase``: systemd as PID 1, its bus, sshd, the Python ``fab deploy`` needs, and the
        workloads' sandbox (bubblewrap), without which a worker refuses to start.
    setup:
        Shell run in the finished root (``chroot``): root's ``.ssh`` folder, which a boot binds the bed's key into.
    """

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "bubblewrap",
    )  # fmt: skip
    mirror: str = "http://deb.debian.org/debian"
    setup: str = "install -d -m 700 /root/.ssh && : > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/*"

    def record(self) -> dict[str, object]:
        """The recipe as its file beside the root has it."""
        return asdict(self) | {"packages": list(self.packages)}

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The root's folder in the cache: ``debian-bookworm-<digest>``."""
        return f"debian-{self.suite}-{self.digest}"

    def debootstrap(self, target: Path) -> list[str]:
        return ["debootstrap", f"--variant={self.variant}", f"--include={','.join(self.packages)}", self.suite,
                str(target), self.mirror]  # fmt: skip


def default_cache() -> Path:
    """Where roots are kept between runs: ``nspawn`` in Fleet's home (``FLEET_HOME``, else ``~/.fleet``)."""
    return Path(os.environ.get("FLEET_HOME") or Path.home() / ".fleet") / "nspawn"


def is_built(folder: Path, recipe: Recipe) -> bool:
    """Whether ``folder`` holds a whole root made by ``recipe`` (its recipe file is written last)."""
    try:
        return bool(json.loads((folder / RECIPE_FILE).read_text()) == recipe.record())
    except (OSError, ValueError):
        return False


def ensure_root(cache: Path, recipe: Recipe = Recipe(), say: Callable[[str], None] = print) -> tuple[Path, bool]:
    """The root made by ``recipe`` in ``cache``, built there unless it already is; and whether it was built.

    Two runs at once take turns (a lock in ``cache``); a build cut short leaves no recipe file, so the next run
    builds again, removing the remains first.
    """
    folder = cache / recipe.name
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(folder, recipe):
            return folder / "root", False
        for stale in [folder, *(p for p in cache.glob("debian-*") if p.name != recipe.name)]:
            shutil.rmtree(stale, ignore_errors=True)  # an unfinished build, or roots of older recipes
        say(f"building the node's root with debootstrap ({recipe.suite}, {recipe.variant}) in {folder}")
        root = folder / "root"
        root.mkdir(parents=True)
        done = subprocess.run(recipe.debootstrap(root), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            (folder / "debootstrap.log").write_text(done.stdout + done.stderr)
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise BedError(f"debootstrap failed (log in {folder / 'debootstrap.log'}): {tail}")
        subprocess.run(["chroot", str(root), "sh", "-c", recipe.setup], check=True, capture_output=True)
        (folder / RECIPE_FILE).write_text(json.dumps(recipe.record(), indent=2) + "\n")
        return root, True


def check_tools() -> None:
    """Refuse, in one line, where a systemd node cannot boot: not root, or a tool missing (and its package)."""
    if os.geteuid() != 0:
        raise BedError("systemd node: debootstrap and systemd-nspawn need root")
    missing = [f"{tool} (apt-get install {package})" for tool, package in TOOLS.items() if not _which(tool)]
    if missing:
        raise BedError(f"systemd node: {', '.join(missing)} missing")


def _which(tool: str) -> bool:
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).exists()


def nspawn_argv(root: Path, node: Node, netns: Path, key: Path) -> list[str]:
    """``systemd-nspawn`` booting ``root`` as ``node``: in the node's network namespace, under its host name, the
    root left as it is (a tmpfs overlay takes every write), the bed's public ``key`` letting root in over SSH.

    ``--register=no`` and ``--keep-unit``: the machine has no systemd (nor machined) to register with or to ask
    for a scope of its own."""
    return [
        "systemd-nspawn",
        "--quiet",
        f"--directory={root}",
        "--boot",
        f"--machine={node.name}",
        f"--hostname={node.hostname}",
        f"--network-namespace-path={netns}",
        "--volatile=overlay",
        f"--bind-ro={key}:/root/.ssh/authorized_keys",
        # systemd sets the host name from /etc/hostname once booted, over nspawn's: the root's is the machine's.
        f"--bind-ro={Path(node.directory) / 'hostname'}:/etc/hostname",
        "--register=no",
        "--keep-unit",
        "--console=read-only",
    ]


@dataclass
class SystemdNode:
    """One systemd-nspawn container as a node of ``bed``: :meth:`boot`, :meth:`poweroff`, :meth:`kill`."""

    bed: Bed
    node: Node
    root: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        """The container's console: systemd's boot and shutdown messages."""
        return Path(self.node.directory) / "console.log"

    def boot(self, timeout: float = 120) -> None:
        """Start the container and wait until systemd says the boot is over (``running``, or ``degraded``)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        (Path(self.node.directory) / "hostname").write_text(self.node.hostname + "\n")
        argv = nspawn_argv(self.root, self.node, self.bed.netns_path(self.node), self.bed.key.with_suffix(".pub"))
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BedError(f"systemd node {self.node.name} exited while booting: {self.console_tail()}")
            state = self.ssh("systemctl is-system-running --wait", timeout=max(1, deadline - time.monotonic()))
            # Booted: running (exit status 0), or degraded, where a unit of no use here failed (a getty, say).
            if state.returncode == 0 or state.stdout.strip() == "degraded":
                return
            time.sleep(0.2)
        raise BedError(f"systemd node {self.node.name} did not boot in {timeout:g} s: {self.console_tail()}")

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``command`` run as root on the node, over SSH from the operator's seat."""
        argv = ["ssh", "-F", str(self.bed.ssh_config), "-o", "ConnectTimeout=2", self.node.name, command]
        try:
            return subprocess.run(
                self.bed.at_switch(argv), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", "timed out")

    def poweroff(self, timeout: float = 60) -> int:
        """Shut the node down as an operator does (``systemctl poweroff`` over SSH); the container's exit status.

        Where SSH no longer answers, SIGRTMIN+4 to systemd-nspawn's container asks for the same (systemd's
        poweroff signal)."""
        assert self.process is not None
        if self.ssh("systemctl poweroff", timeout=15).returncode not in (0, 255):  # 255: the link went first
            self._signal_init(signal.SIGRTMIN + 4)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise BedError(f"systemd node {self.node.name} still runs {timeout:g} s after its poweroff") from None

    def kill(self) -> None:
        """Kill systemd-nspawn and the container at once (a failed run's teardown); nothing if it has exited."""
        if self.process is None or self.process.poll() is not None:
            return
        self._signal_init(signal.SIGKILL)  # the container's PID 1: its whole PID namespace dies with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def _signal_init(self, sig: int) -> None:
        """Signal the container's PID 1 (systemd), systemd-nspawn's child."""
        assert self.process is not None
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split():
                os.kill(int(child), sig)

    def console_tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        return "(no console log)"
