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
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.errors import FleetError
from fleet.ops.logs import RotatingLog, pump, rotation, worker_log_path
from fleet.settings import Settings, child_env, node_name
from fleet.workers.gpus import Gpu, cpu_target, detect_gpus, given, override_gpus, select_gpus

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
    host = host or node_name()
    build_procs = build_procs or os.cpu_count() or 1
    gpu_records = json.dumps([asdict(g) for g in gpus])
    specs: list[WorkerSpec] = []
    for gpu in gpus:
        env = gpu.visible_devices_env() | {"FLEET_WORKER_GPU": f"{gpu.index}:{gpu.name}"}
        # A GPU found on the node has one target; one named by --target may be named by another launcher for
        # another target too, and two Celery nodes must not share a name: such a worker's name has its target.
        named = f"-{_safe(gpu.target)}" if given(gpu) else ""
        specs.append(WorkerSpec(f"eval-gpu{gpu.index}{named}@{host}", "eval", gpu.target, 1, env))
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
    """The argument list that starts ``spec`` as a Celery worker (:mod:`fleet.tasks.__main__`)."""
    return [
        sys.executable, "-m", "fleet.tasks", "worker",
        "-n", spec.name, "-Q", spec.queue, "-c", str(spec.concurrency), "-l", loglevel,
    ]  # fmt: skip


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
    restart_delay:
        Seconds before a dead worker is started again; doubled after each quick death, up to ``max_delay``.
    quick_seconds:
        A worker that dies sooner than this after its start died *quickly*: its next restart waits longer.
    quick_deaths:
        Quick deaths in a row after which one error line says the worker keeps dying (it is still restarted).
    """

    def __init__(
        self,
        specs: list[WorkerSpec],
        log_dir: Path | None = None,
        loglevel: str = "INFO",
        env: dict[str, str] | None = None,
        echo: bool = False,
        *,
        restart_delay: float = 1.0,
        max_delay: float = 60.0,
        quick_seconds: float = 30.0,
        quick_deaths: int = 5,
    ) -> None:
        self.specs = specs
        # Its workers read the database and broker URLs from private files, never from their environment.
        given = dict(os.environ if env is None else env)
        self.env = child_env(given, Settings.from_env(given).home / "secrets")
        self.log_dir = log_dir
        self.loglevel = loglevel
        self.echo = echo
        self.rotation = rotation(self.env)
        self.restart_delay = restart_delay
        self.max_delay = max_delay
        self.quick_seconds = quick_seconds
        self.quick_deaths = quick_deaths
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pumps: list[threading.Thread] = []
        self.stopping = False
        self.restarts: dict[str, int] = {}  # restarts of each worker so far
        self._started_at: dict[str, float] = {}
        self._streak: dict[str, int] = {}  # quick deaths in a row
        self._due: dict[str, float] = {}  # dead workers: when each starts again
        self._lock = threading.Lock()  # one thread starts or stops processes at a time
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def log_path(self, spec: WorkerSpec) -> Path | None:
        if self.log_dir is None:
            return None
        return worker_log_path(self.log_dir, spec.role, spec.target, spec.name)

    def _start(self, spec: WorkerSpec, note: str | None = None) -> None:
        path = self.log_path(spec)
        output = None if path is None else RotatingLog(path, *self.rotation)
        if output is not None and note is not None:  # whoever reads the worker's log sees why it began again
            output.write(f"fleet: {note}\n".encode())
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
        self._started_at[spec.name] = time.monotonic()
        if output is not None:
            # We are the file's only writer, so rotation never races with the pool's processes.
            assert proc.stdout is not None
            self.pumps = [t for t in self.pumps if t.is_alive()]
            self.pumps.append(pump(proc.stdout, output, sys.stdout.buffer if self.echo else None))
        log.info("started %s (pid %d) on %s", spec.name, proc.pid, spec.queue)

    def start(self) -> Launcher:
        for spec in self.specs:
            self._start(spec)
        return self

    def check(self) -> None:
        """One round of supervision: notice the workers that died, and start those whose delay is over."""
        with self._lock:
            now = time.monotonic()
            for spec in self.specs:
                if self.stopping:
                    return
                proc = self.procs.get(spec.name)
                if proc is None or proc.poll() is None:
                    continue
                if spec.name not in self._due:
                    self._due[spec.name] = now + self._died(spec, proc.returncode, now)
                elif now >= self._due[spec.name]:
                    del self._due[spec.name]
                    self.restarts[spec.name] = self.restarts.get(spec.name, 0) + 1
                    status = proc.returncode
                    self._start(spec, f"restart {self.restarts[spec.name]}: the last process exited with {status}")

    def _died(self, spec: WorkerSpec, status: int | None, now: float) -> float:
        """Log the death of ``spec``'s process (one line) and return the delay before its restart."""
        quick = now - self._started_at.get(spec.name, now) < self.quick_seconds
        streak = self._streak[spec.name] = self._streak.get(spec.name, 0) + 1 if quick else 1
        # Backoff only for quick deaths: a worker that ran a while and died (a crash, a kill) comes back
        # at once, while one that cannot start (a bad environment) does not spin.
        delay = min(self.restart_delay * 2 ** (streak - 1), self.max_delay)
        if streak == self.quick_deaths:
            log.error(
                "%s died within %.0f s of its start %d times in a row (last status %s); see %s; "
                "it is still started again, next in %.0f s (waits grow to %.0f s)",
                spec.name,
                self.quick_seconds,
                streak,
                status,
                self.log_path(spec) or "its output above",
                delay,
                self.max_delay,
            )
        else:
            log.warning("%s exited with status %s; starting it again in %.0f s", spec.name, status, delay)
        return delay

    def supervise(self, poll: float = 1.0) -> None:
        """Keep the workers running until :meth:`stop` is called (or a signal asks for it)."""
        while not self.stopping:
            try:
                self.check()
            except OSError:  # e.g. no process could be made just now: the next round tries again
                log.exception("could not start a worker again")
            self._wake.wait(poll)

    def supervise_in_background(self, poll: float = 1.0) -> Launcher:
        """Run :meth:`supervise` on a thread, for a caller whose own thread does other work; :meth:`stop` ends it.

        A process started with ``PR_SET_PDEATHSIG`` gets its signal when the *thread* that started it ends,
        so the workers this thread restarts get SIGTERM when it ends: only :meth:`stop` ends it, and stops
        them anyway.
        """
        self._thread = threading.Thread(target=self.supervise, args=(poll,), name="fleet-supervise", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Warm shutdown: each worker finishes its current task, then exits; stragglers are killed."""
        # Supervision ends first, so that a worker we stop is not taken for one that died and started again.
        self.stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
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
