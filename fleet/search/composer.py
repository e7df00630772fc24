"""MLPerf's ``Composer``: several searchers, each with a predicate, taking turns in MLPerf's order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet.errors import SpecError
from fleet.search.base import WAIT, Predicate, Proposals, Run, Searcher, Terms, overlay, passes
from fleet.space import Space, Value

Item = Searcher | tuple[Searcher, Predicate] | Mapping[str, Any]


class Composer(Searcher):
    """Compose searchers with predicates, in the exact consultation order of MLPerf's autotuner.

    Each searcher owns some knobs (a :class:`Step` or :class:`Bisect` one) and yields terms for them; the
    configuration is the latest term of every searcher over ``base``. After each run:

    1. ask the searchers in order whether they want to go next (their predicate on the run); the first that
       does is sent the run and gives the next term (one that is exhausted passes the turn on);
    2. if none wants to, force them backwards, last first, sending each the run, until one gives a term;
    3. if none gives a term, or ``timeout`` configurations were tried, the search is over.

    A searcher's predicate is, in order of preference: the second item of a ``(searcher, predicate)`` pair, the
    searcher's own ``predicate`` (so a :class:`Bisect` brings its own), or "always". A configuration the space
    rules out is not run: it goes to the predicates as a failed run (no objective, no metrics).

    N evaluation slots: one. Each step depends on the run before it, so the Composer keeps one configuration
    in flight; a campaign fills the other slots with its other problems.

    Parameters
    ----------
    searchers:
        Searchers, ``(searcher, predicate)`` pairs, or (from JSON) ``{"name": ..., "options": {...}}`` objects
        naming registered strategies.
    timeout:
        Most configurations to try, run or ruled out (MLPerf's name); None for no limit but ``budget``.
    base:
        Values of the knobs that no searcher sets.
    """

    name = "composer"
    is_dynamic = True

    def __init__(
        self,
        searchers: Iterable[Item] = (),
        timeout: int | None = None,
        *,
        space: Space | None = None,
        base: Mapping[str, Value] | None = None,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        self.searchers: list[Searcher] = []
        self.predicates: list[Predicate | None] = []
        for index, item in enumerate(searchers):
            searcher, predicate = self._item(item, index)
            self.searchers.append(searcher)
            self.predicates.append(predicate)
        if not self.searchers:
            raise SpecError('strategy \'composer\' needs searchers: options {"searchers": [{"name": ..., ...}]}')
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1):
            raise SpecError(f"strategy 'composer': timeout must be a positive integer, not {timeout!r}")
        self.timeout = timeout
        self.base = dict(base or {})

    def _item(self, item: Item, index: int) -> tuple[Searcher, Predicate | None]:
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[0], Searcher) or not callable(item[1]):
                raise SpecError(f"strategy 'composer': item {index} must be (searcher, predicate)")
            return item[0], item[1]
        if isinstance(item, Mapping):
            # Imported here: the table is filled by the package, which imports this module.
            from fleet.search.registry import make_searcher

            extra = set(item) - {"name", "options"}
            if extra:
                raise SpecError(f"strategy 'composer': item {index} has an unknown field {sorted(extra)[0]!r}")
            item = make_searcher(
                item.get("name"),  # type: ignore[arg-type]  # make_searcher refuses a missing name in words
                self._space,  # type: ignore[arg-type]  # set before generate() runs
                maximize=self.maximize,
                seed=self.seed + index,
                options=item.get("options"),
            )
        if not isinstance(item, Searcher):
            raise SpecError(f"strategy 'composer': item {index} is not a searcher: {item!r}")
        return item, getattr(item, "predicate", None)

    def tests(self) -> list[Predicate]:
        """Every searcher's predicate: a run the Composer's best may be passes them all."""
        return [p for p in self.predicates if p is not None]

    def bind(self, space: Space) -> Searcher:
        super().bind(space)
        for searcher in self.searchers:
            searcher.bind(space)
        return self

    def generate(self) -> Proposals:
        space = self.space
        gens = [s.terms() for s in self.searchers]
        current: dict[str, Value] = {}
        # Every searcher's first term makes the first configuration.
        for gen in gens:
            current.update(_send(gen, None) or {})
        tried = proposed = 0
        while tried != self.timeout and (self.budget is None or proposed < self.budget):
            config = overlay(space, self.base, current)
            tried += 1
            if space.is_valid(config):
                proposed += 1
                run = yield config
                while run is None:  # the driver asks for more while this one runs: there is no more yet
                    run = yield WAIT
            else:
                run = Run(config, None, False, reason="ruled out by the space")
            term = None
            for gen, predicate in zip(gens, self.predicates, strict=True):
                if predicate is None or passes(predicate, run):
                    term = _send(gen, run)
                    if term:
                        break
            if not term:
                # Nobody wanted to go: force them, backwards, until one gives a term.
                for gen in reversed(gens):
                    term = _send(gen, run)
                    if term:
                        break
                if not term:
                    return
            current.update(term)


def _send(gen: Terms, run: Run | None) -> dict[str, Value] | None:
    """MLPerf's ``do_send``: the generator's next term, or None once it is exhausted."""
    try:
        return gen.send(run)
    except StopIteration:
        return None
