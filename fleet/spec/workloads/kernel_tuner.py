"""The ``kernel_tuner`` workload's definition: what `fleet import kt` writes for Kernel Tuner's results.

Nothing is built or run: an imported campaign is done when it is written. The definition says only how its
results read (``objective``: Kernel Tuner's objective as Fleet names it, and its direction).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError
from fleet.spec.workloads.base import WorkloadSpec


class KernelTunerSpec(WorkloadSpec):
    """Results imported from a Kernel Tuner cache or T4 file (:func:`fleet.interop.records.import_kt`)."""

    kind = "kernel_tuner"

    def __init__(self, definition: Mapping[str, Any]) -> None:
        super().__init__(definition)
        self.refuse_unknown({"kind", "imported", "objective"})
        if self.definition.get("imported") is not True:
            raise SpecError(
                "workload kind 'kernel_tuner' is results `fleet import kt` imported, nothing to run: a kernel is "
                "tuned from its T1 file (fleet tune KERNEL.json) or with a 'command' workload"
            )

    @property
    def objective_name(self) -> str:
        # Imports written before the definition named its objective were Kernel Tuner's time, in ms.
        return str(self.definition.get("objective", {}).get("name", "time_ms"))
