"""The best-configuration database: per (operator problem, target), the best known knobs and their measurement.

The answers come from the store's measurements (valid ones only: a wrong result is never a best), whether they
were measured by this site's workers or imported from another site's records (:mod:`fleet.tvm.records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleet.errors import NotFound, SpecError
from fleet.trust import Drawn, Trusted, named
from fleet.trust import best as trusted_best
from fleet.tvm.operators import KINDS, check_problem, describe


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


Known = Drawn[dict[str, Any], Any]
"""One best known configuration: the pair ``(knobs, measurement)``, and ``.campaign``, the campaign that measured it."""


def best(
    problem: Any,
    target: str,
    store: Any = None,
    limit: int = 1,
    *,
    campaigns: str | Iterable[str] | Trusted | None = None,
    how: str = "campaigns=[...] or campaigns='all'",
) -> list[Known]:
    """The best known configurations of a TVM problem on ``target`` among the campaigns named, best first:
    (knobs, measurement) pairs that say their ``campaign``.

    Parameters
    ----------
    campaigns:
        The campaigns to draw on (fleet.trust's rule): names, names separated by commas, ``"all"``, or a
        :class:`~fleet.trust.Trusted`. None: the one campaign that measured the problem; several are refused.
    how:
        How the caller names campaigns, said when several are refused.
    """
    from fleet.store import connect

    store = store or connect()
    problem_id, kind, p = resolve(store, problem)
    if problem_id is None:
        return []
    trusted = campaigns if isinstance(campaigns, Trusted) else named(campaigns)
    what = f"problem {problem_id} ({describe(kind, p)}) on {target}"
    rows = trusted_best(store, problem_id, target, trusted, limit, what=what, how=how)
    return [Drawn(config, measurement, campaign) for measurement, config, campaign in rows]


@dataclass
class Compiled:
    """An operator built with the best known configuration, ready to run on this machine.

    ``module`` is TVM's runtime module (its function is ``main``: the inputs, then the output to write);
    ``campaign`` the campaign that measured its configuration.
    """

    kind: str
    params: dict[str, Any]
    target: str
    config: dict[str, Any]
    measurement: Any
    module: Any
    campaign: str = ""

    def __call__(self, *inputs: Any) -> Any:
        """Run on NumPy inputs and return the output as a NumPy array."""
        from fleet.tvm.measure import run_module

        output, _ = run_module(self.module, self.kind, self.params, list(inputs), self.target)
        return output


def build_best(
    problem: Any, target: str, store: Any = None, *, campaigns: str | Iterable[str] | None = None
) -> Compiled:
    """Build ``problem`` for ``target`` with its best known configuration, without tuning anything.

    Parameters
    ----------
    problem:
        A problem id, ``(kind, params)`` or ``{"kind": ..., "params": ...}``.
    target:
        The Fleet target the configuration was tuned for, and that this machine runs.
    store:
        The database; the environment's by default.
    campaigns:
        The campaigns whose measurements to draw on, as :func:`best` takes them (default: the one that measured it).
    """
    from fleet.store import connect
    from fleet.tvm.measure import build

    store = store or connect()
    problem_id, kind, p = resolve(store, problem)
    found = best(problem_id, target, store, campaigns=campaigns) if problem_id is not None else []
    if not found:
        raise NotFound(f"no valid measurement of {kind} {p} on {target}: tune it first")
    config, measurement = found[0]
    return Compiled(kind, p, target, dict(config), measurement, build(kind, p, config, target), found[0].campaign)


def metaschedule_rows(
    store: Any, kind: str, params: Mapping[str, Any], target: str, limit: int = 1
) -> list[dict[str, Any]]:
    """``fleet best``'s rows for the fastest MetaSchedule records of a TVM problem on ``target`` (none when TVM is
    not installed here, or the store has none): as its rows of Fleet's measurements, in GFLOPS, with
    ``"source": "metaschedule"``, the record's id and its trace's length."""
    from fleet.tvm.available import TvmMissing, check_tvm
    from fleet.tvm.msdb import best_records
    from fleet.tvm.operators import flops

    try:
        check_tvm()
    except TvmMissing:
        return []
    p = check_problem(kind, params)
    rows = []
    for found in best_records(store, kind, p, target, limit):
        where = found.provenance
        rows.append(
            {
                "problem": None,
                "kind": kind,
                "params": p,
                "target": target,
                "source": "metaschedule",
                "record": found.record_id,
                "config": None,
                "steps": len(found.schedule.trace.insts),
                "gflops": flops(kind, p) / found.mean_seconds / 1e9,
                "metrics": {"time_s": found.mean_seconds, "run_secs": found.run_secs},
                "samples": found.run_secs,
                "trial": where.get("trial"),
                "node": where.get("node"),
                "gpu": where.get("gpu"),
                "worker": where.get("worker") or where.get("source"),
                "toolchain": f"tvm {where['tvm']}" if where.get("tvm") else None,
                "measured_at": found.created_at.isoformat(timespec="seconds"),
            }
        )
    return rows
