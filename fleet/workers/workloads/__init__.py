"""Workloads on a worker: how each kind of problem is built and measured.

Each class here extends its definition in :mod:`fleet.spec.workloads` with ``build`` and ``evaluate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.spec.workloads import workload_class
from fleet.workers.workloads.base import Built, Job, Measured, Workload
from fleet.workers.workloads.command import CommandWorkload
from fleet.workers.workloads.miopen import MiopenWorkload
from fleet.workers.workloads.noop import NoopWorkload
from fleet.workers.workloads.replay import ReplayWorkload
from fleet.workers.workloads.tvm import TvmWorkload

WORKLOADS: dict[str, type[Workload]] = {
    w.kind: w for w in (CommandWorkload, MiopenWorkload, NoopWorkload, ReplayWorkload, TvmWorkload)
}


def load_workload(definition: Mapping[str, Any]) -> Workload:
    """The workload that ``definition`` describes; raises SpecError for an unknown or invalid one."""
    cls = workload_class(definition, WORKLOADS)
    assert issubclass(cls, Workload)
    return cls(definition)


__all__ = ["WORKLOADS", "Built", "Job", "Measured", "Workload", "load_workload"]
