"""Run a model's operators with their best configurations, against the default schedule and NumPy."""

from __future__ import annotations

from typing import Any

from fleet.trust import FROM, Trusted
from fleet.tvm.models import Layer


def run_layers(
    store: Any, layers: list[Layer], target: str, *, repeats: int = 5, trusted: Trusted | None = None
) -> list[dict[str, Any]]:
    """Per layer: seconds of the untuned default schedule, of the best schedule (the default where there is none),
    and of NumPy, on this machine; each output checked against NumPy.

    The best schedule is the fastest MetaSchedule record of the layer's operator on the target where there is one
    (``fleet tvm tune-ms``, ``import-ms``: :func:`fleet.tvm.msdb.best_records`), else the best configuration of
    Fleet's own space, among the campaigns ``trusted`` names (fleet.trust's rule); each row's ``schedule`` says
    which (``metaschedule``, ``fleet`` or ``default``), its ``source`` which record or knobs, and ``campaign`` the
    campaign that measured Fleet's.

    Parameters
    ----------
    store:
        Where the best configurations are.
    target:
        The target they were tuned for; this machine must run it.
    trusted:
        The campaigns ``--from`` names; None: for each layer, the one campaign that measured it.
    """
    from fleet.errors import WorkloadError
    from fleet.tvm.best import best
    from fleet.tvm.measure import TOLERANCE, build, numpy_seconds, relative_error, run_module, time_module
    from fleet.tvm.msdb import best_records
    from fleet.tvm.operators import describe, random_inputs, reference

    rows = []
    for layer in layers:
        kind, p = layer.kind, layer.params
        inputs = random_inputs(kind, p)
        expected = reference(kind, p, inputs)
        records = best_records(store, kind, p, target)
        found = [] if records else best((kind, p), target, store, campaigns=trusted, how=FROM)
        if records:
            schedule, source = "metaschedule", records[0].describe()
        elif found:
            schedule, source = "fleet", " ".join(f"{k}={v}" for k, v in found[0][0].items())
        else:
            schedule, source = "default", "default"
        times: dict[str, float] = {}
        for name in ("default", "tuned"):
            if name == "tuned" and schedule == "default":
                times[name] = times["default"]
                continue
            if name == "tuned" and records:
                module = records[0].build(target)
            else:
                module = build(kind, p, found[0][0] if name == "tuned" else None, target)
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
                "tuned": schedule != "default",
                "schedule": schedule,
                "source": source,
                "campaign": found[0].campaign if found else None,
            }
        )
    return rows
