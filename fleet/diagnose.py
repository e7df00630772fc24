"""Why a campaign found nothing: its failed trials' reasons, counted, each with a trial to look at.

A run in which every trial failed must not read as a success. :func:`explain_failure` says, for each problem left
with no valid measurement, the commonest reasons its trials failed with, how many trials each, and the command that
shows one of them whole (``fleet trial ID``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.errors import FleetError
from fleet.states import FAILED, TrialState

SHOWN_REASONS = 5


@dataclass(frozen=True)
class ReasonCount:
    """One reason trials failed with (its first line), how many did, and one of them to look at."""

    reason: str
    count: int
    trial_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "count": self.count, "trial": self.trial_id}


class NoValidMeasurement(FleetError):
    """A campaign ended with a problem that has no valid measurement; the message says why its trials failed.

    ``problems`` holds, per such problem, its id and its :class:`ReasonCount` list, for JSON output.
    """

    def __init__(self, message: str, problems: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.problems = problems

    def to_dict(self) -> dict[str, Any]:
        return {"error": str(self), "problems": self.problems}


def first_line(reason: str | None, state: str = TrialState.ERRORED) -> str:
    """A reason's first non-blank line: reasons that differ only in a traceback or a log count as one."""
    for line in (reason or "").splitlines():
        if line.strip():
            return line.strip()
    return f"{state} with no reason recorded"


def failure_reasons(store: Any, campaign_id: int, problem_id: int | None = None) -> list[ReasonCount]:
    """The reasons the failed (errored or invalid) trials of a campaign (or of one of its problems) gave.

    Most common first, ties in the order they first happened; each with the first trial that gave it.
    """
    counts: dict[str, list[int]] = {}
    for row in store.trial_rows(campaign_id, FAILED, problem_id=problem_id):
        counts.setdefault(first_line(row.reason, row.state), []).append(row.id)
    ranked = sorted(counts.items(), key=lambda item: (-len(item[1]), item[1][0]))
    return [ReasonCount(reason, len(ids), ids[0]) for reason, ids in ranked]


def describe(reasons: Sequence[ReasonCount], shown: int = SHOWN_REASONS) -> list[str]:
    """Lines that list ``reasons``: ``3 trials: REASON (fleet trial 7)``, the commonest ``shown`` of them."""
    lines = [
        f"  {r.count} trial{'s' if r.count != 1 else ''}: {r.reason}  (fleet trial {r.trial_id})"
        for r in reasons[:shown]
    ]
    rest = reasons[shown:]
    if rest:
        lines.append(f"  {sum(r.count for r in rest)} more trials, {len(rest)} other reasons")
    return lines


def no_valid_measurement(store: Any, campaign: Any, summaries: Sequence[Any]) -> NoValidMeasurement | None:
    """The error for a campaign some of whose problems ended with no valid measurement, else None.

    ``summaries`` are :class:`fleet.driving.campaign.Summary` objects (a problem id and its best, None when nothing
    valid).
    """
    lines: list[str] = []
    problems: list[dict[str, Any]] = []
    for summary in summaries:
        if summary.best is not None:
            continue
        problem = store.problem(summary.problem_id)
        reasons = failure_reasons(store, campaign.id, summary.problem_id)
        problems.append({"problem": problem.id, "kind": problem.kind, "reasons": [r.to_dict() for r in reasons]})
        lines.append(f"problem {problem.id} ({problem.kind}) on {campaign.target}: no valid measurement; its trials:")
        # No trial at all: the searcher proposed nothing, which a space whose constraints leave no configuration
        # (one too large to look through when the spec was read) comes to.
        empty = not getattr(summary, "counts", True)
        none = "  it has no trials: its searcher found no configuration that passes the space's constraints"
        lines.extend(describe(reasons) or [none if empty else "  none of them finished"])
    if not problems:
        return None
    some = "" if len(problems) == len(summaries) else f" for {len(problems)} of its {len(summaries)} problems"
    lines.insert(0, f"campaign {campaign.name!r} found no valid measurement{some}")
    lines.append(f"one trial in full: fleet trial ID; every trial: fleet trials {shlex.quote(campaign.name)}")
    return NoValidMeasurement("\n".join(lines), problems)


def explain_failure(store: Any, campaign: Any, summaries: Sequence[Any]) -> str | None:
    """What :func:`no_valid_measurement` says, as text: the commonest reasons, counts, trial ids; else None."""
    error = no_valid_measurement(store, campaign, summaries)
    return None if error is None else str(error)
