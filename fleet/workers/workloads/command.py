"""The ``command`` workload on a worker: unpack the sources, run the build and the run argument lists, parse the output.

The definition and its validation are :mod:`fleet.spec.workloads.command`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fleet.bundle import pack, unpack
from fleet.errors import SpecError, did_you_mean, shown
from fleet.settings import positive_number
from fleet.spec.workloads.command import CommandSpec, fill, names_in
from fleet.spec.workloads.objectives import objective_of
from fleet.states import TrialState
from fleet.workers import health
from fleet.workers.runner import Completed, Resident, run
from fleet.workers.workloads.base import Built, Job, Measured, Workload

__all__ = ["CommandWorkload", "fill", "names_in"]


class CommandWorkload(CommandSpec, Workload):
    """Runs a :class:`CommandSpec` on a worker: unpack the sources, build, run and parse the output."""

    def _sources(self, job: Job) -> None:
        if self.definition.get("bundle"):
            unpack(job.fetch(self.definition["bundle"]), job.scratch)

    @property
    def network(self) -> bool:
        return bool(self.definition.get("network", False))

    def toolchain(self) -> str:
        """What the toolchain probe prints (:func:`toolchain_line`), run in the sandbox like the build it describes."""
        argv = self.toolchain_argv()
        if not argv:
            return ""
        with tempfile.TemporaryDirectory(prefix="fleet-probe-") as folder:
            done = run(argv, cwd=Path(folder), timeout=30, network=self.network)
        if done.returncode == 127 or done.timed_out:
            why = "timed out after 30 s" if done.timed_out else done.stderr_tail.strip().rpartition(": ")[2]
            raise SpecError(f"cannot run the toolchain command {argv}: {why}")
        return toolchain_line(done.stdout or done.stderr)

    def build(self, job: Job) -> Built:
        self._sources(job)
        if not self.definition.get("build"):
            return Built(pack(_artifacts(job.scratch, None)))
        values = {**job.problem, **job.config}
        done = run(
            fill(self.definition["build"], values),
            cwd=job.scratch,
            env=job.env,
            timeout=float(self.definition.get("build_timeout", 300)),
            tick=job.tick,
            tick_seconds=job.tick_seconds,
            network=self.network,
        )
        log = (done.stdout_tail + done.stderr_tail)[-4096:]
        if not done.ok:
            fault = health.fault_in(done, job.scratch)
            if fault is not None:
                raise fault  # the node's disk, not the configuration: never remembered as its failure
            return Built(None, done.failure("the build"), log, done.seconds)
        try:
            files = _artifacts(job.scratch, self.definition.get("artifacts") or None)
        except ArtifactError as error:
            return Built(None, str(error), log, done.seconds)
        return Built(pack(files), None, log, done.seconds)

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        argv = fill(self.definition["run"], {**job.problem, **job.config})
        timeout = float(self.definition.get("run_timeout", 300))
        resident = _resident(argv, job, self.network) if self.definition.get("resident") else None
        if resident is None:
            unpack(artifact, job.scratch)
        else:
            unpack(artifact, resident.fresh_folder())
        samples: list[float] = []
        metrics: list[dict[str, Any]] = []
        values: list[dict[str, float]] = []
        valid = True
        last: Completed | None = None
        for index in range(int(self.definition.get("warmup", 0)) + int(self.definition.get("repeats", 1))):
            if resident is not None:
                last = resident.call(timeout=timeout, tick=job.tick, tick_seconds=job.tick_seconds)
            else:
                last = run(
                    argv,
                    cwd=job.scratch,
                    timeout=timeout,
                    env=job.env,
                    tick=job.tick,
                    tick_seconds=job.tick_seconds,
                    network=self.network,
                )
            if not last.ok:
                fault = health.fault_in(last, job.scratch if resident is None else resident.folder)
                if fault is not None:
                    raise fault
                return Measured(
                    state=TrialState.ERRORED,
                    reason=last.failure("the run"),
                    stdout_tail=last.stdout_tail,
                    stderr_tail=last.stderr_tail,
                )
            parsed = self.parse(last.stdout)
            read = None if parsed is None else self.json_objectives(parsed[1])
            if parsed is None or read is None:
                names = ", ".join(o.name for o in self.objectives)
                return Measured(
                    state=TrialState.ERRORED,
                    reason=self._missing(last.stdout)
                    if parsed is None
                    else f"not every objective ({names}) in the run's output",
                    stdout_tail=last.stdout_tail,
                    stderr_tail=last.stderr_tail,
                )
            value, extra = parsed
            if index < int(self.definition.get("warmup", 0)):
                continue
            samples.append(value)
            metrics.append(extra)
            values.append(read)
            valid = valid and extra.get("valid", True) is not False
        assert last is not None
        measured = Measured.from_samples(
            samples, metrics, valid=valid, stdout_tail=last.stdout_tail, stderr_tail=last.stderr_tail
        )
        # Each objective read from the line is the median of its repeats, as the objective is; those the observer
        # reads come with its readings (Workload.with_observed).
        medians = {name: statistics.median(v[name] for v in values) for name in values[0]}
        return dataclasses.replace(measured, objectives=medians) if medians else measured

    def json_objectives(self, record: dict[str, Any]) -> dict[str, float] | None:
        """With several objectives, the value of each one that the run's JSON line ``record`` holds, by name; None
        when one is not a finite number there; {} with one objective (``objective`` is its value)."""
        found: dict[str, float] = {}
        for definition in self.definition.get("objectives", ()):
            if "json" not in definition:
                continue
            value = record.get(definition["json"])
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return None
            found[objective_of(definition).name] = float(value)
        return found

    def _missing(self, stdout: str) -> str:
        """Why a run's output gave no objective: for a JSON field, the field as the spec names it beside the run's
        JSON line's own fields (a typo of one is then plain)."""
        field = self._json_objective.get("json")
        if field is None:
            return f"no {self.objective_name} in the run's output"
        record = next((r for r in map(_json_object, reversed(stdout.splitlines())) if r is not None), None)
        if record is None:
            return f"no JSON line with {field!r} in the run's output"
        if field not in record:
            # The run's own words, bounded: a few of its fields, each cut short.
            names = [name[:40] for name in list(record)[:100]]
            fields = ", ".join(shown(name) for name in names[:10]) + (", ..." if len(record) > 10 else "")
            return f"the run's JSON line has no field {field!r}{did_you_mean(field, names)}; its fields: {fields}"
        return f"the run's JSON line's {field!r} is no finite number: {shown(record[field])}"

    def parse(self, stdout: str) -> tuple[float, dict[str, Any]] | None:
        """The objective and the extra metrics in a run's output, or None if it has no objective."""
        objective = self._json_objective
        if "regex" in objective:
            matches = re.findall(objective["regex"], stdout)
            try:
                value = float(matches[-1]) if matches else math.nan
            except ValueError:
                return None
            return (value, {}) if math.isfinite(value) else None
        for record in map(_json_object, reversed(stdout.splitlines())):
            value = None if record is None else record.get(objective["json"])
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                return float(value), record  # type: ignore[return-value]
        return None


