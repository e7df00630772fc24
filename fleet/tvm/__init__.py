"""TVM operators tuned on the fleet, and the best-configuration database built from their measurements.

TVM is an optional extra (``pip install 'fleet-tune[tvm]'``): nothing here imports it until an operator is
built, and :func:`require_tvm` turns its absence into one clear error.

- :mod:`fleet.tvm.operators`: the operator problems (dense, batch_matmul, conv2d), their TE definitions and
  their NumPy references;
- :mod:`fleet.tvm.spaces`: the knob space of a problem, derived from its shape, with constraints;
- :mod:`fleet.tvm.schedule`: applies knob values to a TE definition with ``tvm.s_tir``;
- :mod:`fleet.tvm.measure`: builds for a target, times, and checks against NumPy;
- :mod:`fleet.tvm.intrinsics`: TVM's tensor intrinsics, defined one target's kind at a time;
- :mod:`fleet.tvm.models`: named models, as lists of operator problems;
- :mod:`fleet.tvm.records`: JSON-lines export and import of measured configurations;
- :mod:`fleet.tvm.best`: the best known configuration of a problem on a target, and :func:`build_best`.
"""

from __future__ import annotations

from typing import Any

from fleet.tvm.available import MISSING_MESSAGE, TvmMissing, check_tvm, require_tvm


def build_best(problem: Any, target: str, store: Any = None, *, campaigns: Any = None) -> Any:
    """The operator compiled with the best known configuration for ``target`` among ``campaigns`` (names, or
    ``"all"``; default: the one campaign that measured it), ready to run; see :mod:`.best`."""
    from fleet.tvm.best import build_best as build

    return build(problem, target, store=store, campaigns=campaigns)


__all__ = ["MISSING_MESSAGE", "TvmMissing", "build_best", "check_tvm", "require_tvm"]
