"""The ``tvm`` workload: build a TVM operator with the trial's knobs for the worker's target, time it, check it.

Definition (JSON)::

    {"kind": "tvm", "op": "conv2d", "repeats": 3, "min_repeat_ms": 20}

``op`` is ``dense``, ``batch_matmul`` or ``conv2d``; the problem's parameters are its shape (see
:mod:`fleet.tvm.operators`). The TVM build happens on the evaluation worker, for the target that worker
registered with (``FLEET_WORKER_TARGET``, else the trial's): the "artifact" of the build step is only the
configuration, so nothing TVM built has to travel between machines. The objective is GFLOPS (higher is better),
one sample per repeat; the metrics hold the median time in seconds, the GFLOPS, whether the output matched NumPy
and the relative error. A wrong output makes the trial ``invalid``, never a best. Without TVM installed, the
workload fails with one message saying how to install it, on the user's side as on a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import SpecError
from fleet.spec.workloads.base import WorkloadSpec

_KEYS = {"kind", "op", "repeats", "min_repeat_ms"}


class TvmSpec(WorkloadSpec):
    """A TVM operator schedule measured on a worker's device; see the module docstring."""

    kind = "tvm"

    def __init__(self, definition: Mapping[str, Any]) -> None:
        from fleet.tvm.operators import KIND_OF_OP

        super().__init__(definition)
        self.refuse_unknown(_KEYS)
        if self.definition.get("op") not in KIND_OF_OP:
            raise SpecError(f"tvm workload needs 'op': one of {', '.join(sorted(KIND_OF_OP))}")
        repeats = self.definition.get("repeats", 3)
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise SpecError("tvm workload 'repeats' must be an integer >= 1")
        ms = self.definition.get("min_repeat_ms", 20)
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise SpecError("tvm workload 'min_repeat_ms' must be a number >= 0")
        self.op_kind = KIND_OF_OP[self.definition["op"]]

    @property
    def objective_name(self) -> str:
        return "gflops"

    @property
    def maximize(self) -> bool:
        return True

    def toolchain(self) -> str:
        from fleet.tvm.measure import toolchain

        return toolchain()

    def check(self, knobs: list[str], problem: Mapping[str, Any]) -> None:
        from fleet.tvm.operators import check_problem

        check_problem(self.op_kind, problem)
