"""The ``miopen`` workload: MIOpen's own tuning, run by MIOpenDriver on the worker's GPU, as Tuna does.

Definition (JSON)::

    {"kind": "miopen"}                       # optional: "build_timeout", "run_timeout" (seconds)

The problem is a canonical conv or bnorm problem with its direction (:mod:`fleet.miopen.driver`); the one
knob, ``step``, says what to do:

- ``perf``: tune the solvers' parameters. The build compiles the kernels without running them
  (``MIOPEN_DEBUG_COMPILE_ONLY=1``) into a private kernel cache, which is the artifact; the evaluation runs
  the search (``-s 1``, ``MIOPEN_FIND_ENFORCE=SEARCH_DB_UPDATE``) with that cache, and keeps what MIOpen wrote
  to its user perf-db for this problem: ``metrics["perf"] = [[solver, parameters], ...]``.
- ``find``: time every applicable solver (``MIOPEN_FIND_MODE=NORMAL``) and keep MIOpen's find-db record,
  fastest first: ``metrics["find"] = [[algorithm, solver, time_ms, workspace, kernel_group], ...]``.

The objective is the kernel time MIOpenDriver reports (ms, lower is better). Each run gets the worker's own
scratch directory, with a private user-db (``MIOPEN_USER_DB_PATH``) and kernel cache
(``MIOPEN_CUSTOM_CACHE_DIR``) inside it, so workers never share MIOpen's files.

MIOpenDriver is ``$FLEET_MIOPEN_DRIVER``, else ``MIOpenDriver`` on ``PATH``, else ``/opt/rocm/bin/MIOpenDriver``,
looked up on the worker. On a node without it, the build fails with one clear reason and the trial is
``errored`` with it; nothing else changes.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from fleet.bundle import pack, unpack
from fleet.errors import MIOpenDbError
from fleet.spec.workloads.miopen import MiopenSpec
from fleet.states import TrialState
from fleet.workers import health
from fleet.workers.runner import Completed, run, seen
from fleet.workers.workloads.base import Built, Job, Measured, Workload

DRIVER_ENV = "FLEET_MIOPEN_DRIVER"
ROCM_DRIVER = Path("/opt/rocm/bin/MIOpenDriver")
NO_MIOPEN = (
    "MIOpen is not installed on this node: no MIOpenDriver on PATH or in /opt/rocm/bin "
    f"(install MIOpen, or set {DRIVER_ENV} to MIOpenDriver's path)"
)
_TIME = re.compile(r"GPU Kernel (?:Min )?Time .*?Elapsed:\s*([0-9.eE+-]+)\s*ms")
_SOLUTION = re.compile(r"MIOpen .*? Algorithm:\s*(\d+)(?:,\s*Solution:\s*(?:\d+/)?(\S+))?")
_VERSION = re.compile(r"\.HIP\.([0-9][0-9_A-Za-z]*)\.")


def find_driver() -> tuple[str | None, str | None]:
    """MIOpenDriver's path on this node, or None and why not."""
    configured = os.environ.get(DRIVER_ENV)
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured, None
        return None, f"{DRIVER_ENV}={configured} is not an executable file"
    found = shutil.which("MIOpenDriver")
    if found:
        return found, None
    if ROCM_DRIVER.is_file() and os.access(ROCM_DRIVER, os.X_OK):
        return str(ROCM_DRIVER), None
    return None, NO_MIOPEN


