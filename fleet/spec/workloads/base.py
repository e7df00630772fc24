"""What every workload definition is: a validated JSON object with an objective and a direction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from fleet.errors import SpecError, did_you_mean
from fleet.objective import Objective


class WorkloadSpec:
    """One kind of build-and-measure, as a campaign describes it.

    Parameters
    ----------
    definition:
        The workload's JSON definition, as a campaign stores it. Constructing the spec validates it, so a bad
        spec fails on the user's side before anything is written. What a worker does with it lives in
        :mod:`fleet.workers.workloads`.
    """

    kind: ClassVar[str]

    def __init__(self, definition: Mapping[str, Any]) -> None:
        self.definition = dict(definition)

    def refuse_unknown(self, known: set[str], hint: str = "") -> None:
        """Raise SpecError naming the first field of the definition outside ``known`` (a typo, usually)."""
        unknown = sorted(set(self.definition) - known)
        if unknown:
            hint = did_you_mean(unknown[0], known) or hint
            raise SpecError(f"{self.kind} workload has an unknown field {unknown[0]!r}{hint}")

    @property
    def objective_name(self) -> str:
        return str(self.definition.get("objective", {}).get("name", "objective"))

    @property
    def maximize(self) -> bool:
        return self.definition.get("objective", {}).get("goal", "min") == "max"

    @property
    def objectives(self) -> list[Objective]:
        """Every objective, in order: the first is the measurement's ``objective``. One, unless the workload
        names several (the command workload's ``objectives``)."""
        return [Objective(self.objective_name, self.maximize)]

    def toolchain(self) -> str:
        """The versions of the tools that build and run this workload, as text.

        Run by the build worker, on its machine, never where the campaign is submitted: the artifact's key
        and provenance carry it.
        """
        return ""

    def toolchain_key(self) -> str:
        """What :meth:`toolchain` depends on: a worker runs it once per process for each distinct key."""
        return self.kind

    def check(self, knobs: list[str], problem: Mapping[str, Any]) -> None:
        """Raise SpecError if the definition names a knob or parameter that does not exist."""
