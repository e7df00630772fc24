"""Build an operator for a target, time it, and check its output against NumPy.

A Fleet target names the TVM target: ``cpu-*`` is LLVM for this host's CPU (its own ``mcpu``, so the vector
units are used), ``sm_XY`` is CUDA for that architecture, ``gfxNNN:CU`` is ROCm for that ``gfxNNN``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.errors import SpecError
from fleet.tvm.available import require_tvm
from fleet.tvm.operators import flops, output_shape, random_inputs, reference
from fleet.tvm.schedule import scheduled

TOLERANCE = 1e-3
"""Largest error allowed, relative to the largest magnitude of the reference output (float32 sums)."""

FAULT_VARIABLE = "FLEET_TVM_FAULT"
"""Fault injection for tests: ``reference`` perturbs the NumPy reference, so every result reads as wrong."""


def tvm_target(target: str) -> Any:
    """The ``tvm.target.Target`` that a Fleet target means, or :class:`SpecError` for one TVM cannot serve."""
    tvm = require_tvm()
    if target.startswith("cpu-"):
        cpu = tvm.get_global_func("target.llvm_get_system_cpu")()
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu} if cpu and cpu != "generic" else {"kind": "llvm"})
    if target.startswith("sm_"):
        return tvm.target.Target({"kind": "cuda", "arch": target})
    if target.startswith("gfx"):
        return tvm.target.Target({"kind": "rocm", "mcpu": target.split(":")[0]})
    raise SpecError(f"TVM cannot build for target {target!r}: expected cpu-*, sm_* or gfx*")


def device(target: str) -> Any:
    """The TVM device a target's operators run on (device 0: an evaluation worker sees only its own GPU)."""
    tvm = require_tvm()
    if target.startswith("cpu-"):
        return tvm.cpu(0)
    return tvm.cuda(0) if target.startswith("sm_") else tvm.rocm(0)


def toolchain() -> str:
    """TVM's and LLVM's versions: part of every TVM build key."""
    tvm = require_tvm()
    try:
        llvm = tvm.get_global_func("target.llvm_version_major")()
    except Exception:  # a TVM built without LLVM
        llvm = "none"
    return f"tvm {tvm.__version__} llvm {llvm}"


def build(kind: str, p: Mapping[str, Any], config: Mapping[str, Any] | None, target: str) -> Any:
    """The operator compiled for ``target`` with ``config`` (None: the untuned default), as a runtime module."""
    tvm = require_tvm()
    executable = tvm.compile(scheduled(kind, p, config, target), target=tvm_target(target))
    return executable.jit()


@dataclass
class Timing:
    """One measurement of one configuration.

    ``samples`` are seconds per run, one per repeat; ``correct`` says whether the output matched NumPy within
    :data:`TOLERANCE` (``error`` is the relative error found).
    """

    samples: list[float]
    gflops: float
    correct: bool
    error: float
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return statistics.median(self.samples)


def run_module(module: Any, kind: str, p: Mapping[str, Any], inputs: list[Any], target: str) -> tuple[Any, Any]:
    """Run a built module once on ``inputs``; return the output (NumPy) and the device arrays used."""
    tvm = require_tvm()
    dev = device(target)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    out = tvm.runtime.empty(output_shape(kind, p), p["dtype"], dev)
    module["main"](*args, out)
    dev.sync()
    return out.numpy(), [*args, out]


def relative_error(output: Any, expected: Any) -> float:
    import numpy as np

    scale = max(float(np.max(np.abs(expected))), 1.0) if expected.size else 1.0
    difference = np.abs(output.astype("float64") - expected.astype("float64"))
    if not np.all(np.isfinite(difference)):
        return float("inf")
    return float(np.max(difference)) / scale if difference.size else 0.0


def time_module(module: Any, target: str, arrays: list[Any], repeats: int, min_repeat_ms: float) -> list[float]:
    """Seconds per run, ``repeats`` times, each repeat running enough times to last ``min_repeat_ms``."""
    timer = module.time_evaluator("main", device(target), number=1, repeat=repeats, min_repeat_ms=int(min_repeat_ms))
    return [float(s) for s in timer(*arrays).results]


def measure(
    kind: str,
    p: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    target: str,
    *,
    repeats: int = 3,
    min_repeat_ms: float = 20.0,
    tick: Callable[[], Any] | None = None,
    tick_seconds: float = 5.0,
) -> Timing:
    """Build, check and time one configuration on this machine.

    Parameters
    ----------
    kind, p:
        The problem.
    config:
        The knob values, or None for the untuned default schedule.
    target:
        The Fleet target this machine evaluates for.
    repeats, min_repeat_ms:
        Timed repeats after a warm-up run, each at least this long (short operators run several times a repeat).
    tick:
        Called every ``tick_seconds`` while TVM works (a build is one long C call), to keep a worker's lease.
    """
    stop = threading.Event()
    if tick is not None:

        def keep_alive() -> None:
            while not stop.wait(tick_seconds):
                tick()

        threading.Thread(target=keep_alive, name="fleet-tvm-tick", daemon=True).start()
    try:
        # NumPy first: its threads have gone idle by the time TVM's run, so they do not compete for the cores.
        inputs = random_inputs(kind, p)
        expected = reference(kind, p, inputs)
        if os.environ.get(FAULT_VARIABLE) == "reference":
            expected = expected + 1.0
        module = build(kind, p, config, target)
        output, arrays = run_module(module, kind, p, inputs, target)  # also the warm-up
        error = relative_error(output, expected)
        samples = time_module(module, target, arrays, repeats, min_repeat_ms)
    finally:
        stop.set()
    correct = error <= TOLERANCE
    gflops = flops(kind, p) / statistics.median(samples) / 1e9
    reason = None if correct else f"wrong result: relative error {error:.3g} against NumPy (tolerance {TOLERANCE})"
    return Timing(samples, gflops, correct, error, reason)


def numpy_seconds(call: Callable[[], Any], repeats: int = 5, min_seconds: float = 0.2) -> float:
    """Median seconds of ``call`` after a warm-up, each repeat lasting at least ``min_seconds`` / ``repeats``."""
    call()
    samples = []
    for _ in range(repeats):
        runs, started = 0, time.perf_counter()
        while True:
            call()
            runs += 1
            elapsed = time.perf_counter() - started
            if elapsed >= min_seconds / repeats:
                break
        samples.append(elapsed / runs)
    return statistics.median(samples)
