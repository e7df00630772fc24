"""Which campaigns an answer may draw on (issue 44, item 5): the one rule, stated here and nowhere else.

An answer that combines campaigns (``fleet best --kind`` / ``--problem``, ``auto``'s history, the MIOpen exports
of a target, ``fleet.api.best``, the TVM lookups and records) draws only on the campaigns its asker names:
``--from CAMPAIGN[,..]`` on the command line, ``campaigns=`` in Python, a spec's ``"history": {"from": [...]}``, or
``all`` for every campaign, said on purpose. Named none, a command line's or the API's answer draws on the one
campaign that has results, and refuses in one line (naming them) when several have; a campaign's history draws on
no other campaign. A golden set draws on the campaigns ``--campaign`` names only. Each answer says the campaigns it
drew on. So a campaign whose workload prints ``-1e308`` changes the answers of those who name it, and of no one
else.

A measurement belongs to the campaign of the trial that measured it; a trial that reused another's measurement
reused it only because every input that decides it was the same (its measure key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fleet.errors import FleetError, SpecError

ALL = "all"
"""The name that says: every campaign, whoever ran it."""


@dataclass(frozen=True)
class Trusted:
    """The campaigns an asker named: ``names``, or every campaign when ``names`` is None (``all``)."""

    names: tuple[str, ...] | None

    @property
    def everyone(self) -> bool:
        return self.names is None


A = TypeVar("A")
B = TypeVar("B")


class Drawn(tuple[A, B]):
    """A pair an answer gives (a measurement and its configuration), and ``campaign``: the name of the campaign it
    was drawn from. Still a pair, so ``measurement, config = found[0]`` reads it as before."""

    campaign: str

    def __new__(cls, first: A, second: B, campaign: str) -> Drawn[A, B]:
        pair = super().__new__(cls, (first, second))
        pair.campaign = campaign
        return pair


def parse_from(text: str) -> Trusted:
    """``--from``'s value: ``all``, or campaign names separated by commas."""
    names = tuple(name.strip() for name in text.split(","))
    if names == (ALL,):
        return Trusted(None)
    if not all(names) or ALL in names:
        raise SpecError(f"--from {text!r}: give campaign names separated by commas, or 'all'")
    return Trusted(names)


def named(campaigns: str | Iterable[str] | None) -> Trusted | None:
    """The API's ``campaigns=``: None (name none), ``"all"``, names separated by commas, or a list of names.

    Parameters
    ----------
    campaigns:
        What the caller named; a list may not hold ``all`` or an empty name.
    """
    if campaigns is None:
        return None
    if isinstance(campaigns, str):
        return parse_from(campaigns)
    names = tuple(campaigns)
    if not names or not all(isinstance(n, str) and n and n != ALL for n in names):
        raise SpecError(f"campaigns={list(names)!r}: give campaign names, or 'all'")
    return Trusted(names)


def parse_history_from(value: object) -> Trusted:
    """A spec's ``"history": {"from": ...}``: ``"all"`` or a list of campaign names."""
    if value == ALL:
        return Trusted(None)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v and v != ALL for v in value):
        raise SpecError("'history' 'from' is \"all\" or a list of campaign names")
    return Trusted(tuple(value))


FROM = "--from CAMPAIGN[,..], or --from all"
"""How a command line names the campaigns to draw on (what a refusal tells its asker to give)."""


def choose(what: str, measured: Mapping[int, str], trusted: Trusted | None, how: str = FROM) -> list[int]:
    """The ids of the campaigns an answer about ``what`` draws on, of ``measured`` (id -> name: the campaigns
    holding results for it), given what the asker named (None: nothing named).

    Named nothing, the answer draws on the one campaign that measured it: several are refused in one line, since
    mixing them would let any of them decide the answer.

    Parameters
    ----------
    how:
        How the asker names campaigns, said in the refusal (``--from ...`` on a command line).
    """
    if trusted is None:
        if len(measured) > 1:
            names = ", ".join(sorted(measured.values()))
            raise FleetError(
                f"{what} has results from {len(measured)} campaigns ({names}); name those to draw on with {how}"
            )
        return list(measured)
    if trusted.everyone:
        return list(measured)
    return [campaign for campaign, name in measured.items() if name in set(trusted.names or ())]


class Campaigns(Protocol):
    """What :func:`resolve` asks of the store (named so, not imported: fleet.search's checks use this module and
    import no store)."""

    def campaign(self, ref: str | int) -> Any: ...


class Bests(Campaigns, Protocol):
    """What :func:`best` asks of the store."""

    def measuring_campaigns(self, problem_id: int, target: str) -> dict[int, str]: ...

    def best(
        self, problem_id: int, target: str, limit: int = 1, campaigns: Any = None
    ) -> list[tuple[Any, dict[str, Any]]]: ...

    def campaigns_of_trials(self, trial_ids: list[int]) -> dict[int, int]: ...


class Readers(Protocol):
    """What :func:`scope` asks of the store."""

    def reads_every_campaign(self) -> bool: ...

    def my_teams(self) -> list[str]: ...


def scope(store: Readers, trusted: Trusted | None) -> str | None:
    """The line that says what ``all`` drew on when the database shows the asker its teams' campaigns only (a team's
    login on PostgreSQL: row-level security, fleet.store._teams); None where ``all`` is every campaign."""
    if trusted is None or not trusted.everyone or store.reads_every_campaign():
        return None
    return f"--from all: the campaigns of your teams ({', '.join(store.my_teams())}), all this login may read"


def resolve(store: Campaigns, trusted: Trusted | None) -> None:
    """A named campaign that does not exist is the asker's mistake, said in one line (not an empty answer)."""
    if trusted is not None and trusted.names is not None:
        for name in trusted.names:
            store.campaign(name)  # NotFound: "no campaign 'x'", with the names it resembles


def best(
    store: Bests, problem_id: int, target: str, trusted: Trusted | None, limit: int = 1, *, what: str, how: str = FROM
) -> list[tuple[Any, dict[str, Any], str]]:
    """The best valid measurements of a problem on ``target`` among the campaigns ``trusted`` names (the one rule:
    :func:`choose`), best first, each with its configuration and the name of the campaign it came from.

    Every best of Fleet's measurements goes through here: ``fleet best``, ``fleet.api.best`` and the TVM lookups.

    Parameters
    ----------
    trusted:
        What the asker named; None: nothing (the one campaign that measured it, several refused).
    what:
        The problem as the refusal names it.
    how:
        How the asker names campaigns, said in the refusal.
    """
    resolve(store, trusted)
    names = store.measuring_campaigns(problem_id, target)
    drawn = choose(what, names, trusted, how)
    rows = store.best(problem_id, target, limit, campaigns=drawn) if drawn else []
    campaign_of = store.campaigns_of_trials([m.trial_id for m, _ in rows])
    return [(m, config, names[campaign_of[m.trial_id]]) for m, config in rows]
