"""The ``replay`` workload: answer a configuration with the time recorded for it in a tuning space.

Definition (JSON)::

    {"kind": "replay", "space": "pnpoly__RTX_2080_Ti.json.gz"}

``space`` is an absolute path or a file name in the tuning-spaces folder (``FLEET_TUNING_SPACES``, default the
repository's ``examples/tuning-spaces``, see :func:`fleet.replay.tuning_spaces_dir`; ``.json.gz`` may be left
out), resolved where the workload runs. Nothing is built or run: the build returns the configuration as the
artifact, and the evaluation answers the recorded time in ms as the objective ``time_ms`` (lower is better). A
configuration recorded with an error string, or not recorded at all (the space's restrictions exclude it), is an
invalid measurement. The recorded compile and benchmark seconds go into the metrics, with ``simulated_s``, what
the evaluation would have cost, so that a campaign on the fleet's real workers can be put on a simulated clock as
:func:`fleet.replay.simulate` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleet.errors import SpecError
from fleet.spec.workloads.base import WorkloadSpec

if TYPE_CHECKING:  # fleet.replay imports the searchers: only a replay workload needs it, not every workload's spec
    from fleet.replay import RecordedSpace

_KEYS = {"kind", "space"}


class ReplaySpec(WorkloadSpec):
    """Recorded times as measurements; see the module docstring."""

    kind = "replay"

    def __init__(self, definition: Mapping[str, Any]) -> None:
        super().__init__(definition)
        self.refuse_unknown(_KEYS, " (it takes 'space')")
        space = self.definition.get("space")
        if not isinstance(space, str) or not space:
            raise SpecError("replay workload needs 'space': a recorded tuning space's file name or path")
        from fleet.replay import resolve_space

        # Checked here, so that a spec naming a missing file fails on the user's side; loaded only when used.
        self.path = resolve_space(space)

    @property
    def objective_name(self) -> str:
        return "time_ms"

    @property
    def maximize(self) -> bool:
        return False

    @property
    def recorded(self) -> RecordedSpace:
        from fleet.replay import load_recorded

        return load_recorded(self.path)

    def toolchain(self) -> str:
        # Part of the artifact's key: results replayed from another file are other results.
        return f"replay {self.path.name}"

    def toolchain_key(self) -> str:
        return f"replay {self.path}"

    def check(self, knobs: list[str], problem: Mapping[str, Any]) -> None:
        names = self.recorded.names
        for name in knobs:
            if name not in names:
                raise SpecError(f"knob {name!r} is not a knob of recorded space {self.path.name} ({', '.join(names)})")
        missing = [name for name in names if name not in knobs]
        if missing:
            raise SpecError(f"the space lacks knob {missing[0]!r} of recorded space {self.path.name}")
