"""Specs: what a campaign is (problems, target, space, strategy, workload), validated on the user's side.

Nothing here writes to the database, sends a message or runs a workload: the driver
(:mod:`fleet.driving.campaign`) and the workers (:mod:`fleet.workers`) both build on it.
"""

from fleet.spec.campaign import (
    CampaignSpec,
    ProblemSpec,
    chains_on_fleet,
    digest_bytes,
    load_spec,
    new_searcher,
    parse_spec,
)
from fleet.spec.workloads import WorkloadSpec, load_workload_spec
from fleet.targets import TARGET, check_target, cpu_target

__all__ = [
    "TARGET",
    "CampaignSpec",
    "ProblemSpec",
    "WorkloadSpec",
    "chains_on_fleet",
    "check_target",
    "cpu_target",
    "digest_bytes",
    "load_spec",
    "load_workload_spec",
    "new_searcher",
    "parse_spec",
]
