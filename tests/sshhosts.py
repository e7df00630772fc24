"""Real SSH hosts on this machine for the deployment and ``fleet exec`` tests.

Each host is its own ``sshd`` on a loopback address (127.0.0.2, 127.0.0.3, ...) that lets in one user of
its own (created with ``useradd``, so the tests run as root) with one key of its own. An SSH config file
names the hosts (``fleetnode1`` ...), as a user's ``~/.ssh/config`` would; Fabric and ``fleet exec`` read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")


@dataclass
class SshHost:
    """One SSH host: its name in the config, address, port, login user and key."""

    name: str
    address: str
    port: int
    user: str
    key: Path
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    def start(self) -> None:
        log = (self.directory / "sshd.log").open("ab")
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(self.directory / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"sshd for {self.name} exited: {(self.directory / 'sshd.log').read_text()}")
            with contextlib.suppress(OSError), socket.create_connection((self.address, self.port), timeout=0.5):
                return
            time.sleep(0.05)
        raise AssertionError(f"sshd for {self.name} did not listen on {self.address}:{self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on the host through the system's ssh client, as the host's user."""
        return subprocess.run(
            ["ssh", "-F", str(self.directory.parent / "ssh_config"), self.name, command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _ensure_user(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
    # useradd leaves the account locked ("!"), which sshd refuses without PAM; "*" is no password, unlocked.
    subprocess.run(["usermod", "--password", "*", user], check=True)


class SshHosts:
    """``count`` SSH hosts with their config file; ``start()`` and ``stop()`` them all."""

    def __init__(self, count: int, prefix: str = "fleetnode") -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="fleet-ssh-"))
        self.config = self.directory / "ssh_config"
        self.hosts: list[SshHost] = []
        host_key = self.directory / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for index in range(1, count + 1):
            name, address = f"{prefix}{index}", f"127.0.0.{index + 1}"
            directory = self.directory / name
            directory.mkdir()
            key = directory / "id_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            _ensure_user(name)
            host = SshHost(name, address, _free_port(address), name, key, directory)
            self._authorize(host)
            (directory / "sshd_config").write_text(
                f"ListenAddress {address}:{host.port}\n"
                f"HostKey {host_key}\n"
                f"PidFile {directory / 'sshd.pid'}\n"
                f"AllowUsers {name}\n"
                "AuthorizedKeysFile .ssh/authorized_keys\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "PermitRootLogin no\n"
                "UsePAM no\n"
                "StrictModes yes\n"
                "Subsystem sftp internal-sftp\n"
                "LogLevel ERROR\n"
            )
            self.hosts.append(host)
        self.config.write_text(
            "".join(
                f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n  User {h.user}\n  IdentityFile {h.key}\n"
                "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
                for h in self.hosts
            )
        )

    @staticmethod
    def _authorize(host: SshHost) -> None:
        account = pwd.getpwnam(host.user)
        ssh_dir = Path(account.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        keys = ssh_dir / "authorized_keys"
        keys.write_text((host.key.with_suffix(".pub")).read_text())
        keys.chmod(0o600)
        for path in (ssh_dir, keys):
            os.chown(path, account.pw_uid, account.pw_gid)

    def clean_homes(self) -> None:
        """Remove what an earlier run deployed into the users' homes (Fleet lives in ~/fleet).

        A launcher or driver an interrupted run left behind is stopped first, by the pid its deploy recorded.
        """
        for host in self.hosts:
            for pid_file in (host.home / "fleet" / "run").glob("*.pid"):
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pid_file.read_text().strip())
                    # Only if that pid is still the host user's process, not a stranger that reused it.
                    if Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam(host.user).pw_uid:
                        os.kill(pid, signal.SIGKILL)
            shutil.rmtree(host.home / "fleet", ignore_errors=True)

    def start(self) -> SshHosts:
        for host in self.hosts:
            host.start()
        return self

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __getitem__(self, name: str) -> SshHost:
        return next(h for h in self.hosts if h.name == name)


LOCK = Path(tempfile.gettempdir()) / "fleet-test-ssh-hosts.lock"
"""Held while a test module has the SSH hosts: their accounts (fleetnode1, ...) are the machine's, so test
processes running side by side (``make test`` runs pytest-xdist) take turns with them."""


@pytest.fixture(scope="module")
def ssh_hosts() -> Iterator[SshHosts]:
    """Three SSH hosts for the module, which has them alone."""
    assert SSHD.exists(), "run scripts/install-services (Debian's openssh-server)"
    assert os.geteuid() == 0, "the SSH hosts' users are created with useradd, which needs root"
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hosts = SshHosts(3).start()
        try:
            yield hosts
        finally:
            hosts.stop()
