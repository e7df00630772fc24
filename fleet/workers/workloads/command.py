"""The ``command`` workload on a worker: unpack the sources, run the build and the run argument lists, parse the output.

The definition and its validation are :mod:`fleet.spec.workloads.command`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fleet.bundle import pack, unpack
from fleet.spec.workloads.command import CommandSpec, fill, names_in
from fleet.workers.runner import Completed, run
from fleet.workers.workloads.base import Built, Job, Measured, Workload

__all__ = ["CommandWorkload", "fill", "names_in"]


class CommandWorkload(CommandSpec, Workload):
    """Runs a :class:`CommandSpec` on a worker: unpack the sources, build, run and parse the output."""

    def _sources(self, job: Job) -> None:
        if self.definition.get("bundle"):
            unpack(job.fetch(self.definition["bundle"]), job.scratch)

    def build(self, job: Job) -> Built:
        self._sources(job)
        if not self.definition.get("build"):
            return Built(pack({p.name: p.read_bytes() for p in job.scratch.iterdir() if p.is_file()}))
        values = {**job.problem, **job.config}
        done = run(
            fill(self.definition["build"], values),
            cwd=job.scratch,
            env=job.env,
            timeout=float(self.definition.get("build_timeout", 300)),
            tick=job.tick,
            tick_seconds=job.tick_seconds,
        )
        log = (done.stdout_tail + done.stderr_tail)[-4096:]
        if not done.ok:
            return Built(None, done.failure("the build"), log, done.seconds)
        missing = [a for a in self.definition.get("artifacts", []) if not (job.scratch / a).is_file()]
        if missing:
            return Built(None, f"the build did not produce {missing[0]!r}", log, done.seconds)
        names = self.definition.get("artifacts") or [p.name for p in job.scratch.iterdir() if p.is_file()]
        return Built(pack({name: (job.scratch / name).read_bytes() for name in names}), None, log, done.seconds)

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        unpack(artifact, job.scratch)
        argv = fill(self.definition["run"], {**job.problem, **job.config})
        timeout = float(self.definition.get("run_timeout", 300))
        samples: list[float] = []
        metrics: list[dict[str, Any]] = []
        valid = True
        last: Completed | None = None
        for index in range(int(self.definition.get("warmup", 0)) + int(self.definition.get("repeats", 1))):
            last = run(
                argv, cwd=job.scratch, timeout=timeout, env=job.env, tick=job.tick, tick_seconds=job.tick_seconds
            )
            if not last.ok:
                return Measured(
                    state="errored",
                    reason=last.failure("the run"),
                    stdout_tail=last.stdout_tail,
                    stderr_tail=last.stderr_tail,
                )
            parsed = self.parse(last.stdout)
            if parsed is None:
                return Measured(
                    state="errored",
                    reason=f"no {self.objective_name} in the run's output",
                    stdout_tail=last.stdout_tail,
                    stderr_tail=last.stderr_tail,
                )
            value, extra = parsed
            if index < int(self.definition.get("warmup", 0)):
                continue
            samples.append(value)
            metrics.append(extra)
            valid = valid and extra.get("valid", True) is not False
        assert last is not None
        return Measured.from_samples(
            samples, metrics, valid=valid, stdout_tail=last.stdout_tail, stderr_tail=last.stderr_tail
        )

    def parse(self, stdout: str) -> tuple[float, dict[str, Any]] | None:
        """The objective and the extra metrics in a run's output, or None if it has no objective."""
        objective = self.definition["objective"]
        if "regex" in objective:
            matches = re.findall(objective["regex"], stdout)
            try:
                value = float(matches[-1]) if matches else math.nan
            except ValueError:
                return None
            return (value, {}) if math.isfinite(value) else None
        for line in reversed(stdout.splitlines()):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            value = record.get(objective["json"]) if isinstance(record, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                return float(value), record
        return None
