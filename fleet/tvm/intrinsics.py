"""TVM's tensor intrinsics, defined a target's kind at a time: what MetaSchedule's tuning and the database's
traces (:mod:`fleet.tvm.msdb`) both need before they use a target."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fleet.tvm.available import require_tvm

# The tensor intrinsics each kind of TVM target's schedule rules use (tvm/s_tir/tensor_intrin/__init__.py imports
# them all; CUDA's take 18 s of CPU to define, the rest 5 s).
_INTRINSICS = {"llvm": ("x86", "arm_cpu", "riscv_cpu", "hexagon"), "cuda": ("cuda",), "rocm": ("rocm",)}


def load_intrinsics(target: Any) -> None:
    """Define the tensor intrinsics MetaSchedule may use for the TVM ``target``, and no others.

    MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which defines every target's intrinsics:
    22 s of CPU here (minutes on a loaded machine), 18 of them CUDA's, before the first candidate of a CPU tuning.
    Where that package is not imported yet, an empty one stands in for it, and only the target's kind's modules
    are imported (a later tuning for another kind imports its own); a kind not known here imports the whole
    package, as TVM does.
    """
    import importlib
    import types

    tvm = require_tvm()
    name = "tvm.s_tir.tensor_intrin"
    wanted = _INTRINSICS.get(str(tvm.target.Target(target).kind.name))
    partial = getattr(sys.modules.get(name), "fleet_partial", False)
    if wanted is None:
        if partial:
            del sys.modules[name]  # the real package then imports every kind's (those done already are kept)
        importlib.import_module(name)
        return
    if name in sys.modules and not partial:
        return  # all of them are there
    if name not in sys.modules:
        import tvm.s_tir  # type: ignore[no-redef]  # the submodule, on the package require_tvm gave

        package = types.ModuleType(name, "TVM's tensor intrinsics, imported a target's kind at a time by Fleet.")
        package.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
        package.fleet_partial = True  # type: ignore[attr-defined]  # our mark on a module of our making
        sys.modules[name] = package
        tvm.s_tir.tensor_intrin = package
    for module in wanted:
        importlib.import_module(f"{name}.{module}")
