"""Which campaigns an answer may draw on (issue 44, item 5): the one rule, stated here and nowhere else.

An answer that combines campaigns (``fleet best --kind`` / ``--problem``, ``auto``'s history, the MIOpen exports
of a target) draws only on the campaigns its asker names: ``--from CAMPAIGN[,..]`` on the command line, a spec's
``"history": {"from": [...]}``, or ``all`` for every campaign, said on purpose. Named none, a command line's answer
draws on the one campaign that has results, and refuses in one line (naming them) when several have; a campaign's
history draws on no other campaign. A golden set draws on the campaigns ``--campaign`` names only. So a campaign
whose workload prints ``-1e308`` changes the answers of those who name it, and of no one else.

A measurement belongs to the campaign of the trial that measured it; a trial that reused another's measurement
reused it only because every input that decides it was the same (its measure key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


def parse_from(text: str) -> Trusted:
    """``--from``'s value: ``all``, or campaign names separated by commas."""
    names = tuple(name.strip() for name in text.split(","))
    if names == (ALL,):
        return Trusted(None)
    if not all(names) or ALL in names:
        raise SpecError(f"--from {text!r}: give campaign names separated by commas, or 'all'")
    return Trusted(names)


def parse_history_from(value: object) -> Trusted:
    """A spec's ``"history": {"from": ...}``: ``"all"`` or a list of campaign names."""
    if value == ALL:
        return Trusted(None)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v and v != ALL for v in value):
        raise SpecError("'history' 'from' is \"all\" or a list of campaign names")
    return Trusted(tuple(value))


def choose(what: str, measured: Mapping[int, str], trusted: Trusted | None) -> list[int]:
    """The ids of the campaigns an answer about ``what`` draws on, of ``measured`` (id -> name: the campaigns
    holding results for it), given what the asker named (None: nothing named).

    Named nothing, the answer draws on the one campaign that measured it: several are refused in one line, since
    mixing them would let any of them decide the answer."""
    if trusted is None:
        if len(measured) > 1:
            names = ", ".join(sorted(measured.values()))
            raise FleetError(
                f"{what} has results from {len(measured)} campaigns ({names}); name those to draw on with "
                "--from CAMPAIGN[,..], or --from all"
            )
        return list(measured)
    if trusted.everyone:
        return list(measured)
    return [campaign for campaign, name in measured.items() if name in set(trusted.names or ())]


class Campaigns(Protocol):
    """What :func:`resolve` asks of the store (named so, not imported: fleet.search's checks use this module and
    import no store)."""

    def campaign(self, ref: str | int) -> Any: ...


def resolve(store: Campaigns, trusted: Trusted | None) -> None:
    """A named campaign that does not exist is the asker's mistake, said in one line (not an empty answer)."""
    if trusted is not None and trusted.names is not None:
        for name in trusted.names:
            store.campaign(name)  # NotFound: "no campaign 'x'", with the names it resembles
