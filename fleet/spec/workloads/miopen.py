"""The ``miopen`` workload's definition: ``{"kind": "miopen"}``, with optional timeouts in seconds.

The one knob, ``step``, is ``perf`` or ``find``; the problem is a canonical MIOpen problem. What a worker does
with it is in :mod:`fleet.workers.workloads.miopen`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError
from fleet.spec.workloads.base import WorkloadSpec

_KEYS = {"kind", "imported", "build_timeout", "run_timeout"}


class MiopenSpec(WorkloadSpec):
    """MIOpen's perf tuning and find step, run by MIOpenDriver on a worker (:mod:`fleet.workers.workloads.miopen`)."""

    kind = "miopen"

    def __init__(self, definition: Mapping[str, Any]) -> None:
        super().__init__(definition)
        self.refuse_unknown(_KEYS)
        for name in ("build_timeout", "run_timeout"):
            value = self.definition.get(name, 1)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"miopen workload {name!r} must be a positive number of seconds")

    @property
    def objective_name(self) -> str:
        return "time_ms"

    @property
    def maximize(self) -> bool:
        return False

    def check(self, knobs: list[str], problem: Mapping[str, Any]) -> None:
        if knobs != ["step"]:
            raise SpecError("the miopen workload takes one knob, 'step' (perf or find)")