def _json_object(line: str) -> dict[str, Any] | None:
    """``line`` read as a JSON object, else None."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


_RESIDENT: Resident | None = None
"""This process's resident command: one at a time, the last campaign's (a worker's process measures one trial at
a time, and a resident command may hold a lot of memory)."""

RESIDENT_IDLE_SECONDS = 300.0
"""How long a resident command waits for its campaign's next run before it is ended (FLEET_RESIDENT_IDLE_SECONDS)."""


def _resident(argv: list[str], job: Job, network: bool) -> Resident:
    """The resident command of the job's campaign that runs ``argv`` with the job's environment, started afresh if
    another is running.

    A resident belongs to one campaign: its folder is named after it, so a trial of another campaign with the same
    command never runs in it (its answers, its leftover processes and files are its campaign's own); the one running
    is ended first, sandbox and all.
    """
    global _RESIDENT
    env = dict(job.env)
    folder = job.scratch.with_name(f"{job.scratch.name}.resident-{job.campaign}")
    now = _RESIDENT
    if now is None or (now.argv, now.env, now.network, now.cwd) != (argv, env, network, folder):
        if now is not None:
            now.close()
        idle = positive_number(os.environ, "FLEET_RESIDENT_IDLE_SECONDS", RESIDENT_IDLE_SECONDS)
        _RESIDENT = Resident(argv, cwd=folder, env=env, network=network, idle=idle)
    return _RESIDENT


class ArtifactError(Exception):
    """The build left an artifact that is missing, or is not a regular file of its own directory."""


def _artifacts(scratch: Path, names: list[str] | None) -> dict[str, bytes]:
    """The artifact files the build left in ``scratch``, read without following a link.

    A build runs as the workload's account and may leave ``k -> /proc/self/environ`` or ``r -> /root/secret``:
    the worker, which reads the files, must read only what the build wrote. So each name is opened component by
    component with ``O_NOFOLLOW`` from ``scratch``, and must be a regular file with one link. With no names,
    every regular file at the top of ``scratch`` (links left out).
    """
    if names is None:
        names = sorted(e.name for e in os.scandir(scratch) if e.is_file(follow_symlinks=False))
    return {name: _read_inside(scratch, name) for name in names}


def _read_inside(scratch: Path, name: str) -> bytes:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise ArtifactError(f"the artifact {name!r} is not inside the build's directory")
    folder = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            except OSError:
                raise ArtifactError(f"the build did not produce {name!r} (or a folder of its name is a link)") from None
            os.close(folder)
            folder = inner
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            raise ArtifactError(f"the build did not produce {name!r}") from None
        except OSError:
            raise ArtifactError(f"the build left {name!r} as a link: artifacts are regular files") from None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise ArtifactError(f"the build left {name!r} as something else than a regular file of its own")
        return file.read()


_VERSION = re.compile(r"\d+\.\d+")


def toolchain_line(text: str) -> str:
    """The toolchain's identity in what its version command printed: the first line, and where that names no
    version, the first line that does with it (``nvcc --version`` opens with its name and gives its release on
    the fourth line: two nvcc releases must not look the same)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines or _VERSION.search(lines[0]):
        return lines[0] if lines else ""
    versioned = next((line for line in lines[1:] if _VERSION.search(line)), None)
    return f"{lines[0]} ({versioned})" if versioned else lines[0]
