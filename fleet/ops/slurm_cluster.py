"""A real Slurm cluster on this machine, for the ``fleet slurm`` tests and benchmarks: Debian's ``munged``,
``slurmctld`` and one ``slurmd`` per node (``slurmd -N``), started in the foreground without systemd, up in about a
second. It needs root (the daemons run as root, and the fake GPUs are made with ``mknod``) and the daemons
``scripts/install-services`` installs.

Each node has fake GPUs: GRES entries whose ``File=`` are character devices made with ``mknod`` (NVIDIA's major
number), which Slurm allocates and announces (``CUDA_VISIBLE_DEVICES``, ``SLURM_JOB_GPUS``) as it would real ones.
There is no accounting database (no ``slurmdbd``, so no ``sacct``): each job that ends is written to a job completion
log instead (``jobcomp/filetxt``), with its state (``COMPLETED``, ``TIMEOUT``, ...), which :meth:`ended_jobs` reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.ops.slurm import SlurmError

DAEMONS = (Path("/usr/sbin/munged"), Path("/usr/sbin/slurmctld"), Path("/usr/sbin/slurmd"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SlurmCluster:
    """A running cluster: its folder, its ``SLURM_CONF``, its node names and the daemons started."""

    directory: Path
    nodes: list[str]
    gpus_per_node: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        """The output of one of Slurm's commands run against this cluster; :class:`SlurmError` when it fails."""
        try:
            done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv)} did not answer within 30 s (logs: {self.directory / 'log'})") from None
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def allocation(self, job: str) -> dict[str, set[int]]:
        """The GPU indices ``job`` was given on each of its nodes, from ``scontrol show job -d``."""
        given: dict[str, set[int]] = {}
        for line in self.run("scontrol", "show", "job", "-d", job).splitlines():
            line = line.strip()
            if line.startswith("Nodes=") and "IDX:" in line:
                node = line.split()[0].removeprefix("Nodes=")
                indices = line.split("IDX:")[1].split(")")[0]
                for part in indices.split(","):
                    low, _, high = part.partition("-")
                    given.setdefault(node, set()).update(range(int(low), int(high or low) + 1))
        return given

    @property
    def job_log(self) -> Path:
        """Slurm's job completion log: a line per job that ended."""
        return self.directory / "log" / "jobcomp.txt"

    def ended_jobs(self) -> list[dict[str, str]]:
        """The jobs that ended, in the order they ended: each line of the job completion log as its fields
        (``JobId``, ``JobState``, ``StartTime``, ``EndTime``, ``NodeList``, ...)."""
        try:
            text = self.job_log.read_text()
        except FileNotFoundError:
            return []
        # Whole lines only: the last may be half written as it is read.
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.split("\n")[:-1] if line.strip()]

    def live_jobs(self) -> list[str]:
        """The ids of the jobs squeue shows: pending, running or completing."""
        return self.run("squeue", "--noheader", "--format=%i").split()

    def start(self) -> SlurmCluster:
        """Write the configuration, make the fake GPUs, start the daemons and wait for every node to be idle."""
        d = self.directory
        for name in ("state", "spool", "log", "dev", "munge"):
            (d / name).mkdir(parents=True, exist_ok=True)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        host = socket.gethostname().split(".")[0]
        gres = []
        node_lines = []
        for n, node in enumerate(self.nodes):
            files = []
            for i in range(self.gpus_per_node):
                device = d / "dev" / f"nvidia{n * self.gpus_per_node + i}"
                os.mknod(device, 0o600 | 0o020000, os.makedev(195, n * self.gpus_per_node + i))  # S_IFCHR
                files.append(str(device))
            gres += [f"NodeName={node} Name=gpu File={file}" for file in files]
            node_lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=2 "
                f"RealMemory=1000 Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            )
        (d / "gres.conf").write_text("\n".join(gres) + "\n")
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=fleettest",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"SlurmctldPort={_free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={d / 'munge' / 'sock'}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool'}/%n",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd'}.%n.pid",
                    f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'log'}/slurmd.%n.log",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "GresTypes=gpu",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={self.job_log}",
                    "KillWait=5",
                    "MinJobAge=300",
                    *node_lines,
                    "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        munge = d / "munge"
        self._spawn(
            "/usr/sbin/munged", "--foreground", "--force", f"--key-file={munge / 'munge.key'}",
            f"--socket={munge / 'sock'}", f"--pid-file={munge / 'pid'}", f"--log-file={munge / 'log'}",
            f"--seed-file={munge / 'seed'}",
        )  # fmt: skip
        self._wait(lambda: (munge / "sock").exists(), "munged's socket")
        self._spawn("/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf))
        for node in self.nodes:
            self._spawn("/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf))
        self._wait(self._idle, "the nodes to be idle")
        return self

    def _idle(self) -> bool:
        try:
            states = self.run("sinfo", "--noheader", "--Node", "--format=%T").split()
        except SlurmError:
            return False
        return len(states) == len(self.nodes) and all(state == "idle" for state in states)

    def _spawn(self, *argv: str) -> None:
        log = (self.directory / "log" / f"{Path(argv[0]).name}.out").open("ab")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}))

    def _wait(self, condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            for proc in self.procs:
                if proc.poll() is not None:
                    name = str(proc.args[0]) if isinstance(proc.args, list | tuple) else repr(proc.args)
                    raise SlurmError(f"{name} exited {proc.returncode} (logs: {self.directory / 'log'})")
            time.sleep(0.1)
        raise SlurmError(f"timed out waiting for {what} (logs: {self.directory / 'log'})")

    def stop(self) -> None:
        """Cancel what runs, then stop the daemons, slurmd first: their own processes, by their ids."""
        with contextlib.suppress(SlurmError):
            jobs = self.live_jobs() if self.procs else []  # a cluster never started has no slurmctld to ask
            if jobs:
                self.run("scancel", "--full", "--signal=KILL", *jobs)
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def missing() -> list[str]:
    """The daemons this machine lacks (scripts/install-services installs them)."""
    return [str(path) for path in DAEMONS if not path.exists()]


def check_host() -> None:
    """Refuse in one line (:class:`SlurmError`) a machine that cannot run a cluster: not root, or without the
    daemons."""
    if os.geteuid() != 0:
        raise SlurmError("a Slurm cluster of this machine needs root (its daemons run as root; its GPUs are mknod's)")
    if missing():
        raise SlurmError(f"{', '.join(missing())} missing: run scripts/install-services")


def new_cluster(nodes: int = 2, gpus_per_node: int = 2, directory: Path | None = None) -> SlurmCluster:
    """A cluster not yet started, in ``directory`` (by default a new temporary folder): ``nodes`` nodes (node1,
    node2, ...) of ``gpus_per_node`` GPUs."""
    directory = directory or Path(tempfile.mkdtemp(prefix="fleet-slurm-"))
    return SlurmCluster(directory, [f"node{i + 1}" for i in range(nodes)], gpus_per_node)


def remove(cluster: SlurmCluster) -> None:
    """Stop ``cluster`` (see :meth:`SlurmCluster.stop`) and remove its folder."""
    cluster.stop()
    shutil.rmtree(cluster.directory, ignore_errors=True)
