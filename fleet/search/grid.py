"""The grid: every valid configuration, in the order that builds each build key once."""

from __future__ import annotations

import itertools

from fleet.search.base import Proposals, Searcher


class CartesianProduct(Searcher):
    """Every valid configuration of the space, build-time knobs varying slowest.

    With N evaluation slots the driver keeps N configurations in flight; runs that share a build key sit
    next to each other, so the artifact is built once and reused while they run.
    """

    name = "grid"

    def generate(self) -> Proposals:
        # A plain loop, not `yield from`: that would pass the driver's send() to islice, which has none.
        for config in itertools.islice(iter(self.space), self.budget):  # noqa: UP028
            yield config
