"""Specs: what a campaign is (problems, target, space, strategy, workload), validated on the user's side.

Nothing here writes to the database, sends a message or runs a workload: the driver
(:mod:`fleet.driving.campaign`) and the workers (:mod:`fleet.workers`) both build on it.

The names are imported when first used, not with the package: a read command that needs a workload's spec alone
(``fleet best``, ``status CAMPAIGN``, ``report``) imports :mod:`fleet.spec.workloads`, which would otherwise bring
the campaign's spec, every searcher and the bundles with it (issue 42, item 12).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.lazy import lazy_names

if TYPE_CHECKING:
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

_HOMES = {
    "fleet.spec.campaign": (
        "CampaignSpec",
        "ProblemSpec",
        "chains_on_fleet",
        "digest_bytes",
        "load_spec",
        "new_searcher",
        "parse_spec",
    ),
    "fleet.spec.workloads": ("WorkloadSpec", "load_workload_spec"),
    "fleet.targets": ("TARGET", "check_target", "cpu_target"),
}

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

__getattr__ = lazy_names(__name__, globals(), _HOMES)
