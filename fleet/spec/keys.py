"""The keys that decide reuse: a build key per artifact, a measure key per measurement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.space import Config, Space, digest

if TYPE_CHECKING:
    from fleet.store import Campaign


def trial_keys(campaign: Campaign, problem_id: int, config: Config, space: Space) -> tuple[str, str]:
    """The build key (what decides the artifact) and the measure key (what decides the measurement)."""
    toolchain = campaign.provenance.get("toolchain", "")
    build_workload = {
        k: v for k, v in campaign.workload.items() if k not in ("run", "repeats", "warmup", "run_timeout", "objective")
    }
    build_key = digest(["build", problem_id, campaign.target, space.build_part(config), toolchain, build_workload])
    measure_key = digest(["measure", problem_id, campaign.target, config, toolchain, campaign.workload])
    return build_key, measure_key
