"""fleet.diagnose: failed trials' reasons counted, and the error a run that measured nothing ends with."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

from fleet.diagnose import ReasonCount, describe, explain_failure, failure_reasons, first_line, no_valid_measurement
from fleet.errors import FleetError


class FakeStore:
    """What the diagnosis reads of a store: failed trial rows and problems."""

    def __init__(self, rows: list[tuple[int, int, str, str | None]]) -> None:
        self.rows = [NS(id=i, problem_id=p, state=s, reason=r) for i, p, s, r in rows]

    def trial_rows(self, campaign_id: int, states: Any = None, problem_id: int | None = None) -> list[Any]:
        return [r for r in self.rows if r.state in states and problem_id in (None, r.problem_id)]

    def problem(self, problem_id: int) -> Any:
        return NS(id=problem_id, kind="whoami")


STORE = FakeStore(
    [
        (1, 1, "errored", "the run exited with status 2: boom"),
        (2, 1, "errored", "no objective in the run's output\nTraceback..."),
        (3, 1, "errored", "no objective in the run's output"),
        (4, 1, "invalid", None),
        (5, 2, "errored", "the build exited with status 1"),
        (6, 1, "evaluated", None),
    ]
)
CAMPAIGN = NS(id=1, name="my run", target="cpu-x86_64")


def test_reasons_are_first_lines_most_common_first_with_an_example() -> None:
    assert failure_reasons(STORE, 1, problem_id=1) == [
        ReasonCount("no objective in the run's output", 2, 2),
        ReasonCount("the run exited with status 2: boom", 1, 1),
        ReasonCount("invalid with no reason recorded", 1, 4),
    ]
    assert [r.trial_id for r in failure_reasons(STORE, 1)] == [2, 1, 4, 5]


def test_first_line_skips_blank_lines() -> None:
    assert first_line("\n  compile failed: x\nmore") == "compile failed: x"
    assert first_line(None) == "errored with no reason recorded"


def test_describe_shows_the_commonest_and_counts_the_rest() -> None:
    reasons = [ReasonCount(f"reason {i}", 10 - i, i) for i in range(7)]
    lines = describe(reasons, shown=2)
    assert lines == [
        "  10 trials: reason 0  (fleet trial 0)",
        "  9 trials: reason 1  (fleet trial 1)",
        "  30 more trials, 5 other reasons",
    ]


def test_the_error_names_reasons_counts_trials_and_commands() -> None:
    summaries = [NS(problem_id=1, best=None), NS(problem_id=2, best=NS(objective=1.0))]

    error = no_valid_measurement(STORE, CAMPAIGN, summaries)

    assert isinstance(error, FleetError)
    text = str(error)
    assert text.splitlines()[0] == "campaign 'my run' found no valid measurement for 1 of its 2 problems"
    assert "  2 trials: no objective in the run's output  (fleet trial 2)" in text
    assert "fleet trials 'my run'" in text
    assert error.to_dict()["problems"][0]["reasons"][0] == {
        "reason": "no objective in the run's output",
        "count": 2,
        "trial": 2,
    }
    assert explain_failure(STORE, CAMPAIGN, summaries) == text


def test_no_error_when_every_problem_has_a_best() -> None:
    assert explain_failure(STORE, CAMPAIGN, [NS(problem_id=1, best=NS(objective=1.0))]) is None


def test_a_problem_with_no_finished_trial_says_so() -> None:
    text = explain_failure(FakeStore([]), CAMPAIGN, [NS(problem_id=1, best=None)])
    assert text is not None and "  none of them finished" in text
