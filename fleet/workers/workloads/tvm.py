"""The ``tvm`` workload on a worker: build the operator for the worker's target, time it, check it.

The definition is :mod:`fleet.spec.workloads.tvm`.
"""

from __future__ import annotations

import os

from fleet.canonical import canonical_json
from fleet.errors import FleetError
from fleet.spec.workloads.tvm import TvmSpec
from fleet.states import TrialState
from fleet.targets import cpu_target
from fleet.workers.workloads.base import Built, Job, Measured, Workload


class TvmWorkload(TvmSpec, Workload):
    """A TVM operator schedule measured on the worker's device."""

    def build(self, job: Job) -> Built:
        # The real build needs the evaluating device's target; it happens in evaluate.
        return Built(canonical_json(job.config).encode())

    def evaluate(self, job: Job, artifact: bytes) -> Measured:
        from fleet.tvm.measure import measure
        from fleet.tvm.operators import check_problem

        target = os.environ.get("FLEET_WORKER_TARGET") or job.env.get("FLEET_WORKER_TARGET") or cpu_target()
        try:
            p = check_problem(self.op_kind, job.problem)
            timing = measure(
                self.op_kind,
                p,
                dict(job.config),
                target,
                repeats=int(self.definition.get("repeats", 3)),
                min_repeat_ms=float(self.definition.get("min_repeat_ms", 20)),
                tick=job.tick,
                tick_seconds=job.tick_seconds,
            )
        except FleetError as error:  # TVM missing here, or a target TVM cannot build for
            return Measured(state=TrialState.ERRORED, reason=str(error))
        except Exception as error:  # a TVM build or run that failed: the trial's reason, not the worker's end
            text = str(error).strip().splitlines()
            return Measured(state=TrialState.ERRORED, reason=f"tvm: {text[-1] if text else type(error).__name__}"[:500])
        metrics = {"time_s": timing.seconds, "gflops": timing.gflops, "correct": timing.correct, "error": timing.error}
        samples = [timing.gflops * timing.seconds / s for s in timing.samples]
        state = TrialState.EVALUATED if timing.correct else TrialState.INVALID
        return Measured(state=state, objective=timing.gflops, samples=samples, metrics=metrics, reason=timing.reason)
