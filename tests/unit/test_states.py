"""Every state is named once, in ``fleet.states``: no trial state or campaign status written as a bare string
anywhere else in ``fleet`` (the migrations apart: a migration must not change when the code does)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from fleet.states import ArtifactState, CampaignStatus, ChainState, TrialState

FLEET = Path(__file__).resolve().parents[2] / "fleet"
STATES = {state.value for kind in (TrialState, CampaignStatus, ChainState, ArtifactState) for state in kind}
QUOTED = {f"'{state}'" for state in STATES}  # a state inside SQL text


def _prose(tree: ast.AST) -> set[int]:
    """The constants that are prose: docstrings, and whatever an f-string says (``f"{'failed':>15}"``)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            ids.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            ids.update(id(inner) for inner in ast.walk(node) if isinstance(inner, ast.Constant))
    return ids


def bare_states(source: str) -> list[tuple[int, str]]:
    """The line and text of each string in ``source`` that spells a state."""
    tree = ast.parse(source)
    prose = _prose(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and (node.value in STATES or any(quoted in node.value for quoted in QUOTED))
    ]


def test_no_state_is_a_bare_string_outside_its_definition() -> None:
    found = [
        f"{path.relative_to(FLEET.parent)}:{line}: {text!r}"
        for path in sorted(FLEET.rglob("*.py"))
        if path.name != "states.py" and "migrations" not in path.parts
        for line, text in bare_states(path.read_text())
    ]
    assert found == []


def test_the_check_finds_a_bare_state_and_not_prose() -> None:
    source = '''
def f(trial):
    """A trial that is "evaluated" in its docstring is prose."""
    print(f"{trial.id} evaluated")
    sql = "UPDATE trials SET state = 'errored'"
    return trial.state == "evaluated"
'''
    assert bare_states(source) == [(5, "UPDATE trials SET state = 'errored'"), (6, "evaluated")]


def test_a_state_is_its_plain_value_in_the_database_and_in_json() -> None:
    assert TrialState.EVALUATED == "evaluated" and f"{CampaignStatus.DONE}" == "done"
    assert json.dumps({"state": TrialState.NEW}) == '{"state": "new"}'
