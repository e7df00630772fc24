"""The best-configuration database: per (operator problem, target), the best known knobs and their measurement.

The answers come from the store's measurements (valid ones only: a wrong result is never a best), whether they
were measured by this site's workers or imported from another site's records (:mod:`fleet.tvm.records`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.errors import NotFound, SpecError
from fleet.tvm.operators import KINDS, check_problem


def resolve(store: Any, problem: Any) -> tuple[int | None, str, dict[str, Any]]:
    """(problem id or None if never stored, kind, canonical params) of an id, a (kind, params) pair or a dict.

    Parameters
    ----------
    problem:
        A problem id, ``(kind, params)``, or ``{"kind": ..., "params": {...}}``.
    """
    if isinstance(problem, int) and not isinstance(problem, bool):
        found = store.problem(problem)
        if found.kind not in KINDS:
            raise SpecError(f"problem {problem} is a {found.kind} problem, not a TVM operator")
        return found.id, found.kind, check_problem(found.kind, found.params)
    if isinstance(problem, Mapping):
        kind, params = problem.get("kind"), problem.get("params", {})
    elif isinstance(problem, tuple) and len(problem) == 2:
        kind, params = problem
    else:
        raise SpecError(f"{problem!r} is not a problem: give an id, (kind, params) or {{'kind': ..., 'params': ...}}")
    p = check_problem(str(kind), params)
    matches = [q for q in store.find_problems(kind=kind, params=p) if q.params == p]
    return (matches[0].id if matches else None), str(kind), p


def best(problem: Any, target: str, store: Any = None, limit: int = 1) -> list[tuple[dict[str, Any], Any]]:
    """The best known configurations of a TVM problem on ``target``, best first: (knobs, measurement) pairs."""
    from fleet.store import connect

    store = store or connect()
    problem_id, _, _ = resolve(store, problem)
    if problem_id is None:
        return []
    return [(config, measurement) for measurement, config in store.best(problem_id, target, limit)]


@dataclass
class Compiled:
    """An operator built with the best known configuration, ready to run on this machine.

    ``module`` is TVM's runtime module (its function is ``main``: the inputs, then the output to write).
    """

    kind: str
    params: dict[str, Any]
    target: str
    config: dict[str, Any]
    measurement: Any
    module: Any

    def __call__(self, *inputs: Any) -> Any:
        """Run on NumPy inputs and return the output as a NumPy array."""
        from fleet.tvm.measure import run_module

        output, _ = run_module(self.module, self.kind, self.params, list(inputs), self.target)
        return output


def build_best(problem: Any, target: str, store: Any = None) -> Compiled:
    """Build ``problem`` for ``target`` with its best known configuration, without tuning anything.

    Parameters
    ----------
    problem:
        A problem id, ``(kind, params)`` or ``{"kind": ..., "params": ...}``.
    target:
        The Fleet target the configuration was tuned for, and that this machine runs.
    store:
        The database; the environment's by default.
    """
    from fleet.store import connect
    from fleet.tvm.measure import build

    store = store or connect()
    problem_id, kind, p = resolve(store, problem)
    found = best(problem_id, target, store) if problem_id is not None else []
    if not found:
        raise NotFound(f"no valid measurement of {kind} {p} on {target}: tune it first")
    config, measurement = found[0]
    return Compiled(kind, p, target, dict(config), measurement, build(kind, p, config, target))
