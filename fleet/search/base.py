"""The searcher interface, after MLPerf's autotuner ``SearcherInterface``.

``generate()`` is a generator. It yields configurations; the driver sends back, through ``send()``, the
run of some earlier configuration, or ``None`` when it only wants another proposal. A searcher that cannot
propose anything until more runs come back yields :data:`WAIT`. Searchers are plain Python: no database,
no Celery, so they are pure functions of the runs they have been sent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleet.space import Config, Space

WAIT = None
"""Yielded by a dynamic searcher that needs more runs before it can propose again."""


@dataclass(frozen=True)
class Run:
    """One finished trial as a searcher sees it.

    Parameters
    ----------
    config:
        The configuration that ran.
    objective:
        The measured objective, or None when the trial errored or was invalid.
    valid:
        Whether the measurement counts.
    metrics:
        Extra metrics (GFLOPS, seconds, ...).
    reason:
        Why the trial errored or is invalid.
    """

    config: Config
    objective: float | None
    valid: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


Proposals = Generator[Config | None, Run | None, None]


class Searcher(ABC):
    """Proposes configurations of one problem.

    Parameters
    ----------
    space:
        The space to search.
    budget:
        Most configurations to propose; None for no limit beyond the space.
    maximize:
        True when a larger objective is better (GFLOPS), False for times.
    seed:
        Seed of any randomness, so that a resumed campaign proposes the same sequence.
    """

    name: ClassVar[str]
    is_dynamic: ClassVar[bool] = False

    def __init__(self, space: Space, *, budget: int | None = None, maximize: bool = False, seed: int = 0) -> None:
        self.space = space
        self.budget = budget
        self.maximize = maximize
        self.seed = seed

    @abstractmethod
    def generate(self) -> Proposals:
        """Yield configurations; see the module docstring for the protocol."""

    def better(self, a: float, b: float) -> bool:
        """Whether objective ``a`` beats ``b``."""
        return a > b if self.maximize else a < b
