"""One objective of a campaign: its name and which way is better.

A module of its own, below the searchers: a workload's spec, a replay and the report name their objectives
without importing :mod:`fleet.search`, whose package imports every searcher (issue 42, item 12).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    """One objective of a campaign, as the searchers and the views of the front see it.

    Parameters
    ----------
    name:
        What the spec calls it (``time``, ``energy``); a run's ``objectives`` are keyed by it.
    maximize:
        True when a larger value is better (GFLOPS), False for times and energies.
    """

    name: str
    maximize: bool = False
