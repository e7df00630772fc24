"""The worker's side of a workload: how one kind of problem is built and measured on a worker."""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.space import Config
from fleet.spec.workloads.base import WorkloadSpec


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
    """

    config: Config
    problem: Mapping[str, Any]
    scratch: Path
    fetch: Callable[[str], bytes]
    tick: Callable[[], bool] | None = None
    tick_seconds: float = 5.0
    env: Mapping[str, str] = field(default_factory=dict)


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

    @classmethod
    def from_samples(
        cls, samples: list[float], metrics: list[dict[str, Any]], *, valid: bool = True, **tails: str
    ) -> Measured:
        """Median of the samples as the objective; each extra metric's median alongside."""
        merged: dict[str, Any] = {}
        for name in {k for m in metrics for k in m}:
            values = [
                m[name] for m in metrics if isinstance(m.get(name), int | float) and not isinstance(m[name], bool)
            ]
            if values:
                merged[name] = statistics.median(values)
        return cls(
            state="evaluated" if valid else "invalid",
            objective=statistics.median(samples),
            samples=samples,
            metrics=merged,
            reason=None if valid else "the run reported an invalid result",
            **tails,
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
