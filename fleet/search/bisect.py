"""MLPerf's ``Bisect``: binary search of one numeric knob with a predicate on the run."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from fleet.errors import SpecError
from fleet.search.base import (
    WAIT,
    Predicate,
    Proposals,
    Run,
    Searcher,
    Terms,
    knob_option,
    overlay,
    passes,
    run_predicate,
)
from fleet.space import Space, Value


class Bisect(Searcher):
    """The largest value of one numeric knob whose run passes a predicate, by binary search.

    As MLPerf's ``Bisect``: the candidates are ``range(lower_bound, upper_bound, step_size)`` when a step is
    given, else the knob's numeric values between the bounds (both included), in ascending order. The first
    candidate is taken as passing and never run; the search ends when the last passing and the first failing
    candidate are neighbours, or closer than ``tolerance``. A candidate that the space rules out counts as
    failing, without a run. ``best`` holds the largest passing value found.

    N evaluation slots: with one slot this is MLPerf's binary search exactly. With N, it is an (N+1)-section
    search: while runs are out it also proposes the middle of the largest interval left between the known
    bounds and the candidates in flight, so N candidates run at once and each round shrinks the interval about
    N+1 times.

    Parameters
    ----------
    knob:
        The knob to search (``search_param`` is MLPerf's name for it), e.g. a target QPS.
    lower_bound, upper_bound, step_size:
        The candidates, as above.
    tolerance:
        Stop once the passing and failing values are at most this far apart.
    predicate:
        Whether a run passes (a callable taking a :class:`Run`); default: the run is valid. Within a
        :class:`Composer`, it is also the Composer's test of whether this searcher goes next.
    valid_metric, valid_value:
        JSON form of a predicate: the run must be valid with this metric true (or equal to ``valid_value``).
    base:
        Values of the other knobs.
    """

    name = "bisect"
    is_dynamic = True

    def __init__(
        self,
        space: Space | None = None,
        *,
        knob: str | None = None,
        search_param: str | None = None,
        lower_bound: float | None = None,
        upper_bound: float | None = None,
        step_size: float | None = None,
        tolerance: float | None = None,
        predicate: Predicate | None = None,
        valid_metric: str | None = None,
        valid_value: Value | None = None,
        base: Mapping[str, Value] | None = None,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        self.knob = knob_option(space, knob, search_param, self.name)
        if step_size is not None:
            if lower_bound is None or upper_bound is None:
                raise SpecError("strategy 'bisect': 'step_size' needs 'lower_bound' and 'upper_bound'")
            if not step_size > 0:
                raise SpecError("strategy 'bisect': 'step_size' must be positive")
        self.lower_bound, self.upper_bound, self.step_size = lower_bound, upper_bound, step_size
        self.tolerance = tolerance
        self.predicate = run_predicate(predicate, valid_metric, valid_value)
        self.base = dict(base or {})
        self.best: dict[str, Value] | None = None
        if space is not None or step_size is not None:
            self.candidates()  # fewer than two candidates, or a knob that is not numeric: say so now

    def candidates(self) -> list[float]:
        """The values searched, ascending; the first is taken as passing."""
        if self.step_size is not None:
            count = math.ceil((self.upper_bound - self.lower_bound) / self.step_size)  # type: ignore[operator]  # with a step size, both bounds are given (checked in __init__)
            values = [self.lower_bound + i * self.step_size for i in range(max(0, count))]  # type: ignore[operator]  # as above
        else:
            knob = self.space.knob(self.knob)
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in knob.values):
                raise SpecError(f"strategy 'bisect': knob {self.knob!r} is not numeric")
            values = sorted(
                v  # type: ignore[misc]  # numbers: a knob bisected has numeric values
                for v in knob.values
                if (self.lower_bound is None or v >= self.lower_bound)  # type: ignore[operator]  # numbers, as above
                and (self.upper_bound is None or v <= self.upper_bound)  # type: ignore[operator]  # numbers, as above
            )
        if len(values) < 2:
            raise SpecError(f"strategy 'bisect': fewer than two values of {self.knob!r} to search")
        return values

    def get_best(self) -> dict[str, Value] | None:
        """MLPerf's name for :attr:`best`."""
        return self.best

    def terms(self) -> Terms:
        values = self.candidates()
        self.best = {self.knob: values[0]}
        good, bad = 0, len(values)  # every index <= good passes, every index >= bad fails
        pending: list[int] = []
        run: Run | None = None
        while True:
            if run is not None:
                index = _index(values, run.config.get(self.knob))
                if index is not None and index in pending:
                    pending.remove(index)
                    if passes(self.predicate, run):
                        if good < index < bad:
                            good = index
                            self.best = {self.knob: values[good]}
                    elif good < index < bad:
                        bad = index
            if good + 1 >= bad or (
                self.tolerance is not None and bad < len(values) and values[bad] - values[good] <= self.tolerance
            ):
                return
            index = _middle(good, bad, pending)
            if index is None:
                run = yield WAIT
                continue
            pending.append(index)
            run = yield {self.knob: values[index]}

    def generate(self) -> Proposals:
        terms = self.terms()
        proposed = 0
        try:
            term = next(terms)
            while self.budget is None or proposed < self.budget:
                if term is WAIT:
                    term = terms.send((yield WAIT))
                    continue
                config = overlay(self.space, self.base, term)
                if not self.space.is_valid(config):
                    # Ruled out by the space: it fails, without running.
                    term = terms.send(Run(config, None, False, reason="ruled out by the space"))
                    continue
                proposed += 1
                term = terms.send((yield config))
        except StopIteration:
            return


def _index(values: list[float], value: object) -> int | None:
    for index, candidate in enumerate(values):
        if candidate == value:
            return index
    return None


def _middle(good: int, bad: int, pending: list[int]) -> int | None:
    """The middle of the largest interval between the bounds and the candidates in flight, or None."""
    cuts = sorted({good, bad, *(i for i in pending if good < i < bad)})
    best: int | None = None
    width = 1
    for low, high in itertools.pairwise(cuts):
        if high - low > width:
            best, width = (low + high) // 2, high - low
    return best
