"""A workload's several objectives: ``"objectives": [{"name": "time", "json": "ms", "goal": "min"}, ...]``.

Each one's value comes from the run's JSON line (``json``: a field of it) or from the GPU observer's readings while
the run went (``observer``: one of :data:`fleet.spec.workloads.command.OBSERVED`). The first objective is the
measurement's ``objective``, which every one-objective view (the best, the speedup, history) ranks by; all of them
are stored with the measurement, and the Pareto front is taken over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet.errors import SpecError, did_you_mean, shown
from fleet.objective import Objective

FIELDS = ("name", "json", "observer", "goal")

NAME_LENGTH = 64
"""What a measurement's ``objective_name`` column holds."""


def objective_of(definition: Mapping[str, Any]) -> Objective:
    """The :class:`Objective` of one checked objective definition: named by its ``name``, else its source."""
    name = definition.get("name") or definition.get("json") or definition.get("observer") or "objective"
    return Objective(str(name), definition.get("goal", "min") == "max")


def check_objectives(raw: Any, observed: Sequence[str]) -> list[Objective]:
    """The objectives of a workload's ``objectives`` field, or SpecError saying what is wrong, in one line.

    Parameters
    ----------
    raw:
        The field's value: a list of two or more objective definitions.
    observed:
        The readings an ``observer`` objective may name.
    """
    if not isinstance(raw, list) or len(raw) < 2:
        raise SpecError(
            "workload 'objectives' is a list of two or more objectives such as "
            '{"name": "time", "json": "ms", "goal": "min"}; a single one is the workload\'s \'objective\''
        )
    objectives: list[Objective] = []
    for index, definition in enumerate(raw):
        where = f"workload objective {index + 1}"
        if not isinstance(definition, Mapping):
            raise SpecError(f'{where} must be an object such as {{"name": "time", "json": "ms"}}')
        unknown = sorted(set(definition) - set(FIELDS))
        if unknown:
            raise SpecError(f"{where} has an unknown field {shown(unknown[0])}{did_you_mean(unknown[0], FIELDS)}")
        for field in ("name", "json", "observer"):
            value = definition.get(field)
            if field in definition and (not isinstance(value, str) or not value or len(value) > NAME_LENGTH):
                raise SpecError(f"{where}: {field!r} must be a non-empty string of at most {NAME_LENGTH} characters")
        if ("json" in definition) == ("observer" in definition):
            raise SpecError(
                f"{where} must name where its value comes from: a 'json' field of the run's line or an 'observer' "
                "reading, one of the two"
            )
        if definition.get("goal", "min") not in ("min", "max"):
            raise SpecError(f"{where}: 'goal' must be 'min' or 'max', not {shown(definition['goal'])}")
        reading = definition.get("observer")
        if reading is not None and reading not in observed:
            raise SpecError(
                f"{where}: 'observer' {reading!r} is no reading of a GPU observer{did_you_mean(reading, observed)}: "
                f"one of {', '.join(observed)}"
            )
        objective = objective_of(definition)
        if any(o.name == objective.name for o in objectives):
            raise SpecError(f"workload objective {objective.name!r} is named twice: each objective needs its own name")
        objectives.append(objective)
    if not any("json" in definition for definition in raw):
        raise SpecError("at least one of the workload's objectives must be a 'json' field of the run's line")
    return objectives