class MiopenWorkload(MiopenSpec, Workload):
    """MIOpen's perf tuning and find step on a worker; see the module docstring."""

    def _env(self, job: Job, step: str, compile_only: bool) -> dict[str, str]:
        env = {
            **job.env,
            # As the driver sees them: in the sandbox, the scratch is elsewhere than the worker keeps it.
            "MIOPEN_USER_DB_PATH": seen(job.scratch / "user-db", job.scratch),
            "MIOPEN_CUSTOM_CACHE_DIR": seen(job.scratch / "kernel-cache", job.scratch),
            "MIOPEN_LOG_LEVEL": "4",
        }
        if compile_only:
            env["MIOPEN_DEBUG_COMPILE_ONLY"] = "1"
        if step == "perf":
            env["MIOPEN_FIND_ENFORCE"] = "SEARCH_DB_UPDATE"
        else:
            env["MIOPEN_FIND_MODE"] = "NORMAL"
        return env

    def _argv(self, driver: str, job: Job, step: str) -> list[str]:
        from fleet.miopen.driver import driver_argv, problem_kind

        argv = [driver, *driver_argv(job.problem), "-t", "1", "-i", "1"]
        if problem_kind(job.problem) == "conv":
            argv += ["-V", "0", "-s", "1" if step == "perf" else "0"]
        return argv

    def _run(self, job: Job, step: str, *, compile_only: bool, timeout: float) -> Completed | str:
        driver, why = find_driver()
        if driver is None:
            return why or NO_MIOPEN
        for folder in ("user-db", "kernel-cache"):
            (job.scratch / folder).mkdir(exist_ok=True)
        return run(
            self._argv(driver, job, step),
            cwd=job.scratch,
            env=self._env(job, step, compile_only),
            timeout=timeout,
            tick=job.tick,
            tick_seconds=job.tick_seconds,
        )

    def build(self, job: Job) -> Built:
        step = str(job.config.get("step", "find"))
        done = self._run(job, step, compile_only=True, timeout=float(self.definition.get("build_timeout", 3600)))
        if isinstance(done, str):
            return Built(None, done)
        log = (done.stdout_tail + done.stderr_tail)[-4096:]
        if not done.ok:
            fault = health.fault_in(done, job.scratch)
            if fault is not None:
                raise fault  # the node's disk: never remembered as the configuration's failure
            return Built(None, done.failure("MIOpenDriver (compile only)"), log, done.seconds)
        cache = job.scratch / "kernel-cache"
        # The driver ran in the sandbox: what it left is read as regular files, never through a link.
        kernels = [p for p in sorted(cache.rglob("*")) if p.is_file() and not p.is_symlink()]
        files = {str(p.relative_to(cache)): p.read_bytes() for p in kernels}
        return Built(pack(files), None, log, done.seconds)

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        from fleet.miopen.keys import db_key

        step = str(job.config.get("step", "find"))
        if find_driver()[0] is None:
            return Measured(state=TrialState.ERRORED, reason=find_driver()[1] or NO_MIOPEN)
        (job.scratch / "kernel-cache").mkdir(exist_ok=True)
        unpack(artifact, job.scratch / "kernel-cache")
        done = self._run(job, step, compile_only=False, timeout=float(self.definition.get("run_timeout", 3600)))
        if isinstance(done, str):
            return Measured(state=TrialState.ERRORED, reason=done)
        tails: dict[str, Any] = {"stdout_tail": done.stdout_tail, "stderr_tail": done.stderr_tail}
        if not done.ok:
            fault = health.fault_in(done, job.scratch)
            if fault is not None:
                raise fault
            return Measured(state=TrialState.ERRORED, reason=done.failure("MIOpenDriver"), **tails)
        times = _TIME.findall(done.stdout)
        if not times:
            return Measured(state=TrialState.ERRORED, reason="MIOpenDriver printed no GPU kernel time", **tails)
        time_ms = float(times[-1])
        metrics: dict[str, Any] = {"driver": find_driver()[0]}
        solution = _SOLUTION.search(done.stdout)
        if solution and solution.group(2):
            metrics["solver"] = solution.group(2)
        user_db = job.scratch / "user-db"
        versions = sorted({m.group(1) for p in user_db.iterdir() if (m := _VERSION.search(p.name))})
        if versions:
            metrics["miopen_version"] = versions[-1]
        if "fil_h" in job.problem:
            key = db_key(dict(job.problem))
            if step == "find":
                entries = _find_entries(user_db, key)
                if not entries:
                    return Measured(
                        state=TrialState.ERRORED, reason=f"MIOpen wrote no find-db record for {key}", **tails
                    )
                metrics["find"] = entries
            else:
                metrics["perf"] = _perf_entries(user_db, key)
        return Measured(state=TrialState.EVALUATED, objective=time_ms, samples=[time_ms], metrics=metrics, **tails)


def _find_entries(user_db: Path, key: str) -> list[list[Any]]:
    from fleet.miopen.finddb import read_find_db

    for path in sorted(user_db.glob("*.ufdb.txt")) + sorted(user_db.glob("*.fdb.txt")):
        for record in read_find_db(path):
            if record.key == key:
                entries = [
                    [e.algorithm, e.solver, e.time_ms, e.workspace, e.kernel_group, e.kernel_algorithm]
                    for e in record.entries
                ]
                return sorted(entries, key=lambda e: e[2])
    return []


def _perf_entries(user_db: Path, key: str) -> list[list[str]]:
    """What MIOpen's user perf-db says about ``key``: SQLite (``config``/``perf_db``) or text (``KEY=S:V;...``)."""
    from fleet.miopen.keys import db_keys

    found: dict[str, str] = {}
    for path in sorted(p for p in user_db.iterdir() if p.is_file() and (".udb" in p.name or ".updb" in p.name)):
        with path.open("rb") as handle:
            sqlite = handle.read(16) == b"SQLite format 3\x00"
        if sqlite:
            from fleet.miopen.perfdb import read_perf_db

            try:
                for record in read_perf_db(path):
                    if key in db_keys(record.params):  # MIOpen 2.x and 3.x spell some 3-D keys differently
                        found[record.solver] = record.values
            except MIOpenDbError:
                continue
            continue
        for line in path.read_text(errors="replace").splitlines():
            line_key, sep, rest = line.partition("=")
            if not sep or line_key.strip() != key:
                continue
            for item in rest.split(";"):
                solver, sep, values = item.partition(":")
                if sep:
                    found[solver.strip()] = values.strip()
    return sorted([solver, values] for solver, values in found.items())
