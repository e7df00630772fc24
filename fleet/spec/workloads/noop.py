"""The ``noop`` workload's definition: ``{"kind": "noop"}``. It builds and measures nothing."""

from __future__ import annotations

from fleet.spec.workloads.base import WorkloadSpec


class NoopSpec(WorkloadSpec):
    """Times the fleet's own overhead: each build returns the configuration, each evaluation measures 0."""

    kind = "noop"
