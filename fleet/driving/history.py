"""A campaign's history: what the store holds of related problems, ranked for this campaign's space.

The glue between the store (:meth:`fleet.store.Store.history`) and the pure ranking of
:mod:`fleet.search.history`: the campaign driver calls :func:`campaign_history` for each problem of an ``auto``
campaign and hands the result to the strategy as its ``history`` option. A spec turns it off with
``"history": false``, or narrows it with ``"history": {"targets": [...], "tags": [...]}``. It draws only on the
campaigns the spec names, ``"history": {"from": ["a", "b"]}`` or ``{"from": "all"}``, and on none otherwise
(fleet.trust's rule: another campaign's numbers steer this one's search only when its submitter said so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.search.history import Source, first_count, to_options, transfer
from fleet.space import Space
from fleet.store import Campaign, Problem, Store
from fleet.trust import parse_history_from


def campaign_history(
    store: Store, campaign: Campaign, problem: Problem, space: Space, maximize: bool
) -> dict[str, Any] | None:
    """``auto``'s ``history`` option for ``problem`` of ``campaign``: the best configurations of related problems
    (same kind: other targets, parameters, toolchains; of the campaigns its spec names, never its own trials),
    ranked for ``space``; None when history is off, names no campaign, or nothing related is stored.

    Parameters
    ----------
    store:
        The database.
    campaign:
        The campaign (its options hold the spec's ``history``).
    problem:
        One of its problems.
    space:
        Its space: sources that share no knob with it are left out.
    maximize:
        Its direction.
    """
    setting = campaign.options.get("history", True)
    narrow = setting if isinstance(setting, Mapping) else {}
    if setting is False or "from" not in narrow:
        return None  # no campaign named: history draws on none (fleet.trust)
    trusted = parse_history_from(narrow["from"])
    campaigns = None if trusted.names is None else [c.id for c in store.campaigns() if c.name in trusted.names]
    found = store.history(
        problem.kind,
        maximize=maximize,
        exclude_campaign=campaign.id,
        targets=narrow.get("targets"),
        tags=narrow.get("tags"),
        campaigns=campaigns,
    )
    names = set(space.names)
    sources = [Source(s.name, tuple(s.runs), maximize) for s in found if any(names & set(c) for c, _ in s.runs)]
    transferred = transfer(space, sources)
    if not transferred:
        return None
    return to_options(transferred, first_count(transferred))
