"""MLPerf's ``Step``: walk one knob's values in order."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fleet.errors import SpecError
from fleet.search.base import Predicate, Proposals, Searcher, Terms, knob_option, overlay, passes, run_predicate
from fleet.space import Space, Value


class Step(Searcher):
    """Walk one knob's values in order from a start, stopping when a run fails the predicate or the values end.

    The values are MLPerf's ``start, update(start), update(update(start)), ...`` up to ``end`` (not included)
    when ``update`` is given, else the knob's own values from ``start`` (included) to ``end`` (not included).
    The other knobs keep ``base`` (default: each knob's first value). A value whose configuration the space
    rules out is skipped.

    N evaluation slots: without a predicate the walk is static, so all N slots run the next N values. With one,
    the next values are proposed speculatively while earlier runs are out (N in flight), and the walk stops
    at the first run that fails: at most N - 1 runs past the failure are wasted.

    Parameters
    ----------
    knob:
        The knob to walk (``search_param`` is MLPerf's name for it).
    start, end:
        The first value, and the value to stop before.
    update:
        The next value after a value (MLPerf); repeated calls should reach ``end`` exactly.
    predicate:
        A test of each run (a callable taking a :class:`Run`); the walk stops at the first run that fails it.
        Within a :class:`Composer`, it is also the Composer's test of whether this searcher goes next.
    valid_metric, valid_value:
        JSON form of a predicate: the run must be valid with this metric true (or equal to ``valid_value``).
    base:
        Values of the other knobs.
    """

    name = "step"

    def __init__(
        self,
        space: Space | None = None,
        *,
        knob: str | None = None,
        search_param: str | None = None,
        start: Value | None = None,
        end: Value | None = None,
        update: Callable[[Value], Value] | None = None,
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
        if update is not None and (start is None or end is None):
            raise SpecError("strategy 'step': 'update' needs 'start' and 'end'")
        if update is not None and start == end:
            raise SpecError("strategy 'step': 'start' and 'end' are the same value")
        if update is not None and not callable(update):
            raise SpecError("strategy 'step': 'update' must be a function")
        self.start, self.end, self.update = start, end, update
        self.base = dict(base or {})
        # Only a given test makes the walk stop early and, in a Composer, decide who goes next.
        given = predicate is not None or valid_metric is not None
        self.predicate: Predicate | None = run_predicate(predicate, valid_metric, valid_value) if given else None
        self.is_dynamic = given  # type: ignore[misc]  # a class attribute, made per instance here
        if space is not None:
            self.values()  # a start or end that is not a value of the knob: say so now

    def values(self) -> list[Value] | None:
        """The knob's values to walk, or None when ``update`` makes them one at a time."""
        if self.update is not None:
            return None
        values = list(self.space.knob(self.knob).values)
        first = 0 if self.start is None else _position(values, self.start, "start", self.knob)
        last = len(values) if self.end is None else _position(values, self.end, "end", self.knob)
        return values[first:last]

    def _walk(self) -> list[Value] | None:
        return self.values() if self._space is not None else None

    def terms(self) -> Terms:
        values = self._walk()
        if values is None and self.update is None:
            raise SpecError("strategy 'step': without 'update' it walks the knob's values, so it needs a space")
        index, value = 0, self.start
        while True:
            if values is not None:
                if index >= len(values):
                    return
                value = values[index]
                index += 1
            elif value == self.end:
                return
            run = yield {self.knob: value}  # type: ignore[dict-item]  # a knob's value: bool, number or string
            # None: the driver wants the next value while this one runs (speculation); a run decides.
            if run is not None and self.predicate is not None and not passes(self.predicate, run):
                return
            if values is None:
                value = self.update(value)  # type: ignore[misc,arg-type]  # a user's update function, called as given

    def generate(self) -> Proposals:
        terms = self.terms()
        proposed = 0
        run = None
        try:
            term = next(terms)
            while self.budget is None or proposed < self.budget:
                config = overlay(self.space, self.base, term)  # type: ignore[arg-type]  # the space is set once Step runs
                if not self.space.is_valid(config):
                    term = terms.send(None)
                    continue
                proposed += 1
                run = yield config
                term = terms.send(run)
        except StopIteration:
            return


def _position(values: list[Value], value: Value, what: str, knob: str) -> int:
    for index, candidate in enumerate(values):
        if candidate == value and type(candidate) is type(value):
            return index
    raise SpecError(f"strategy 'step': {what} {value!r} is not a value of knob {knob!r}")
