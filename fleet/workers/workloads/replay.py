"""The ``replay`` workload on a worker: answer each configuration with its recorded time.

The definition is :mod:`fleet.spec.workloads.replay`.
"""

from __future__ import annotations

from fleet.canonical import canonical_json
from fleet.replay import OVERHEAD_S, run_of
from fleet.spec.workloads.replay import ReplaySpec
from fleet.states import TrialState
from fleet.workers.workloads.base import Built, Job, Measured, Workload


class ReplayWorkload(ReplaySpec, Workload):
    """Recorded times as measurements."""

    def build(self, job: Job) -> Built:
        return Built(canonical_json(job.config).encode())

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        # The same answer as the in-process simulator gives a searcher.
        record = self.recorded.lookup(job.config)
        run = run_of(dict(job.config), record, OVERHEAD_S)
        if record is None or run.objective is None:
            return Measured(state=TrialState.INVALID, metrics=run.metrics, reason=run.reason)
        return Measured(
            state=TrialState.EVALUATED,
            objective=run.objective,
            samples=list(record.samples) or [run.objective],
            metrics=run.metrics,
        )
