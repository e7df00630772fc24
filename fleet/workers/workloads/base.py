"""The worker's side of a workload: how one kind of problem is built and measured on a worker."""

from __future__ import annotations

import dataclasses
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.space import Config
from fleet.spec.workloads.base import WorkloadSpec
from fleet.spec.workloads.objectives import objective_of
from fleet.states import MEASURED, TrialState


@dataclass(frozen=True)
class Job:
    """What a workload gets for one build or one evaluation.

    Parameters
    ----------
    config:
        The knob values: only the build-time ones for a build, all of them for an evaluation.
    problem:
        The problem's parameters; templates may name them like knobs.
    scratch:
        An empty directory of this worker's, removed afterwards.
    fetch:
        Returns a blob (a source bundle) by digest, through the worker's cache.
    tick:
        Call it while waiting on long work; False means the worker lost the trial, so stop.
    tick_seconds:
        How often to call ``tick``: well inside the worker's lease.
    env:
        Extra environment for commands: the GPU pinning of an evaluation worker.
    campaign:
        The campaign the work is for: what a workload keeps between jobs (a resident command) is this campaign's
        alone, never handed to another's.
    """

    config: Config
    problem: Mapping[str, Any]
    scratch: Path
    fetch: Callable[[str], bytes]
    tick: Callable[[], bool] | None = None
    tick_seconds: float = 5.0
    env: Mapping[str, str] = field(default_factory=dict)
    campaign: int | None = None


@dataclass(frozen=True)
class Built:
    """A build's outcome: the artifact's bytes, or why there are none."""

    data: bytes | None
    reason: str | None = None
    log_tail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Measured:
    """An evaluation's outcome, as the store records it."""

    state: str  # "evaluated", "invalid" or "errored"
    objective: float | None = None
    samples: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    objectives: dict[str, float] = field(default_factory=dict)  # with several objectives: each one's value

    @classmethod
    def from_samples(
        cls,
        samples: list[float],
        metrics: list[dict[str, Any]],
        *,
        valid: bool = True,
        stdout_tail: str = "",
        stderr_tail: str = "",
    ) -> Measured:
        """Median of the samples as the objective; each extra metric's median alongside.

        What the program printed that is not a number reaches the searchers' predicates too (MLPerf's
        ``"result_validity": "VALID"``): a bool is true only when every repeat said so, and a string is kept
        when every repeat printed the same one, else the list of what each repeat printed (which no test of one
        value passes). Lists, objects and nulls are left out, as before.
        """
        merged: dict[str, Any] = {}
        for name in sorted({k for m in metrics for k in m}):
            given = [m[name] for m in metrics if isinstance(m.get(name), int | float | str)]
            if not given:
                continue
            numbers = [v for v in given if isinstance(v, int | float) and not isinstance(v, bool)]
            if numbers:
                merged[name] = statistics.median(numbers)
            elif all(isinstance(v, bool) for v in given):
                merged[name] = all(given)
            else:
                merged[name] = given[0] if all(v == given[0] for v in given) else given
        return cls(
            state=TrialState.EVALUATED if valid else TrialState.INVALID,
            objective=statistics.median(samples),
            samples=samples,
            metrics=merged,
            reason=None if valid else "the run reported an invalid result",
            stdout_tail=stdout_tail,
            stderr_tail=stderr_tail,
        )


class Workload(WorkloadSpec, ABC):
    """What a worker does with a workload definition: build it and measure it.

    Each kind subclasses its :class:`fleet.spec.workloads.WorkloadSpec`, which validates the definition.
    """

    @abstractmethod
    def build(self, job: Job) -> Built:
        """Build the artifact for ``job.config``'s build-time knobs."""

    @abstractmethod
    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        """Run ``artifact`` with all of ``job.config`` and measure it."""

    def with_observed(self, measured: Measured) -> Measured:
        """A measurement of several objectives completed with those that are the GPU observer's readings (taken
        around :meth:`evaluate`, now among the metrics), the first objective made the measurement's objective;
        errored when a reading is missing. One objective: ``measured`` as it is.

        Parameters
        ----------
        measured:
            What :meth:`evaluate` measured, the observer's readings merged into its metrics.
        """
        definitions = self.definition.get("objectives")
        if not definitions or measured.state not in MEASURED:
            return measured
        values = dict(measured.objectives)
        for definition in definitions:
            reading = definition.get("observer")
            if reading is None:
                continue
            name = objective_of(definition).name
            value = measured.metrics.get(reading)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return dataclasses.replace(
                    measured,
                    state=TrialState.ERRORED,
                    objective=None,
                    reason=f"the objective {name!r} is the observer's {reading!r}, and this evaluation has none "
                    "(an NVIDIA GPU watched with nvidia-ml-py or nvidia-smi, and FLEET_OBSERVE not off, gives it)",
                )
            values[name] = float(value)
        ordered = {o.name: values[o.name] for o in self.objectives}
        first = ordered[self.objective_name]
        if "observer" not in definitions[0]:
            return dataclasses.replace(measured, objectives=ordered)
        return dataclasses.replace(measured, objectives=ordered, objective=first, samples=[first])
