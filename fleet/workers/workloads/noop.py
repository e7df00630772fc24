"""A workload that builds and measures nothing: it times the fleet's own overhead."""

from __future__ import annotations

from fleet.canonical import canonical_json
from fleet.spec.workloads.noop import NoopSpec
from fleet.states import TrialState
from fleet.workers.workloads.base import Built, Job, Measured, Workload


class NoopWorkload(NoopSpec, Workload):
    """Each build returns its configuration as the artifact; each evaluation measures 0."""

    def build(self, job: Job) -> Built:
        return Built(canonical_json(job.config).encode())

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        return Measured(state=TrialState.EVALUATED, objective=0.0, samples=[0.0])
