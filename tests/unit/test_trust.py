"""fleet.trust, the one rule for answers that combine campaigns (issue 44, item 5): how an asker names campaigns on
the command line and in Python, and which campaigns an answer then draws on."""

from __future__ import annotations

import pytest

from fleet.errors import FleetError, SpecError
from fleet.trust import Trusted, choose, named, parse_from, scope

MEASURED = {1: "victim", 2: "attacker", 3: "other"}


def test_from_is_all_or_names() -> None:
    assert parse_from("all") == Trusted(None) and parse_from("all").everyone
    assert parse_from("victim, other") == Trusted(("victim", "other"))
    for bad in ("", "victim,", "victim,all", ",", "all,all"):
        with pytest.raises(SpecError, match="give campaign names separated by commas, or 'all'"):
            parse_from(bad)


def test_the_apis_campaigns_are_none_all_names_or_a_list() -> None:
    assert named(None) is None  # named nothing: the one campaign that measured it
    assert named("all") == Trusted(None)
    assert named("victim,other") == Trusted(("victim", "other"))
    assert named(["victim"]) == Trusted(("victim",))
    assert named(("victim", "other")) == Trusted(("victim", "other"))
    for bad in ([], ["all"], ["victim", ""], [3]):
        with pytest.raises(SpecError, match="give campaign names, or 'all'"):
            named(bad)  # type: ignore[arg-type]


def test_named_none_an_answer_draws_on_the_one_campaign_that_measured_and_refuses_among_several() -> None:
    assert choose("problem 7", {2: "attacker"}, None) == [2]
    assert choose("problem 7", {}, None) == []
    with pytest.raises(FleetError) as refused:
        choose("problem 7 on gfx906:60", MEASURED, None)
    assert str(refused.value) == (
        "problem 7 on gfx906:60 has results from 3 campaigns (attacker, other, victim); name those to draw on with "
        "--from CAMPAIGN[,..], or --from all"
    )
    # Python's asker is told Python's words.
    with pytest.raises(FleetError, match=r"\(attacker, other, victim\); name those to draw on with campaigns="):
        choose("problem 7", MEASURED, None, "campaigns=[...] or campaigns='all'")


def test_named_an_answer_draws_on_those_only_and_all_on_every_one() -> None:
    assert choose("problem 7", MEASURED, Trusted(("victim",))) == [1]
    assert choose("problem 7", MEASURED, Trusted(("victim", "nobody-measured"))) == [1]
    assert choose("problem 7", MEASURED, Trusted(("nobody-measured",))) == []  # no answer, not another's
    assert choose("problem 7", MEASURED, Trusted(None)) == [1, 2, 3]


class Login:
    """A database login as fleet.trust.scope asks of it: a team's member sees its teams' campaigns only."""

    def __init__(self, every: bool, teams: list[str]) -> None:
        self.every, self.teams = every, teams

    def reads_every_campaign(self) -> bool:
        return self.every

    def my_teams(self) -> list[str]:
        return self.teams


def test_all_on_a_teams_login_says_it_is_its_teams_campaigns() -> None:
    member = Login(False, ["blue", "green"])
    assert (
        scope(member, Trusted(None)) == "--from all: the campaigns of your teams (blue, green), all this login may read"
    )
    assert scope(member, Trusted(("victim",))) is None  # named campaigns say themselves
    assert scope(member, None) is None
    assert scope(Login(True, []), Trusted(None)) is None  # an operator's, the service's, SQLite's: every campaign
