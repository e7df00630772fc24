"""``fleet worker``: start a node's Celery worker processes and keep them running.

One evaluation process per GPU (concurrency 1, pinned with ``CUDA_VISIBLE_DEVICES`` /
``HIP_VISIBLE_DEVICES``, named after host and GPU), and one build process per target with a concurrency
of the node's cores. The launcher itself never touches a GPU: it only runs the discovery tools.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.errors import FleetError
from fleet.ops.logs import RotatingLog, pump, rotation, worker_log_path
from fleet.workers.gpus import Gpu, cpu_target, detect_gpus, override_gpus, select_gpus

log = logging.getLogger("fleet.launch")


@dataclass(frozen=True)
class WorkerSpec:
    """One Celery worker process to run.

    Parameters
    ----------
    name:
        Celery node name, ``role-device@host``.
    role:
        ``build`` or ``eval``.
    target:
        The target whose queue it consumes.
    concurrency:
        Pool processes; 1 for evaluation, so a measurement has its device to itself.
    env:
        Extra environment: GPU pinning and Fleet's worker variables.
    """

    name: str
    role: str
    target: str
    concurrency: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def queue(self) -> str:
        return f"{self.role}.{self.target}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def plan(
    *,
    gpus: list[Gpu],
    target: str | None = None,
    eval_procs: int = 1,
    build_procs: int | None = None,
    host: str | None = None,
) -> list[WorkerSpec]:
    """The worker processes a node runs.

    Parameters
    ----------
    gpus:
        The node's GPUs (detected or given); empty for a CPU node.
    target:
        The CPU node's target when there are no GPUs (default ``cpu-<machine>``).
    eval_procs:
        Evaluation processes of a CPU node.
    build_procs:
        Build concurrency per target; the number of cores by default.
    """
    host = host or socket.gethostname()
    build_procs = build_procs or os.cpu_count() or 1
    gpu_records = json.dumps([asdict(g) for g in gpus])
    specs: list[WorkerSpec] = []
    for gpu in gpus:
        env = gpu.visible_devices_env() | {"FLEET_WORKER_GPU": f"{gpu.index}:{gpu.name}"}
        specs.append(WorkerSpec(f"eval-gpu{gpu.index}@{host}", "eval", gpu.target, 1, env))
    if not gpus:
        cpu = target or cpu_target()
        specs += [WorkerSpec(f"eval-cpu{i}@{host}", "eval", cpu, 1) for i in range(eval_procs)]
    for each in sorted({s.target for s in specs}):
        specs.append(WorkerSpec(f"build-{_safe(each)}@{host}", "build", each, build_procs))
    return [
        WorkerSpec(
            s.name,
            s.role,
            s.target,
            s.concurrency,
            s.env | {"FLEET_WORKER_ROLE": s.role, "FLEET_WORKER_TARGET": s.target, "FLEET_WORKER_GPUS": gpu_records},
        )
        for s in specs
    ]


def node_gpus(target: str | None, gpus: str | None) -> list[Gpu]:
    """The GPUs this node evaluates on, from the ``--target`` / ``--gpus`` options or discovery."""
    if target and not target.startswith("cpu"):
        if gpus:
            return override_gpus(gpus, target)
        found = [g for g in detect_gpus() if g.target == target]
        if not found:
            raise FleetError(f"no GPU of target {target} found on this node; name them with --gpus 0,1,...")
        return found
    if target:
        return []
    found = detect_gpus()
    return select_gpus(found, gpus) if gpus else found


def command(spec: WorkerSpec, loglevel: str = "INFO") -> list[str]:
    """The argument list that starts ``spec`` as a Celery worker."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "fleet.tasks",
        "worker",
        "-n",
        spec.name,
        "-Q",
        spec.queue,
        "-c",
        str(spec.concurrency),
        "-P",
        "prefork",
        "-E",
        "--without-gossip",
        "--without-mingle",
        "-l",
        loglevel,
    ]


def _die_with_parent() -> None:
    # A worker that outlives its launcher (killed, or its node agent restarted) would go on taking work
    # that nobody supervises; SIGTERM is a warm shutdown, so a measurement in progress still finishes.
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class Launcher:
    """Runs the planned worker processes, restarts one that dies, and stops them all on request.

    Parameters
    ----------
    specs:
        What to run.
    log_dir:
        Where each worker's log goes (``<role>/<target>/<host>/<worker>.log``, rotated by size as
        ``FLEET_LOG_MAX_BYTES`` and ``FLEET_LOG_BACKUPS`` say); None to inherit our output.
    echo:
        Copy each worker's output to ours too (``fleet worker``: the service manager's journal gets it).
    """

    def __init__(
        self,
        specs: list[WorkerSpec],
        log_dir: Path | None = None,
        loglevel: str = "INFO",
        env: dict[str, str] | None = None,
        echo: bool = False,
    ) -> None:
        self.specs = specs
        self.env = dict(os.environ if env is None else env)
        self.log_dir = log_dir
        self.loglevel = loglevel
        self.echo = echo
        self.rotation = rotation(self.env)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pumps: list[threading.Thread] = []
        self.stopping = False

    def log_path(self, spec: WorkerSpec) -> Path | None:
        if self.log_dir is None:
            return None
        return worker_log_path(self.log_dir, spec.role, spec.target, spec.name)

    def _start(self, spec: WorkerSpec) -> None:
        path = self.log_path(spec)
        proc = subprocess.Popen(
            command(spec, self.loglevel),
            env={**self.env, **spec.env},
            stdout=None if path is None else subprocess.PIPE,
            stderr=None if path is None else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.procs[spec.name] = proc
        if path is not None:
            # We are the file's only writer, so rotation never races with the pool's processes.
            assert proc.stdout is not None
            output = RotatingLog(path, *self.rotation)
            self.pumps = [t for t in self.pumps if t.is_alive()]
            self.pumps.append(pump(proc.stdout, output, sys.stdout.buffer if self.echo else None))
        log.info("started %s (pid %d) on %s", spec.name, proc.pid, spec.queue)

    def start(self) -> Launcher:
        for spec in self.specs:
            self._start(spec)
        return self

    def supervise(self, poll: float = 1.0) -> None:
        """Keep the workers running until :meth:`stop` is called (or a signal asks for it)."""
        while not self.stopping:
            for spec in self.specs:
                proc = self.procs.get(spec.name)
                if proc is not None and proc.poll() is not None and not self.stopping:
                    log.warning("%s exited with status %s; starting it again", spec.name, proc.returncode)
                    time.sleep(1.0)
                    self._start(spec)
            time.sleep(poll)

    def stop(self, timeout: float = 60.0) -> None:
        """Warm shutdown: each worker finishes its current task, then exits; stragglers are killed."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for thread in self.pumps:  # the last lines of each worker reach its log before we return
            thread.join(timeout=5)

    def __enter__(self) -> Launcher:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
