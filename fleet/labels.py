"""How a problem is named to a person: by its kind and parameters, never by its database id.

"best of problem 3" says nothing to the user who wrote ``{"n": 512}``; ``matmul-c n=512`` does. Every command, the
report and the CSV name problems with these, and keep the id only where a later command takes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from fleet.errors import printable

SHORT_LABEL = 48
"""Characters of a problem's short label (the progress line's), past which it is cut with an ellipsis."""


class Named(Protocol):
    """What a problem has that names it: the store's Problem and the spec's ProblemSpec both do."""

    @property
    def kind(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


def _value(value: Any) -> str:
    # Strings as they are, booleans and null as JSON writes them (a spec's own spelling), numbers as written.
    return printable(value if isinstance(value, str) else json.dumps(value))


def params_label(params: Mapping[str, Any]) -> str:
    """``n=512 steps=20``: a problem's parameters on one line."""
    return " ".join(f"{printable(str(k))}={_value(v)}" for k, v in params.items())


def problem_label(problem: Named) -> str:
    """``matmul-c n=512``: the problem's kind and its parameters."""
    return f"{printable(problem.kind)} {params_label(problem.params or {})}".rstrip()


def short_labels(problems: Iterable[tuple[int, Named]]) -> dict[int, str]:
    """Per problem id, the parameters that tell the problems apart (``n=1024``), for a line that has little room;
    a problem's kind only where the kinds differ. One problem alone is named by its kind."""
    problems = list(problems)
    kinds = {p.kind for _, p in problems}
    keys = dict.fromkeys(k for _, p in problems for k in p.params or {})  # in the spec's order
    differing = [k for k in keys if len({json.dumps((p.params or {}).get(k)) for _, p in problems}) > 1]
    labels = {}
    for problem_id, problem in problems:
        params = problem.params or {}
        words = [printable(problem.kind)] if len(kinds) > 1 or not differing else []
        words.append(params_label({k: params[k] for k in differing if k in params}))
        label = " ".join(w for w in words if w)
        labels[problem_id] = label if len(label) <= SHORT_LABEL else label[: SHORT_LABEL - 1] + "…"
    return labels
