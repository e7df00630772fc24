"""Workloads: how each kind of problem is built and measured."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError
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
    if not isinstance(definition, Mapping):
        raise SpecError("the workload must be an object with a 'kind'")
    kind = definition.get("kind")
    if kind not in WORKLOADS:
        raise SpecError(f"unknown workload kind {kind!r} (known: {', '.join(sorted(WORKLOADS))})")
    return WORKLOADS[kind](definition)


__all__ = ["WORKLOADS", "Built", "Job", "Measured", "Workload", "load_workload"]
