"""Workload definitions: what each kind of build-and-measure takes, validated on the user's side.

What a worker does with a definition is in :mod:`fleet.workers.workloads`; the driver and the CLI use only
this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError
from fleet.spec.workloads.base import WorkloadSpec
from fleet.spec.workloads.command import CommandSpec
from fleet.spec.workloads.kernel_tuner import KernelTunerSpec
from fleet.spec.workloads.miopen import MiopenSpec
from fleet.spec.workloads.noop import NoopSpec
from fleet.spec.workloads.replay import ReplaySpec
from fleet.spec.workloads.tvm import TvmSpec

SPECS: dict[str, type[WorkloadSpec]] = {
    s.kind: s for s in (CommandSpec, KernelTunerSpec, MiopenSpec, NoopSpec, ReplaySpec, TvmSpec)
}


def workload_class(definition: Any, classes: Mapping[str, type[WorkloadSpec]]) -> type[WorkloadSpec]:
    """The class in ``classes`` for ``definition``'s kind; SpecError for a definition with no known kind."""
    if not isinstance(definition, Mapping):
        raise SpecError("the workload must be an object with a 'kind'")
    kind = definition.get("kind")
    if kind not in classes:
        raise SpecError(f"unknown workload kind {kind!r} (known: {', '.join(sorted(classes))})")
    return classes[str(kind)]


def load_workload_spec(definition: Mapping[str, Any]) -> WorkloadSpec:
    """The validated definition ``definition`` describes; raises SpecError for an unknown or invalid one."""
    return workload_class(definition, SPECS)(definition)


__all__ = ["SPECS", "CommandSpec", "WorkloadSpec", "load_workload_spec", "workload_class"]
