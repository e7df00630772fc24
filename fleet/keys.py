"""The keys that decide reuse: a build key per artifact, a measure key per measurement.

Neither holds a toolchain or a device: those are facts of the worker that builds or measures, unknown when
a trial is created. An artifact is found by its build key and its builder's toolchain, and a measurement is
reused by its measure key, toolchain and device kind (see :meth:`fleet.store.Store.claim`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.canonical import digest
from fleet.space import Config, Space

if TYPE_CHECKING:
    from fleet.store import Campaign


def trial_keys(campaign: Campaign, problem_id: int, config: Config, space: Space) -> tuple[str, str]:
    """The build key (what decides the artifact) and the measure key (what decides the measurement)."""
    # An imported campaign's provenance names where its results came from (a file, a TVM log): the keys
    # keep them apart. A campaign submitted to the workers has none.
    source = campaign.provenance.get("toolchain", "")
    build_workload = {
        k: v for k, v in campaign.workload.items() if k not in ("run", "repeats", "warmup", "run_timeout", "objective")
    }
    build_key = digest(["build", problem_id, campaign.target, space.build_part(config), source, build_workload])
    measure_key = digest(["measure", problem_id, campaign.target, config, source, campaign.workload])
    return build_key, measure_key
