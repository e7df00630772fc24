"""The ``command`` workload on a worker: unpack the sources, run the build and the run argument lists, parse the output.

The definition and its validation are :mod:`fleet.spec.workloads.command`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fleet.bundle import Refused, pack, read_inside, size_text, unpack
from fleet.errors import SpecError, did_you_mean, shown
from fleet.limits import TIMEOUT_SECONDS
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
        timeout, over = _timeout(self.definition, "build_timeout")
        if over:
            return Built(None, over)
        self._sources(job)
        if not self.definition.get("build"):
            try:
                return Built(pack(_artifacts(job.scratch, None)))
            except ArtifactError as error:
                return Built(None, str(error))
        values = {**job.problem, **job.config}
        done = run(
            fill(self.definition["build"], values),
            cwd=job.scratch,
            env=job.env,
            timeout=timeout,
            tick=job.tick,
            tick_seconds=job.tick_seconds,
            network=self.network,
        )
        log = (done.stdout_tail + done.stderr_tail)[-4096:]
        fault = health.fault_in(done, job.scratch)  # a build that succeeded may have met the disk too
        if fault is not None:
            raise fault  # the node's disk, not the configuration: never remembered as its failure
        if not done.ok:
            return Built(None, done.failure("the build"), log, done.seconds)
        try:
            files = _artifacts(job.scratch, self.definition.get("artifacts") or None)
        except ArtifactError as error:
            return Built(None, str(error), log, done.seconds)
        return Built(pack(files), None, log, done.seconds)

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        argv = fill(self.definition["run"], {**job.problem, **job.config})
        timeout, over = _timeout(self.definition, "run_timeout")
        if over:
            return Measured(state=TrialState.ERRORED, reason=over)
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
            refused = _refused_metrics(extra)
            if refused is not None:
                return Measured(
                    state=TrialState.ERRORED, reason=refused, stdout_tail=last.stdout_tail, stderr_tail=last.stderr_tail
                )
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
            if record is None:
                continue
            found = record.get(objective["json"])
            if isinstance(found, int | float) and not isinstance(found, bool) and math.isfinite(found):
                return float(found), record
        return None


def _json_object(line: str) -> dict[str, Any] | None:
    """``line`` read as a JSON object, else None."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
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
        now = _RESIDENT = Resident(argv, cwd=folder, env=env, network=network, idle=idle)
    return now


METRICS = 64
"""Fields a run's JSON line may hold (FLEET_MAX_METRICS)."""
METRICS_BYTES = 16 << 10
"""Bytes of JSON they may take together (FLEET_METRICS_BYTES): they are stored with every measurement."""
ARTIFACT_BYTES = 256 << 20
"""Bytes a build's artifacts may hold together (FLEET_ARTIFACT_LIMIT): they are read, packed and stored whole."""


def _timeout(definition: dict[str, Any], name: str) -> tuple[float, str | None]:
    """The seconds ``definition`` gives a build or run (``name``), and why they are refused, when they are: past the
    most this fleet's operator allows."""
    most = positive_number(os.environ, "FLEET_MAX_TIMEOUT", TIMEOUT_SECONDS)
    seconds = float(definition.get(name, 300))
    if seconds > most:
        return seconds, f"its {name} of {seconds:g} s is more than this fleet allows (FLEET_MAX_TIMEOUT={most:g} s)"
    return seconds, None


def _refused_metrics(record: dict[str, Any]) -> str | None:
    """Why the extra metrics of a run's JSON line may not be stored, or None: too many, too large, or a number that
    is not finite (JSON has no NaN, and a database's JSON refuses it)."""
    most = int(positive_number(os.environ, "FLEET_MAX_METRICS", METRICS))
    if len(record) > most:
        return f"the run's JSON line has {len(record)} fields; at most {most} are stored (FLEET_MAX_METRICS)"
    for name, value in record.items():
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            return f"the run's metric {shown(name, 40)} is {shown(value, 40)}: not a finite number, which is not stored"
    size = len(json.dumps(record))
    most = int(positive_number(os.environ, "FLEET_METRICS_BYTES", METRICS_BYTES))
    if size > most:
        held = size_text(size)
        return f"the run's JSON line holds {held} of metrics; at most {size_text(most)} (FLEET_METRICS_BYTES)"
    return None


class ArtifactError(Exception):
    """The build left an artifact that is missing, is not a regular file of its own directory, or is too large."""


def _artifacts(scratch: Path, names: list[str] | None) -> dict[str, bytes]:
    """The artifact files the build left in ``scratch``, read without following a link.

    A build runs as the workload's account and may leave ``k -> /proc/self/environ`` or ``r -> /root/secret``:
    the worker, which reads the files, must read only what the build wrote. So each name is opened component by
    component with ``O_NOFOLLOW`` from ``scratch``, and must be a regular file with one link. With no names,
    every regular file at the top of ``scratch`` (links left out).
    """
    if names is None:
        names = sorted(e.name for e in os.scandir(scratch) if e.is_file(follow_symlinks=False))
    most = int(positive_number(os.environ, "FLEET_ARTIFACT_LIMIT", ARTIFACT_BYTES))
    files: dict[str, bytes] = {}
    for name in names:
        try:
            files[name] = read_inside(scratch, name, limit=most - sum(map(len, files.values())), own=True)
        except Refused as refused:
            raise ArtifactError(_ARTIFACT_REFUSED[refused.why].format(name=repr(name), most=size_text(most))) from None
    return files


# What the build is told of an artifact read_inside refused, by why.
_ARTIFACT_REFUSED = {
    "outside": "the artifact {name} is not inside the build's directory",
    "missing": "the build did not produce {name}",
    "link": "the build left {name} as a link (or a folder on its way): artifacts are regular files",
    "special": "the build left {name} as something else than a regular file of its own",
    "large": "the build's artifacts hold more than {most} (FLEET_ARTIFACT_LIMIT)",
}


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
