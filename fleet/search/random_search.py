"""Random sampling without replacement, with a budget."""

from __future__ import annotations

import random

from fleet.search.base import Proposals, Searcher
from fleet.search.points import Point, Technique


class RandomSearch(Searcher):
    """Uniform samples of the valid configurations, none twice.

    Static: every proposal is independent of the runs, so N evaluation slots are all kept busy. Samples are
    drawn as indices into the product of the knobs' values, so even a huge space costs nothing up front;
    an index whose configuration breaks a constraint is skipped.
    """

    name = "random"

    def generate(self) -> Proposals:
        rng = random.Random(self.seed)
        size = self.space.size
        budget = size if self.budget is None else min(self.budget, size)
        proposed = 0
        seen: set[int] = set()
        # Rejection sampling stops once most of the space has been looked at; a shuffle finishes it.
        while proposed < budget and len(seen) < size // 2:
            index = rng.randrange(size)
            if index in seen:
                continue
            seen.add(index)
            config = self.space.decode(index)
            if self.space.is_valid(config):
                proposed += 1
                yield config
        if proposed >= budget:
            return
        rest = [i for i in range(size) if i not in seen]
        rng.shuffle(rest)
        for index in rest:
            if proposed >= budget:
                return
            config = self.space.decode(index)
            if self.space.is_valid(config):
                proposed += 1
                yield config


class Sampling(Technique):
    """Random sampling as a technique of the ``auto`` bandit: a uniformly drawn valid configuration not seen."""

    def propose(self) -> Point | None:
        return self.random_point()
