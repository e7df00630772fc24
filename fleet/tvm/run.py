"""Run a model's operators with their best configurations, against the default schedule and NumPy."""

from __future__ import annotations

from typing import Any

from fleet.tvm.models import Layer


def run_layers(store: Any, layers: list[Layer], target: str, *, repeats: int = 5) -> list[dict[str, Any]]:
    """Per layer: seconds of the untuned default schedule, of the best configuration (the default where there is
    none), and of NumPy, on this machine; each output checked against NumPy.

    Parameters
    ----------
    store:
        Where the best configurations are.
    target:
        The target they were tuned for; this machine must run it.
    """
    from fleet.errors import WorkloadError
    from fleet.tvm.best import best
    from fleet.tvm.measure import TOLERANCE, build, numpy_seconds, relative_error, run_module, time_module
    from fleet.tvm.operators import describe, random_inputs, reference

    rows = []
    for layer in layers:
        kind, p = layer.kind, layer.params
        inputs = random_inputs(kind, p)
        expected = reference(kind, p, inputs)
        found = best((kind, p), target, store)
        times = {}
        for name, config in (("default", None), ("tuned", found[0][0] if found else None)):
            if name == "tuned" and config is None:
                times[name] = times["default"]
                continue
            module = build(kind, p, config, target)
            output, arrays = run_module(module, kind, p, inputs, target)
            error = relative_error(output, expected)
            if error > TOLERANCE:
                raise WorkloadError(f"{layer.name}: the {name} schedule gives a wrong result (error {error:.3g})")
            times[name] = min(time_module(module, target, arrays, repeats, 10.0))
        rows.append(
            {
                "layer": layer.name,
                "operator": describe(kind, p),
                "default_s": times["default"],
                "tuned_s": times["tuned"],
                "numpy_s": numpy_seconds(lambda: reference(kind, p, inputs), repeats=repeats),  # noqa: B023
                "tuned": bool(found),
                "source": " ".join(f"{k}={v}" for k, v in found[0][0].items()) if found else "default",
            }
        )
    return rows
